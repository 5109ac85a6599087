import NIOCore

/// Everything one client connection knows, as one value, with no I/O: its phase and that
/// phase's data (the handshake's deadline; once established the negotiated parameters, the
/// requests, the heartbeat, and the window of reliable messages), and why it ends.
///
/// Each event is a `mutating func` that returns what the handler must do; time is passed in.
/// Who waits for each request is the handler's (a continuation, a callback): the machine
/// knows requests by id.
///
/// ```
///  idle ──start──▶ handshaking ──WELCOME──▶ active ──GOAWAY / drain──▶ draining
///                       │                      │                          │
///                       └──── ERROR / violation / timeout / close ────────┴──▶ closed
/// ```
package struct ClientConnectionStateMachine: Sendable {
    package struct Configuration: Sendable, Hashable {
        package var hello: Frame.Hello
        package var handshakeTimeout: Duration
        package var heartbeat: HeartbeatPolicy
        /// With reliable messaging: messages in flight at most, and the retransmission bounds.
        package var reliability: Reliability?
        /// When a connection whose requests time out counts as failing; `nil`: never.
        package var failingLink: LinkHealth.Policy?

        package struct Reliability: Sendable, Hashable {
            package var window: Int
            package var retransmission: RTTEstimator

            package init(window: Int, retransmission: RTTEstimator) {
                self.window = window
                self.retransmission = retransmission
            }
        }

        package init(
            hello: Frame.Hello,
            handshakeTimeout: Duration,
            heartbeat: HeartbeatPolicy,
            reliability: Reliability? = nil,
            failingLink: LinkHealth.Policy? = nil
        ) {
            self.hello = hello
            self.handshakeTimeout = handshakeTimeout
            self.heartbeat = heartbeat
            self.reliability = reliability
            self.failingLink = failingLink
        }
    }

    /// What the application wants of the heartbeat now.
    package struct HeartbeatPreference: Sendable, Hashable {
        package var mode: HeartbeatMode
        /// With NAT-timeout probing: the longest interval the network is known (or being
        /// tested) to keep an idle connection.
        package var learnedInterval: Duration?

        package init(mode: HeartbeatMode, learnedInterval: Duration? = nil) {
            self.mode = mode
            self.learnedInterval = learnedInterval
        }
    }

    package enum State: Sendable {
        /// The channel is not active yet.
        case idle
        /// HELLO was sent; waiting for WELCOME until the deadline.
        case handshaking(deadline: TetherInstant)
        /// Established.
        case active(ActiveBox)
        /// No new requests (GOAWAY arrived, or the client drains); closes once those in flight
        /// are answered.
        case draining(ActiveBox)
        /// Ending (an error, a timeout, a violation): nothing more is read; what was in flight
        /// (if it was established) ends when the channel closes.
        case closing(ActiveBox?)
        /// The channel closed.
        case closed
        /// Only while an event is being handled.
        case _modifying
    }

    /// The established phases' data, behind one reference: every event moves the phase's data
    /// out of the enum and back, and a word moves faster than the ~370 bytes of ``Active``.
    package typealias ActiveBox = CopyOnWriteBox<Active>

    package struct Active: Sendable {
        package var negotiated: Handshake.Negotiated
        package var establishedAt: TetherInstant
        package var requests: ClientRequestTable
        package var heartbeat: HeartbeatStateMachine
        /// The gateway's heartbeat interval, and the longest interval it allows (half its idle timeout).
        package var heartbeatBounds: (gateway: Duration, ceiling: Duration)
        package var heartbeatMode: HeartbeatMode
        /// Reliable messages on this connection, if negotiated.
        package var outbox: OutboxWindow?
        package var retransmission: RTTEstimator?
        package var retransmissions = DeadlineQueue<UInt64, TetherInstant>()
        /// Requests answered and timed out over the failing-link window.
        package var health: LinkHealth?
    }

    package let configuration: Configuration
    package internal(set) var state: State = .idle
    /// The flags every outbound frame carries now. Stored: the handler reads it for every frame.
    package internal(set) var outboundFlags: FrameFlags = .checksum
    /// Why the connection ends, once decided.
    package internal(set) var closeReason: DisconnectReason?
    /// The client closed the connection on purpose: an idle probe waiting then did not fail.
    var closedByClient = false
    /// An idle probe's fate, for the client's NAT-timeout prober, until the handler takes it.
    var idleProbeReport: (probe: HeartbeatStateMachine.IdleProbe, answered: Bool)?

    package init(configuration: Configuration) {
        self.configuration = configuration
    }

    /// What the heartbeat measured, once established: the last PING round trip, the smoothed
    /// round trip, and the current interval.
    package var heartbeatReading: (roundTrip: Duration?, smoothed: Duration?, interval: Duration)? {
        switch self.state {
        case .active(let active), .draining(let active):
            let heartbeat = active.value.heartbeat
            return (heartbeat.lastRoundTrip, heartbeat.configuration.timeout.smoothed, heartbeat.currentInterval)
        case .idle, .handshaking, .closing, .closed, ._modifying:
            return nil
        }
    }

    /// The negotiated parameters, once established.
    package var negotiated: Handshake.Negotiated? {
        switch self.state {
        case .active(let active), .draining(let active): active.value.negotiated
        case .idle, .handshaking, .closing, .closed, ._modifying: nil
        }
    }

    /// Whether new requests may be sent.
    package var acceptsRequests: Bool {
        if case .active = self.state { return true }
        return false
    }

    /// Requests on the wire and not answered. Stored, updated whenever the established data
    /// changes: the handler reads it for every request, and a computed property would copy the
    /// state (or the handler the whole machine) on each read.
    package private(set) var requestsOnWire = 0
    /// Requests not answered, on the wire or queued.
    private var requestCount = 0

    /// When the handler's one timer must fire next.
    package mutating func nextDeadline() -> TetherInstant? {
        // Established first: a `switch` binding the state's data would copy it.
        if let next = self.withEstablished({ active, _ in
            var next = active.heartbeat.nextDeadline
            if let request = active.requests.earliestDeadline { next = min(next, request) }
            if let retransmission = active.retransmissions.earliest { next = min(next, retransmission) }
            return next
        }) {
            return next
        }
        if case .handshaking(let deadline) = self.state { return deadline }
        return nil
    }

    /// An idle probe that was answered, or that the link died waiting for.
    package mutating func takeIdleProbeReport() -> (probe: HeartbeatStateMachine.IdleProbe, answered: Bool)? {
        defer { self.idleProbeReport = nil }
        return self.idleProbeReport
    }

    // MARK: Helpers for the extensions

    /// Runs `body` on the established connection's data; `nil` if it is not established.
    mutating func withEstablished<Result>(_ body: (inout Active, _ draining: Bool) -> Result) -> Result? {
        // `_modifying` replaces the state before `body` runs, so that `active` is its only
        // owner: its tables are mutated in place, not copied.
        switch self.state {
        case .active(var active):
            self.state = ._modifying
            let result = body(&active.value, false)
            self.put(consume active, draining: false)
            return result
        case .draining(var active):
            self.state = ._modifying
            let result = body(&active.value, true)
            self.put(consume active, draining: true)
            return result
        case .idle, .handshaking, .closing, .closed:
            return nil
        case ._modifying:
            preconditionFailure("re-entered the machine")
        }
    }

    /// Puts the established connection's data back, and updates what the handler reads.
    mutating func put(_ active: consuming ActiveBox, draining: Bool) {
        self.requestsOnWire = active.value.requests.onWire
        self.requestCount = active.value.requests.count
        if draining {
            self.state = .draining(consume active)
        } else {
            self.state = .active(consume active)
        }
    }

    /// The connection ends (the reason is decided): it reads nothing more; what was in flight
    /// ends when the channel closes.
    mutating func startClosing() {
        switch self.state {
        case .active(let active), .draining(let active): self.state = .closing(active)
        case .idle, .handshaking: self.state = .closing(nil)
        case .closing, .closed: break
        case ._modifying: preconditionFailure("re-entered the machine")
        }
        self.requestsOnWire = 0
        self.requestCount = 0
        self.outboundFlags = .checksum  // a closing ERROR carries one whatever was negotiated
    }

    /// Stops new requests on the established connection.
    mutating func startDraining() {
        if case .active(let active) = self.state { self.put(active, draining: true) }
    }

    /// Whether a draining connection has nothing left in flight: it closes.
    func closeIfDrained() -> DisconnectReason? {
        guard case .draining = self.state, self.requestCount == 0 else { return nil }
        return self.closeReason ?? .shutdown
    }
}

