import CoreMetrics
import Foundation
import TetherCore
import TetherNIO

/// How a connection reached the gateway: a metric label.
enum ConnectionTransport: String, Sendable, CaseIterable {
    case tcp
    case tls
    case webSocket = "websocket"
    case httpStream = "http-stream"
    /// Handed over by the application (``Gateway/accept(_:framing:)``).
    case accepted
}

/// The gateway's metrics (swift-metrics), made once: the hot paths only increment and record.
///
/// Labelled metrics whose labels are known in advance (transports) are made up front; those
/// whose labels appear as they happen (status codes, close codes, refusal kinds: each a small
/// fixed set) are made once on first use and kept.
final class GatewayMetrics: Sendable {
    /// The metrics' names: one list, for the code, the guide, the dashboard and the tests.
    enum Names {
        static let connectionsOpen = "tether_connections_open"
        static let connectionsAccepted = "tether_connections_accepted_total"
        static let connectionsClosed = "tether_connections_closed_total"
        static let handshakes = "tether_handshakes_total"
        static let bytesReceived = "tether_bytes_received_total"
        static let bytesSent = "tether_bytes_sent_total"
        static let requests = "tether_requests_total"
        static let requestDuration = "tether_request_duration_seconds"
        static let pushes = "tether_pushes_total"
        static let pushFanout = "tether_push_fanout"
        static let reliableProcessed = "tether_reliable_messages_processed_total"
        static let reliableDuplicates = "tether_reliable_duplicates_total"
        static let reliableConflicts = "tether_reliable_conflicts_total"
        static let reliableExpired = "tether_reliable_expired_total"
        static let reliableBatchSize = "tether_reliable_batch_messages"
        static let reliableBatchDuration = "tether_reliable_batch_seconds"
        static let deliveriesSent = "tether_reliable_deliveries_sent_total"
        static let deliveriesAcknowledged = "tether_reliable_deliveries_acknowledged_total"
        static let storeCommitDuration = "tether_store_commit_seconds"
        static let storeCommitWrites = "tether_store_commit_writes"
        static let storeFailures = "tether_store_failures_total"
        static let slowConsumers = "tether_slow_consumer_closes_total"
        static let limitRefusals = "tether_limit_refusals_total"
        static let memoryHeld = "tether_memory_held_bytes"
        static let memoryBudget = "tether_memory_budget_bytes"
        static let budgetPauses = "tether_memory_budget_pauses_total"
        static let channelSubscriptions = "tether_channel_subscriptions_total"
        static let channelRecovered = "tether_channel_recovered_publications_total"
        static let channels = "tether_channels"
        static let channelHistoryBytes = "tether_channel_history_bytes"
    }

