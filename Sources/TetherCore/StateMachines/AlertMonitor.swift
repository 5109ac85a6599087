/// Something about a client's connection that crossed a threshold (seed 002's alerts): too
/// many reconnections or lost heartbeats within a window, or a slow round trip.
public enum ClientAlert: Sendable, Hashable, CustomStringConvertible {
    /// The client connected again `count` times within `window`: the link flaps.
    case reconnects(count: Int, window: Duration)
    /// `count` connections were declared dead by the heartbeat within `window`: the network
    /// drops the connection silently (a NAT timeout, a dead radio).
    case heartbeatLosses(count: Int, window: Duration)
    /// A heartbeat's round trip took `roundTrip`, over the threshold.
    case slowRoundTrip(Duration)

    public var description: String {
        switch self {
        case .reconnects(let count, let window): "\(count) reconnections within \(window.shortDescription)"
        case .heartbeatLosses(let count, let window): "\(count) connections lost to the heartbeat within \(window.shortDescription)"
        case .slowRoundTrip(let roundTrip): "heartbeat round trip of \(roundTrip.shortDescription)"
        }
    }
}

/// Decides when to raise a ``ClientAlert``: counts events in a sliding window and raises an
/// alert once when a count reaches its threshold, then not again until the count fell below
/// it (so a flapping link raises one alert per episode, not one per reconnection). No I/O;
/// time is passed in.
///
/// ```swift
/// var alerts = AlertMonitor(thresholds: .init(window: .seconds(60), reconnects: 5))
/// if let alert = alerts.reconnected(at: clock.now) { events.yield(.alert(alert)) }
/// ```
package struct AlertMonitor: Sendable {
    package struct Thresholds: Sendable, Hashable {
        package var window: Duration
        package var reconnects: Int?
        package var heartbeatLosses: Int?
        package var roundTrip: Duration?

        package init(window: Duration, reconnects: Int? = nil, heartbeatLosses: Int? = nil, roundTrip: Duration? = nil) {
            self.window = window
            self.reconnects = reconnects
            self.heartbeatLosses = heartbeatLosses
            self.roundTrip = roundTrip
        }
    }

    private enum Kind: Hashable { case reconnects, heartbeatLosses, roundTrip }

    package let thresholds: Thresholds
    private var reconnects: [TetherInstant] = []
    private var heartbeatLosses: [TetherInstant] = []
    private var raised: Set<Kind> = []

    package init(thresholds: Thresholds) {
        self.thresholds = thresholds
    }

    /// The client connected again (not its first connection).
    package mutating func reconnected(at now: TetherInstant) -> ClientAlert? {
        guard let limit = self.thresholds.reconnects else { return nil }
        let count = Self.record(now, in: &self.reconnects, window: self.thresholds.window)
        guard self.crossed(.reconnects, count: count, limit: limit) else { return nil }
        return .reconnects(count: count, window: self.thresholds.window)
    }

    /// The heartbeat declared a connection dead.
    package mutating func heartbeatLost(at now: TetherInstant) -> ClientAlert? {
        guard let limit = self.thresholds.heartbeatLosses else { return nil }
        let count = Self.record(now, in: &self.heartbeatLosses, window: self.thresholds.window)
        guard self.crossed(.heartbeatLosses, count: count, limit: limit) else { return nil }
        return .heartbeatLosses(count: count, window: self.thresholds.window)
    }

    /// A heartbeat's round trip was measured.
    package mutating func roundTrip(_ roundTrip: Duration) -> ClientAlert? {
        guard let limit = self.thresholds.roundTrip else { return nil }
        let over = roundTrip > limit
        guard self.crossed(.roundTrip, count: over ? 1 : 0, limit: 1) else { return nil }
        return .slowRoundTrip(roundTrip)
    }

    /// Appends `now`, forgets what left the window, and returns how many remain.
    private static func record(_ now: TetherInstant, in events: inout [TetherInstant], window: Duration) -> Int {
        events.append(now)
        events.removeAll { now - $0 > window }
        return events.count
    }

    /// Whether `count` reached `limit` now, for the first time since it was last below it.
    private mutating func crossed(_ kind: Kind, count: Int, limit: Int) -> Bool {
        guard count >= limit else {
            self.raised.remove(kind)
            return false
        }
        return self.raised.insert(kind).inserted
    }
}