/// The application's heartbeat settings, as the connection's machine uses them.
package struct HeartbeatPolicy: Sendable, Hashable {
    /// The interval of each mode; `nil`: the gateway's (foreground) or as rare as it allows.
    package var foreground: Duration?
    package var background: Duration?
    package var lowPower: Duration?
    package var jitter: Double
    /// The PONG timeout, before and above what round trips show.
    package var timeout: Duration
    package var minimumTimeout: Duration
    package var suspensionThreshold: Duration?
    package var probeTimeout: Duration
    package var stallInterval: Duration?

    package init(
        foreground: Duration? = nil,
        background: Duration? = nil,
        lowPower: Duration? = nil,
        jitter: Double = 0,
        timeout: Duration = .seconds(5),
        minimumTimeout: Duration = .seconds(1),
        suspensionThreshold: Duration? = nil,
        probeTimeout: Duration = .seconds(2),
        stallInterval: Duration? = nil
    ) {
        self.foreground = foreground
        self.background = background
        self.lowPower = lowPower
        self.jitter = jitter
        self.timeout = timeout
        self.minimumTimeout = minimumTimeout
        self.suspensionThreshold = suspensionThreshold
        self.probeTimeout = probeTimeout
        self.stallInterval = stallInterval
    }

    /// The configured interval for `mode`; `nil` means the default for that mode.
    package func interval(for mode: HeartbeatMode) -> Duration? {
        switch mode {
        case .foreground: self.foreground
        case .background: self.background
        case .lowPower: self.lowPower
        }
    }
}