    static let durationBuckets: [Duration] = [
        .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .microseconds(2500), .milliseconds(5),
        .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100), .milliseconds(250), .milliseconds(500),
        .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10),
    ]
    static let fanoutBuckets: [Double] = [1, 2, 5, 10, 50, 100, 500, 1000, 5000, 10000, 50000, 100_000]
    static let batchBuckets: [Double] = [1, 2, 4, 8, 16, 32, 64, 128, 256]

    /// The metrics of one transport.
    struct PerTransport: Sendable {
        let open: Meter
        let accepted: Counter
        let bytesReceived: Counter
        let bytesSent: Counter
    }

    let factory: any MetricsFactory
    private let transports: [ConnectionTransport: PerTransport]
    private let closes: LabelledCounters
    private let handshakeResults: LabelledCounters
    private let refusals: LabelledCounters
    private let pushKinds: LabelledCounters
    /// The counters of the four targets, made at once: a push counts without a lookup (and no lock).
    private let pushTargets: [String: Counter]
    let pushFanout: Recorder
    let processed: Counter
    let duplicates: Counter
    let conflicts: Counter
    let expired: Counter
    let batchSize: Recorder
    let batchDuration: CoreMetrics.Timer
    let deliveriesSent: Counter
    let deliveriesAcknowledged: Counter
    let commitDuration: CoreMetrics.Timer
    let commitWrites: Recorder
    let storeFailures: Counter
    let slowConsumers: Counter
    /// What the connections hold of the memory budget, sampled (``Gateway/reportMemory()``).
    let memoryHeld: Gauge
    /// The memory budget's limit.
    let memoryBudget: Gauge
    /// Connections that paused their reads because the memory budget was exhausted.
    let budgetPauses: Counter
    /// Accepted SUBSCRIBEs by what they got: `recovered` (from a position, nothing lost),
    /// `gap` (told of publications lost), `top` (no position: from what comes next).
    private let subscriptions: [String: Counter]
    /// Publications sent in recoveries (counted per page).
    let recovered: Counter
    /// Channels the hub keeps, and the bytes their in-memory histories hold, sampled.
    let channels: Gauge
    let historyBytes: Gauge

    /// - Parameter factory: Where they go; `nil` for swift-metrics' global factory.
    init(factory: (any MetricsFactory)?) {
        let factory = factory ?? MetricsSystem.factory
        self.factory = factory
        var transports: [ConnectionTransport: PerTransport] = [:]
        for transport in ConnectionTransport.allCases {
            let dimensions = [("transport", transport.rawValue)]
            transports[transport] = PerTransport(
                open: Meter(label: Names.connectionsOpen, dimensions: dimensions, factory: factory),
                accepted: Counter(label: Names.connectionsAccepted, dimensions: dimensions, factory: factory),
                bytesReceived: Counter(label: Names.bytesReceived, dimensions: dimensions, factory: factory),
                bytesSent: Counter(label: Names.bytesSent, dimensions: dimensions, factory: factory)
            )
        }
        self.transports = transports
        self.closes = LabelledCounters(Names.connectionsClosed, factory: factory)
        self.handshakeResults = LabelledCounters(Names.handshakes, factory: factory)
        self.refusals = LabelledCounters(Names.limitRefusals, factory: factory)
        let pushKinds = LabelledCounters(Names.pushes, factory: factory)
        self.pushKinds = pushKinds
        self.pushTargets = Dictionary(
            uniqueKeysWithValues: ["connection", "client", "room", "all", "channel"].map { ($0, pushKinds.counter([("target", $0)])) }
        )
        self.pushFanout = Recorder(label: Names.pushFanout, factory: factory)
        self.processed = Counter(label: Names.reliableProcessed, factory: factory)
        self.duplicates = Counter(label: Names.reliableDuplicates, factory: factory)
        self.conflicts = Counter(label: Names.reliableConflicts, factory: factory)
        self.expired = Counter(label: Names.reliableExpired, factory: factory)
        self.batchSize = Recorder(label: Names.reliableBatchSize, factory: factory)
        self.batchDuration = Timer(label: Names.reliableBatchDuration, factory: factory)
        self.deliveriesSent = Counter(label: Names.deliveriesSent, factory: factory)
        self.deliveriesAcknowledged = Counter(label: Names.deliveriesAcknowledged, factory: factory)
        self.commitDuration = Timer(label: Names.storeCommitDuration, factory: factory)
        self.commitWrites = Recorder(label: Names.storeCommitWrites, factory: factory)
        self.storeFailures = Counter(label: Names.storeFailures, factory: factory)
        self.slowConsumers = Counter(label: Names.slowConsumers, factory: factory)
        self.memoryHeld = Gauge(label: Names.memoryHeld, factory: factory)
        self.memoryBudget = Gauge(label: Names.memoryBudget, factory: factory)
        self.budgetPauses = Counter(label: Names.budgetPauses, factory: factory)
        let subscriptions = LabelledCounters(Names.channelSubscriptions, factory: factory)
        self.subscriptions = Dictionary(
            uniqueKeysWithValues: ["recovered", "gap", "top"].map { ($0, subscriptions.counter([("result", $0)])) }
        )
        self.recovered = Counter(label: Names.channelRecovered, factory: factory)
        self.channels = Gauge(label: Names.channels, factory: factory)
        self.historyBytes = Gauge(label: Names.channelHistoryBytes, factory: factory)
    }

    /// A SUBSCRIBE was accepted: `recovered`, `gap` or `top` (see ``subscriptions``).
    func subscribed(_ result: String) {
        self.subscriptions[result]?.increment()
    }

    func transport(_ transport: ConnectionTransport) -> PerTransport {
        self.transports[transport]!
    }

    /// A connection closed, after its last frame said `code` (`none`: closed without one).
    func closed(_ transport: ConnectionTransport, code: String) {
        self.closes.counter([("transport", transport.rawValue), ("code", code)]).increment()
    }

    /// A handshake ended: `ok`, or why it was refused (a status code's name, `timeout`).
    func handshake(_ result: String) {
        self.handshakeResults.counter([("result", result)]).increment()
    }

    /// A limit refused something: `connections`, `connections_per_address`,
    /// `unauthenticated`, `handshake_rate`, `store_quota`, `reply_size`, `push_size`, `body_size`,
    /// `memory` (the memory budget), `body_timeout` (a body that did not arrive in time),
    /// `subscription` (a SUBSCRIBE refused: a limit, or the client may not).
    func refused(_ limit: String) {
        self.refusals.counter([("limit", limit)]).increment()
    }

    /// A push was made to `kind` (`connection`, `client`, `room`, `all`, `channel`), reaching
    /// `recipients` connections of this node.
    func pushed(_ kind: String, recipients: Int) {
        (self.pushTargets[kind] ?? self.pushKinds.counter([("target", kind)])).increment()
        self.pushFanout.record(recipients)
    }

    /// A lane's batch ended.
    func batch(_ tally: ReliableLaneMachine.Tally, messages: Int, nanoseconds: Int64) {
        if tally.processed > 0 { self.processed.increment(by: tally.processed) }
        if tally.duplicates > 0 { self.duplicates.increment(by: tally.duplicates) }
        if tally.conflicts > 0 { self.conflicts.increment(by: tally.conflicts) }
        if tally.expired > 0 { self.expired.increment(by: tally.expired) }
        self.batchSize.record(messages)
        self.batchDuration.recordNanoseconds(nanoseconds)
    }

    /// The metrics of one method's requests.
    func requests(_ method: String) -> RequestMetrics {
        RequestMetrics(method: method, factory: self.factory)
    }
}

