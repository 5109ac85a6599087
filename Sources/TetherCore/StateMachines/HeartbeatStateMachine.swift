public import NIOCore

/// Decides when to PING and when a silent link is dead.
///
/// Any inbound frame proves the link is alive. The machine asks for a PING when nothing was
/// received, or nothing was sent, for one ``interval`` (so the gateway, too, sees the client
/// at least that often). If nothing at all arrives within ``timeout`` of a PING, the link is
/// dead: that catches a gateway that stopped answering while its TCP connection stays open.
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
public struct HeartbeatStateMachine: Sendable {
    /// What the driver must do when the timer fires.
    public enum TimerAction: Hashable, Sendable {
        case none
        /// Send a PING with this id.
        case sendPing(id: UInt64)
        /// Nothing arrived within the timeout of a PING: close the connection.
        case linkDead(silentFor: TimeAmount)
    }

    /// The longest the link may be idle in either direction before a PING is sent.
    public let interval: TimeAmount
    /// How long to wait for any inbound frame after a PING.
    public let timeout: TimeAmount

    private var lastReceived: NIODeadline
    private var lastSent: NIODeadline
    /// When the unanswered PING was sent; `nil` if the link proved alive since.
    private var awaitingSince: NIODeadline?
    /// The last PING, for round-trip measurement by its PONG.
    private var probe: (id: UInt64, sentAt: NIODeadline)?
    private var nextPingID: UInt64 = 1

    /// The most recent round-trip time measured by a PING and its PONG.
    public private(set) var lastRoundTrip: TimeAmount?

    /// Creates a machine for a link that was just established.
    public init(interval: TimeAmount, timeout: TimeAmount, now: NIODeadline) {
        precondition(interval > .zero && timeout > .zero, "heartbeat interval and timeout must be positive")
        self.interval = interval
        self.timeout = timeout
        self.lastReceived = now
        self.lastSent = now
    }

    /// When the driver's timer must fire next.
    public var nextDeadline: NIODeadline {
        if let awaitingSince = self.awaitingSince {
            return awaitingSince + self.timeout
        }
        return min(self.lastReceived, self.lastSent) + self.interval
    }

    /// A frame arrived.
    public mutating func frameReceived(at now: NIODeadline) {
        self.lastReceived = now
        self.awaitingSince = nil
    }

    /// A frame was sent.
    public mutating func frameSent(at now: NIODeadline) {
        self.lastSent = now
    }

    /// A PONG arrived (after ``frameReceived(at:)`` was reported for it).
    /// - Returns: The round-trip time, if the PONG answers the last PING.
    @discardableResult
    public mutating func pongReceived(id: UInt64, at now: NIODeadline) -> TimeAmount? {
        guard let probe = self.probe, probe.id == id else { return nil }
        self.probe = nil
        let roundTrip = now - probe.sentAt
        self.lastRoundTrip = roundTrip
        return roundTrip
    }

    /// The driver's timer fired.
    public mutating func timerFired(at now: NIODeadline) -> TimerAction {
        if let awaitingSince = self.awaitingSince {
            guard now >= awaitingSince + self.timeout else { return .none }
            return .linkDead(silentFor: now - self.lastReceived)
        }
        guard now >= min(self.lastReceived, self.lastSent) + self.interval else { return .none }
        let id = self.nextPingID
        self.nextPingID &+= 1
        self.awaitingSince = now
        self.probe = (id, now)
        self.lastSent = now
        return .sendPing(id: id)
    }
}
