import NIOCore

/// Everything one gateway connection knows, as one value, with no I/O: its phase and the data
/// of that phase (the handshake's deadline; once established the negotiated parameters, the
/// requests, the reliable inbox and delivery pump; the close deadline), the tasks it must
/// outlive, and the time limits of those tasks.
///
/// Each event is a `mutating func` that returns what the handler must do; time is passed in.
/// The handler performs the action, holds the I/O resources (the channel, the tasks, the
/// timer), and nothing else.
///
/// ```
///  handshaking ──WELCOME──▶ active ──drain──▶ draining
///       │                     │                  │
///       └── ERROR / violation / timeout / idle / grace / refusal ──▶ closing ──channel closed──▶ closed
/// ```
///
/// - **Handshake.** HELLO starts it; the handler authenticates in a task and reports with
///   ``handshakeSucceeded(_:)`` or ``handshakeRefused(_:now:)``. No complete handshake within
///   the handshake timeout: ERROR `handshake timeout`.
/// - **Requests** (``GatewayRequestTable``): each is answered at most once, held to its
///   deadline, and paced to the connection's rate.
/// - **Reliable delivery**: MESSAGEs wait in the ``MessageInbox`` and go to the outbox's lane
///   in paced batches; DELIVERYs leave through the ``DeliveryPump``.
/// - **Liveness.** Nothing received for the idle timeout: GOAWAY `idle timeout`. The
///   credentials' expiry: GOAWAY `credentials expired`, drained like a shutdown. After GOAWAY
///   the grace period bounds the wait for the client to close; a last frame the client does
///   not read is given up after the close timeout.
package struct GatewayConnectionStateMachine: Sendable {
    package struct Configuration: Sendable, Hashable {
        package var handshakeTimeout: Duration
        package var idleTimeout: Duration
        package var shutdownGracePeriod: Duration
        /// How long a last frame (GOAWAY, ERROR) may take to be written before the connection
        /// is closed anyway: a client that does not read cannot hold it open.
        package var closeTimeout: Duration
        package var requests: GatewayRequestTable.Limits
        package var inbox: MessageInbox.Limits
        /// Deliveries sent and not acknowledged at most.
        package var deliveryWindow: Int
        /// Bytes of payload one connection's compression may inflate and deflate per second;
        /// beyond, it stops reading until the rate allows (`nil`: no limit).
        package var compressionBytesPerSecond: Int?

        package init(
            handshakeTimeout: Duration,
            idleTimeout: Duration,
            shutdownGracePeriod: Duration,
            closeTimeout: Duration = .seconds(2),
            requests: GatewayRequestTable.Limits,
            inbox: MessageInbox.Limits,
            deliveryWindow: Int,
            compressionBytesPerSecond: Int? = nil
        ) {
            self.handshakeTimeout = handshakeTimeout
            self.idleTimeout = idleTimeout
            self.shutdownGracePeriod = shutdownGracePeriod
            self.closeTimeout = closeTimeout
            self.requests = requests
            self.inbox = inbox
            self.deliveryWindow = deliveryWindow
            self.compressionBytesPerSecond = compressionBytesPerSecond
        }
    }

    /// The connection's phase, with the data of that phase.
    package enum State: Sendable {
        /// Accepted: waiting for HELLO (`helloReceived` false), then for the handshake's task.
        case handshaking(Handshaking)
        /// Established.
        case active(ActiveBox)
        /// GOAWAY was sent: requests in flight are answered, new ones refused `unavailable`,
        /// until the client closes or the grace period ends.
        case draining(ActiveBox)
        /// Closing: nothing more is read or answered; a last frame may still be being written.
        case closing(Closing)
        /// The channel closed.
        case closed
        /// Only while an event is being handled.
        case _modifying
    }

    package struct Handshaking: Sendable {
        package var deadline: TetherInstant
        package var helloReceived = false
    }

    /// The established phases' data, behind one reference: every event moves it out of the
    /// enum and back, and a move of ``Active`` itself retained and released each table in it.
    package typealias ActiveBox = CopyOnWriteBox<Active>

    package struct Active: Sendable {
        package var negotiated: Handshake.Negotiated
        package var lastInbound: TetherInstant
        /// When the client's credentials, and their grace period, run out.
        package var credentialsDeadline: TetherInstant?
        /// When a draining connection is closed whatever is in flight.
        package var graceDeadline: TetherInstant?
        package var requests: GatewayRequestTable
        /// Reliable delivery, when the client resumed a session with a message store behind it.
        /// Not boxed apart: `Active` is boxed as a whole.
        package var reliable: Reliable?
    }

    /// Reliable delivery on the connection.
    package struct Reliable: Sendable {
        package var inbox: MessageInbox
        package var pump: DeliveryPump
        /// Whether the client takes `unavailable` answers (the `message answers` feature).
        package var answers: Bool
    }

    package struct Closing: Sendable {
        /// When a last frame still not written stops holding the connection open.
        package var deadline: TetherInstant?
    }

    /// The settings, by reference: every connection of a gateway points at one copy.
    package final class SharedConfiguration: Sendable {
        package let value: Configuration

        package init(_ value: Configuration) {
            self.value = value
        }
    }

    private let shared: SharedConfiguration
    package var configuration: Configuration { self.shared.value }
    package internal(set) var state: State
    /// The flags every outbound frame carries now. Stored: the handler reads it for every frame.
    package private(set) var outboundFlags: FrameFlags = .checksum
    /// The largest body the client accepts, once established.
    package private(set) var peerMaxBodySize: Int?
    /// The connection's tasks that have not ended: the handshake, handlers, reliable batches,
    /// store reads. They outlive the channel; the connection is done when they ended.
    package internal(set) var tasks = 0
    /// The time limits of tasks that outlive the connection (reliable message handlers).
    private var timeLimits = DeadlineQueue<UInt64, TetherInstant>()
    /// Time limits that expired and whose tasks have not ended yet.
    private var expiredTimeLimits: Set<UInt64> = []
    private var nextTimeLimit: UInt64 = 0

    package init(configuration: SharedConfiguration, now: TetherInstant) {
        self.shared = configuration
        self.state = .handshaking(Handshaking(deadline: now + configuration.value.handshakeTimeout))
    }

    package init(configuration: Configuration, now: TetherInstant) {
        self.init(configuration: SharedConfiguration(configuration), now: now)
    }

    /// Whether the connection is established (active or draining).
    package var isEstablished: Bool {
        switch self.state {
        case .active, .draining: true
        case .handshaking, .closing, .closed, ._modifying: false
        }
    }

    // What the handler reads for every frame is kept in stored values, updated whenever the
    // state changes: a computed property would copy the state (or the handler the whole
    // machine) on each read.

    /// Whether nothing more is written (closing or closed).
    package private(set) var isClosing = false
    /// Requests or reliable messages wait at their limits.
    private var limitsHoldReads = false {
        didSet { self.updateHoldsReads() }
    }
    /// The connection's compression went beyond its rate: reads pause until then.
    package private(set) var compressionPausedUntil: TetherInstant? {
        didSet { self.updateHoldsReads() }
    }
    /// Paces the connection's compression work, once it compresses.
    private var compressionPacer: WorkPacer?

    /// Whether the connection must stop reading: requests or reliable messages wait at their
    /// limits, or its compression went beyond its rate. Stored, as everything the handler reads
    /// per frame: a computed property is a call from the handler's module, which copies the
    /// whole machine out of the handler (a retain per reference in it) to call it.
    package private(set) var holdsReads = false

    private mutating func updateHoldsReads() {
        self.holdsReads = self.limitsHoldReads || self.compressionPausedUntil != nil
    }
    /// Requests read and not answered.
    package private(set) var requestsInFlight = 0
    /// The body bytes of the reliable messages waiting for the lane: what the connection holds
    /// of the gateway's memory besides what it has not decoded yet.
    package private(set) var reliableBytesWaiting = 0

    /// Reliable messages waiting for the lane (not counting the batch being processed).
    package var reliableMessagesWaiting: Int {
        switch self.state {
        case .active(let active), .draining(let active): active.value.reliable?.inbox.count ?? 0
        case .handshaking, .closing, .closed, ._modifying: 0
        }
    }

    /// Request handlers running in tasks.
    package var runningHandlers: Int {
        switch self.state {
        case .active(let active), .draining(let active): active.value.requests.running
        case .handshaking, .closing, .closed, ._modifying: 0
        }
    }

    /// The connection inflated or deflated `bytes` of payload: charged to its compression rate.
    /// Past the rate, ``holdsReads`` until the rate has paid for it.
    package mutating func compressed(_ bytes: Int, now: TetherInstant) {
        guard let perSecond = self.configuration.compressionBytesPerSecond, bytes > 0, !self.isClosing else { return }
        if self.compressionPacer == nil { self.compressionPacer = WorkPacer(perSecond: perSecond, now: now) }
        self.compressionPausedUntil = self.compressionPacer!.charge(bytes, now: now)
    }

    /// Ends a compression pause that is over.
    mutating func compressionTimerFired(now: TetherInstant) {
        guard let until = self.compressionPausedUntil, now >= until else { return }
        self.compressionPausedUntil = self.compressionPacer?.charge(0, now: now)
    }

    /// When the timer must fire next.
    package mutating func nextDeadline(now: TetherInstant) -> TetherInstant? {
        var next = self.timeLimits.earliest
        if let until = self.compressionPausedUntil { next = min(next ?? until, until) }
        func consider(_ deadline: TetherInstant?) {
            if let deadline { next = min(next ?? deadline, deadline) }
        }
        switch self.state {
        case .handshaking(let handshaking):
            consider(handshaking.deadline)
        case .active, .draining:
            let idleTimeout = self.configuration.idleTimeout
            _ = self.withEstablished { active, _ in
                consider(active.lastInbound + idleTimeout)
                consider(active.credentialsDeadline)
                consider(active.graceDeadline)
                consider(active.requests.nextDeadline(now: now))
                if active.reliable != nil {
                    consider(active.reliable!.inbox.nextDeadline(now: now))
                    consider(active.reliable!.pump.retryAt)
                }
            }
        case .closing(let closing):
            consider(closing.deadline)
        case .closed, ._modifying:
            break
        }
        return next
    }

    // MARK: Tasks

    /// One of the connection's tasks started.
    package mutating func taskStarted() {
        self.tasks += 1
    }

    /// One of the connection's tasks ended.
    /// - Returns: Whether the connection is done: closed, and this was its last task.
    package mutating func taskEnded() -> Bool {
        self.tasks -= 1
        return self.isDone
    }

    /// Closed, with no task left.
    package var isDone: Bool {
        if case .closed = self.state { return self.tasks == 0 }
        return false
    }

    /// A time limit for a task that outlives the connection (a batch of reliable messages: its
    /// handlers must still be committed after the connection closed, PROTOCOL.md, section 9.1),
    /// disarmed until ``armTimeLimit(_:now:)``.
    /// - Returns: Its token.
    package mutating func newTimeLimit() -> UInt64 {
        defer { self.nextTimeLimit += 1 }
        return self.nextTimeLimit
    }

    /// Holds the task to the handler time limit from `now` (a handler starts): past it,
    /// ``timerFired(now:)`` says to cancel the task.
    package mutating func armTimeLimit(_ token: UInt64, now: TetherInstant) {
        self.timeLimits.insert(token, deadline: now + self.configuration.requests.handlerTimeout)
    }

    /// The handler finished.
    /// - Returns: Whether it ran past its limit (and its task was cancelled).
    package mutating func disarmTimeLimit(_ token: UInt64) -> Bool {
        if self.timeLimits.remove(token) { return false }
        return self.expiredTimeLimits.remove(token) != nil
    }

    /// The task ended: its token is forgotten.
    package mutating func endTimeLimit(_ token: UInt64) {
        self.timeLimits.remove(token)
        self.expiredTimeLimits.remove(token)
    }

    mutating func expireTimeLimits(now: TetherInstant) -> [UInt64] {
        let expired = self.timeLimits.popExpired(at: now)
        self.expiredTimeLimits.formUnion(expired)
        return expired
    }

    // MARK: Closing

    /// The handler closes the connection: with a last frame being written (it then has the
    /// close timeout to be written), or at once.
    /// - Returns: The requests to settle (cancel their tasks), or `nil` if the connection was
    ///   closing already.
    package mutating func startClosing(writingLastFrame: Bool, now: TetherInstant) -> [UInt64]? {
        var settled: [UInt64] = []
        switch self.state {
        case .closing, .closed:
            return nil
        case .active(var active), .draining(var active):
            self.state = ._modifying
            settled = active.value.requests.closeAll()
            active.value.reliable?.inbox.close()
        case .handshaking:
            break
        case ._modifying:
            preconditionFailure("re-entered the machine")
        }
        self.enterClosing(Closing(deadline: writingLastFrame ? now + self.configuration.closeTimeout : nil))
        self.outboundFlags = .checksum  // a closing ERROR carries one whatever was negotiated
        return settled
    }

    /// The channel closed.
    /// - Returns: The requests to settle (cancel their tasks), and whether the connection is
    ///   done (no task left); `nil` if it was reported already.
    package mutating func channelClosed() -> (settled: [UInt64], done: Bool)? {
        if case .closed = self.state { return nil }
        let settled = self.startClosing(writingLastFrame: false, now: .zero) ?? []
        self.state = .closed
        return (settled, self.tasks == 0)
    }

    // MARK: Helpers for the extensions

    /// Runs `body` on the established connection's data.
    /// - Returns: `nil` if it is not established.
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
        case .handshaking, .closing, .closed:
            return nil
        case ._modifying:
            preconditionFailure("re-entered the machine")
        }
    }

    /// Puts the established connection's data back, and updates what the handler reads.
    private mutating func put(_ active: consuming ActiveBox, draining: Bool) {
        self.requestsInFlight = active.value.requests.count
        self.limitsHoldReads = active.value.requests.holdsReads || active.value.reliable?.inbox.holdsReads == true
        self.reliableBytesWaiting = active.value.reliable?.inbox.byteCount ?? 0
        if draining {
            self.state = .draining(consume active)
        } else {
            self.state = .active(consume active)
        }
    }

    /// Enters closing: nothing more is read or written but a last frame.
    mutating func enterClosing(_ closing: Closing) {
        self.state = .closing(closing)
        self.isClosing = true
        self.requestsInFlight = 0
        self.reliableBytesWaiting = 0
        self.limitsHoldReads = false
        self.compressionPausedUntil = nil
    }

    mutating func established(_ active: Active) {
        self.put(ActiveBox(active), draining: false)
        self.outboundFlags = active.negotiated.checksums ? .checksum : []
        self.peerMaxBodySize = active.negotiated.peerMaxBodySize
    }

    mutating func setDraining(graceDeadline: TetherInstant) {
        guard case .active(var active) = self.state else { return }
        self.state = ._modifying
        active.value.graceDeadline = graceDeadline
        self.put(active, draining: true)
    }
}
