import TetherCore
import TetherNIO

/// Percentiles of a set of samples (in the unit the samples are in).
public struct Percentiles: Codable, Sendable, Hashable {
    public var count: Int
    public var p50: Double
    public var p90: Double
    public var p95: Double
    public var p99: Double
    public var max: Double

    /// `nil` for no samples. Uses the nearest-rank method.
    public init?(_ samples: [Double]) {
        guard !samples.isEmpty else { return nil }
        let sorted = samples.sorted()
        func rank(_ p: Double) -> Double {
            let index = Int((p * Double(sorted.count)).rounded(.up)) - 1
            return sorted[Swift.max(0, Swift.min(sorted.count - 1, index))]
        }
        self.count = sorted.count
        self.p50 = rank(0.5)
        self.p90 = rank(0.9)
        self.p95 = rank(0.95)
        self.p99 = rank(0.99)
        self.max = sorted[sorted.count - 1]
    }
}

/// What the receiving app saw: each message number once and in order, or not.
struct ArrivalCheck: Sendable {
    private(set) var seen: Set<Int> = []
    private(set) var highest = -1
    private(set) var duplicates = 0
    private(set) var orderViolations = 0

    /// Records message `number`; returns whether it was new.
    mutating func arrived(_ number: Int) -> Bool {
        guard self.seen.insert(number).inserted else {
            self.duplicates += 1
            return false
        }
        if number != self.highest + 1 { self.orderViolations += 1 }
        self.highest = Swift.max(self.highest, number)
        return true
    }
}

/// A connection event of one lab client, at a time since the scenario started.
struct ClientEvent: Sendable {
    enum Kind: Sendable, Hashable {
        /// `run()` was called.
        case started
        case connecting
        case connected
        case disconnected(heartbeatTimeout: Bool)
    }

    var client: String
    var time: Double
    var kind: Kind
}

/// Everything a scenario run records, stamped with seconds since its start.
final class LabRecorder: Sendable {
    struct Message: Sendable {
        var accepted: Double
        var delivered: Double?
        var backlog: Bool
    }

    struct Request: Sendable {
        var started: Double
        var latency: Double?
    }

    struct State: Sendable {
        var messages: [Message] = []
        var arrivals = ArrivalCheck()
        var requests: [Request] = []
        var events: [ClientEvent] = []
        var windows: [DisruptionWindow] = []
    }

    let start = ContinuousClock.now
    let state = TetherLock(State())

    /// Seconds since the scenario started.
    func now() -> Double {
        (ContinuousClock.now - self.start).totalSeconds
    }

    /// Records that alice's `send` returned for the next message; returns its number.
    func accepted(backlog: Bool) -> Int {
        let time = self.now()
        return self.state.withLockedValue { state in
            state.messages.append(Message(accepted: time, delivered: nil, backlog: backlog))
            return state.messages.count - 1
        }
    }

    /// Records that bob's app got message `number`.
    func delivered(_ number: Int) {
        let time = self.now()
        self.state.withLockedValue { state in
            if state.arrivals.arrived(number), state.messages.indices.contains(number) {
                state.messages[number].delivered = time
            }
        }
    }

    func request(started: Double, latency: Double?) {
        self.state.withLockedValue { $0.requests.append(Request(started: started, latency: latency)) }
    }

    func event(_ client: String, _ kind: ClientEvent.Kind) {
        let time = self.now()
        self.state.withLockedValue { $0.events.append(ClientEvent(client: client, time: time, kind: kind)) }
    }

    func window(_ window: DisruptionWindow) {
        self.state.withLockedValue { $0.windows.append(window) }
    }

    /// Whether every accepted message has reached bob.
    var allDelivered: Bool {
        self.state.withLockedValue { state in state.messages.allSatisfy { $0.delivered != nil } }
    }

    var snapshot: State { self.state.withLockedValue { $0 } }

    /// Messages alice's `send` accepted so far.
    var acceptedCount: Int { self.state.withLockedValue { $0.messages.count } }

    /// Requests that got their answer so far.
    var requestsSucceeded: Int { self.state.withLockedValue { $0.requests.filter { $0.latency != nil }.count } }
}

/// When the path broke and when it came back, in seconds since the scenario started.
public struct DisruptionWindow: Codable, Sendable, Hashable {
    public var start: Double
    public var restored: Double
    /// Whether the device reported the change (a network-path signal).
    public var signalled: Bool
}