/// The metrics of one method's requests: how many ended with which status, and how long their
/// handlers took. The method is one the router knows, `$auth`, or `unknown`.
final class RequestMetrics: Sendable {
    let ok: Counter
    let duration: CoreMetrics.Timer
    private let statuses: LabelledCounters
    private let method: String

    init(method: String, factory: any MetricsFactory) {
        self.method = method
        self.ok = Counter(label: GatewayMetrics.Names.requests, dimensions: [("method", method), ("status", "ok")], factory: factory)
        self.duration = Timer(label: GatewayMetrics.Names.requestDuration, dimensions: [("method", method)], factory: factory)
        self.statuses = LabelledCounters(GatewayMetrics.Names.requests, factory: factory)
    }

    /// A request ended with `status` after its handler ran `nanoseconds` (`nil`: no handler ran).
    func ended(_ status: StatusCode, nanoseconds: Int64?) {
        if status == .ok {
            self.ok.increment()
        } else {
            self.statuses.counter([("method", self.method), ("status", status.metricLabel)]).increment()
        }
        if let nanoseconds { self.duration.recordNanoseconds(nanoseconds) }
    }
}

/// Counters of one name whose labels are a small fixed set, made on first use.
final class LabelledCounters: Sendable {
    private let label: String
    private let factory: any MetricsFactory
    private let counters = TetherLock<[[String]: Counter]>([:])

    init(_ label: String, factory: any MetricsFactory) {
        self.label = label
        self.factory = factory
    }

    func counter(_ dimensions: [(String, String)]) -> Counter {
        let key = dimensions.map(\.1)
        return self.counters.withLockedValue { counters in
            if let counter = counters[key] { return counter }
            let counter = Counter(label: self.label, dimensions: dimensions, factory: self.factory)
            counters[key] = counter
            return counter
        }
    }
}

extension StatusCode {
    /// The status as a metric label: its name in snake case (`deadline_exceeded`); every
    /// application code is `application`, and a code Tether does not define `other`, so that
    /// the label's values stay a small set.
    var metricLabel: String {
        if self.rawValue >= StatusCode.firstApplicationCode { return "application" }
        let name = self.description
        guard !name.hasPrefix("status ") else { return "other" }
        return name.replacingOccurrences(of: " ", with: "_")
    }
}

extension Frame.Payload {
    /// What a last frame says, as a metric label: an ERROR's code, `goaway_` and a GOAWAY's reason.
    var closeCode: String {
        switch self {
        case .error(let report): report.code.metricLabel
        case .goAway(let goAway): "goaway_" + goAway.reason.description.replacingOccurrences(of: " ", with: "_")
        default: "none"
        }
    }
}
