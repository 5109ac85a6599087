/// Decides when to PING and when a silent link is dead.
///
/// Any inbound frame proves the link is alive. The machine asks for a PING when nothing was
/// received, or nothing was sent, for one interval (so the gateway, too, sees the client at
/// least that often). If nothing at all arrives within the PONG timeout of a PING, the link is
/// dead: that catches a gateway that stopped answering while its TCP connection stays open.
///
/// - **Adaptive timeout**: the PONG timeout follows the measured round trips (smoothed RTT plus
///   four times its variation, as TCP's RTO), within a floor and a ceiling.
/// - **Jitter**: each interval is shortened by a random fraction, so that many clients do not
///   ping in lockstep.
/// - **Suspension-safe**: a timer that fires much later than due means the process was
///   suspended (or the event loop was blocked). The link is not judged on stale timers: the
///   machine sends a fresh probe with a short timeout, and only its silence kills the link.
///
/// - **Idle probes**: a PING sent after the link was silent both ways for an interval tells
///   whether the path (a NAT, a firewall) keeps an idle connection that long. The machine
///   reports its fate (``frameReceived(at:)`` returns it when answered,
///   ``outstandingIdleProbe`` holds it when the link dies) for ``NATTimeoutProber``.
///
/// Time is passed in; the machine never reads a clock. Its driver arms one timer for
/// ``nextDeadline`` and calls ``timerFired(at:)`` when it expires.
///
/// ```swift
/// var heartbeat = HeartbeatStateMachine(interval: .seconds(10), timeout: .seconds(5), now: .now())
/// switch heartbeat.timerFired(at: .now()) {
/// case .sendPing(let id): write(.ping(.init(id: id)))
/// case .linkDead: close()
/// case .none: break
/// }
/// ```
package struct HeartbeatStateMachine: Sendable {
    /// How the machine paces and judges the link.
    package struct Configuration: Sendable, Hashable {
        /// The longest the link may be idle in either direction before a PING is sent.
        package var interval: Duration
        /// Each interval is shortened by up to this fraction (0 to 0.5), at random.
        package var jitter: Double
        /// The PONG timeout's estimator: its initial timeout is used until a PONG is measured,
        /// and its minimum and maximum bound the derived timeout.
        package var timeout: RTTEstimator
        /// A timer at least this late means a suspension; `nil` turns the detection off.
        package var suspensionThreshold: Duration?
        /// How long the probe sent after a suspension waits for an answer.
        package var probeTimeout: Duration
        /// While the link is in use (the last frame sent is newer than the last one received,
        /// so an answer may be due), a silence this long is probed with a PING at once instead
        /// of after `interval`: a TCP connection stuck in retransmission backoff on a lossy link
        /// is found in seconds, not left to the kernel's growing timer. `nil` turns this off.
        package var stallInterval: Duration?

        package init(
            interval: Duration,
            jitter: Double = 0,
            timeout: RTTEstimator,
            suspensionThreshold: Duration? = nil,
            probeTimeout: Duration = .seconds(2),
            stallInterval: Duration? = nil
        ) {
            precondition(interval > .zero && probeTimeout > .zero, "heartbeat interval and probe timeout must be positive")
            precondition(stallInterval.map { $0 > .zero } ?? true, "the stall interval must be positive")
            precondition((0...0.5).contains(jitter), "heartbeat jitter must be between 0 and 0.5")
            self.interval = interval
            self.jitter = jitter
            self.timeout = timeout
            self.suspensionThreshold = suspensionThreshold
            self.probeTimeout = probeTimeout
            self.stallInterval = stallInterval
        }
    }

    /// What the driver must do when the timer fires.
    package enum TimerAction: Hashable, Sendable {
        case none
        /// Send a PING with this id.
        case sendPing(id: UInt64)
        /// Nothing arrived within the timeout of a PING: close the connection.
        case linkDead(silentFor: Duration)
    }

    /// A PING sent after the link was silent both ways for about a whole interval: since the
    /// previous PING's answer, which came up to one PONG timeout after it, nothing else passed.
    package struct IdleProbe: Sendable, Hashable {
        /// The heartbeat interval in force when it was sent (before jitter).
        package var interval: Duration
        /// How long the link had been silent both ways.
        package var silence: Duration
    }

    package private(set) var configuration: Configuration
    private var generator: SplitMix64

    private var lastReceived: TetherInstant
    private var lastSent: TetherInstant
    /// This round's interval: the configured one, less the jitter.
    private(set) var currentInterval: Duration
    /// When the unanswered PING was sent and how long it may wait; `nil` if the link proved
    /// alive since.
    private var awaiting: (since: TetherInstant, timeout: Duration)?
    /// The last PING, for round-trip measurement by its PONG.
    private var probe: (id: UInt64, sentAt: TetherInstant)?
    private var nextPingID: UInt64 = 1
    /// The unanswered PING, if it was an idle probe.
    private var idleProbe: IdleProbe?

    /// The most recent round-trip time measured by a PING and its PONG.
    package private(set) var lastRoundTrip: Duration?
    /// How many suspensions (late timers) were detected.
    package private(set) var suspensions = 0

    /// The longest the link may be idle in either direction before a PING is sent.
    package var interval: Duration { self.configuration.interval }

    /// How long a PING waits for an answer now: derived from the round trips measured so far.
    package var timeout: Duration { self.configuration.timeout.retransmissionTimeout }

    /// Creates a machine for a link that was just established.
    package init(configuration: Configuration, now: TetherInstant, generator: SplitMix64 = SplitMix64()) {
        self.configuration = configuration
        self.generator = generator
        self.lastReceived = now
        self.lastSent = now
        self.currentInterval = configuration.interval
        self.currentInterval = self.drawInterval()
    }

    /// A machine with a fixed interval and PONG timeout, no jitter and no suspension detection.
    package init(interval: Duration, timeout: Duration, now: TetherInstant) {
        precondition(interval > .zero && timeout > .zero, "heartbeat interval and timeout must be positive")
        let fixed = RTTEstimator(initialTimeout: timeout, minimumTimeout: timeout, maximumTimeout: timeout)
        self.init(configuration: Configuration(interval: interval, timeout: fixed), now: now)
    }

    /// When the driver's timer must fire next.
    package var nextDeadline: TetherInstant {
        if let awaiting = self.awaiting {
            return awaiting.since + awaiting.timeout
        }
        let idle = min(self.lastReceived, self.lastSent) + self.currentInterval
        if let stall = self.configuration.stallInterval, self.lastSent > self.lastReceived {
            return min(idle, self.lastReceived + stall)
        }
        return idle
    }

    /// The unanswered PING, if it was sent after a whole interval of silence both ways. If the
    /// link dies now, the path probably forgot the idle connection.
    package var outstandingIdleProbe: IdleProbe? { self.idleProbe }

    /// A frame arrived.
    /// - Returns: The idle probe this frame answers, if one was outstanding: the path kept the
    ///   connection through that much silence.
    @discardableResult
    package mutating func frameReceived(at now: TetherInstant) -> IdleProbe? {
        self.lastReceived = now
        self.awaiting = nil
        defer { self.idleProbe = nil }
        return self.idleProbe
    }

    /// A frame was sent.
    package mutating func frameSent(at now: TetherInstant) {
        self.lastSent = now
    }

    /// A PONG arrived (after ``frameReceived(at:)`` was reported for it).
    /// - Returns: The round-trip time, if the PONG answers the last PING; it also refines the
    ///   PONG timeout.
    @discardableResult
    package mutating func pongReceived(id: UInt64, at now: TetherInstant) -> Duration? {
        guard let probe = self.probe, probe.id == id else { return nil }
        self.probe = nil
        let roundTrip = now - probe.sentAt
        self.lastRoundTrip = roundTrip
        self.configuration.timeout.record(sample: roundTrip)
        return roundTrip
    }

    /// Changes the interval (the app went to the background, say). The driver re-arms its
    /// timer for ``nextDeadline``.
    /// - Parameters:
    ///   - interval: The new interval.
    ///   - jitter: A new jitter fraction (0 to 0.5), or `nil` to keep the current one.
    package mutating func setInterval(_ interval: Duration, jitter: Double? = nil) {
        precondition(interval > .zero, "heartbeat interval must be positive")
        if let jitter {
            precondition((0...0.5).contains(jitter), "heartbeat jitter must be between 0 and 0.5")
            self.configuration.jitter = jitter
        }
        self.configuration.interval = interval
        self.currentInterval = self.drawInterval()
    }

    /// Probes the link at once, judged with the adaptive timeout: the app came back to the
    /// foreground, say, and wants to know now whether the connection survived.
    /// - Returns: The PING to send, or `.none` if one is already awaiting its answer.
    package mutating func probeNow(at now: TetherInstant) -> TimerAction {
        guard self.awaiting == nil else { return .none }
        return self.ping(at: now, timeout: self.timeout, idleProbe: nil)
    }

    /// The driver's timer fired.
    package mutating func timerFired(at now: TetherInstant) -> TimerAction {
        let due = self.nextDeadline
        guard now >= due else { return .none }
        if let threshold = self.configuration.suspensionThreshold, now - due >= threshold {
            // Suspended (or blocked) past the deadline: frames may be waiting unread, and the
            // gateway may have closed the connection meanwhile. Probe quickly before judging.
            self.suspensions += 1
            return self.ping(at: now, timeout: self.configuration.probeTimeout, idleProbe: nil)
        }
        if self.awaiting != nil {
            return .linkDead(silentFor: now - self.lastReceived)
        }
        // On an idle link the last frames were the previous PING and, a round trip later, its
        // PONG: the silence is the interval less that round trip, which the timeout bounds.
        let silence = now - max(self.lastReceived, self.lastSent)
        let idle = silence + self.timeout >= self.currentInterval ? IdleProbe(interval: self.configuration.interval, silence: silence) : nil
        return self.ping(at: now, timeout: self.timeout, idleProbe: idle)
    }

    private mutating func ping(at now: TetherInstant, timeout: Duration, idleProbe: IdleProbe?) -> TimerAction {
        let id = self.nextPingID
        self.nextPingID &+= 1
        self.idleProbe = idleProbe
        self.awaiting = (now, timeout)
        self.probe = (id, now)
        self.lastSent = now
        self.currentInterval = self.drawInterval()
        return .sendPing(id: id)
    }

    private mutating func drawInterval() -> Duration {
        let jitter = self.configuration.jitter
        guard jitter > 0 else { return self.configuration.interval }
        let fraction = Double.random(in: 0..<jitter, using: &self.generator)
        let nanoseconds = Double(self.configuration.interval.nanoseconds) * (1 - fraction)
        return .nanoseconds(max(1, Int64(nanoseconds)))
    }
}
