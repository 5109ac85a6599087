import Atomics
import CoreMetrics
import TetherCore
import TetherNIO

/// Keeps a client's ``ConnectionStatistics`` and its swift-metrics, and raises its alerts: one
/// per client, told by the connection loop, the connection handler and the reliable engine.
/// Everything it counts is per event (a connection, a PING, a request, a flush), never per byte.
///
/// What the hot paths count (bytes per read and per flush, requests, reliable messages) are
/// atomic counters: no lock. The lock keeps what changes with the connection (connects,
/// heartbeats, alerts), which happens seconds apart.
final class ClientStatisticsRecorder: Sendable {
    private struct State {
        var statistics = ConnectionStatistics()
        var connectedAt: TetherInstant?
        var alerts: AlertMonitor
    }

    /// The counts of the hot paths.
    private struct Counts: Sendable {
        let bytesSent = ManagedAtomic(0)
        let bytesReceived = ManagedAtomic(0)
        let protocolErrors = ManagedAtomic(0)
        let requests = ManagedAtomic(0)
        let requestsFailed = ManagedAtomic(0)
        let requestsTimedOut = ManagedAtomic(0)
        let messagesSent = ManagedAtomic(0)
        let messagesRetransmitted = ManagedAtomic(0)
        let messagesAcknowledged = ManagedAtomic(0)
        let messagesExpired = ManagedAtomic(0)
        let outboxDepth = ManagedAtomic(0)
        let heartbeatsSent = ManagedAtomic(0)

        func add(to statistics: inout ConnectionStatistics) {
            statistics.bytesSent = self.bytesSent.load(ordering: .relaxed)
            statistics.bytesReceived = self.bytesReceived.load(ordering: .relaxed)
            statistics.protocolErrors = self.protocolErrors.load(ordering: .relaxed)
            statistics.requests = self.requests.load(ordering: .relaxed)
            statistics.requestsFailed = self.requestsFailed.load(ordering: .relaxed)
            statistics.requestsTimedOut = self.requestsTimedOut.load(ordering: .relaxed)
            statistics.messagesSent = self.messagesSent.load(ordering: .relaxed)
            statistics.messagesRetransmitted = self.messagesRetransmitted.load(ordering: .relaxed)
            statistics.messagesAcknowledged = self.messagesAcknowledged.load(ordering: .relaxed)
            statistics.messagesExpired = self.messagesExpired.load(ordering: .relaxed)
            statistics.outboxDepth = self.outboxDepth.load(ordering: .relaxed)
            statistics.heartbeatsSent = self.heartbeatsSent.load(ordering: .relaxed)
        }
    }

    /// The metrics' names (`tether_client_*`); no label names a client, method or topic.
    enum Names {
        static let connectAttempts = "tether_client_connect_attempts_total"
        static let connects = "tether_client_connects_total"
        static let connectFailures = "tether_client_connect_failures_total"
        static let disconnects = "tether_client_disconnects_total"
        static let heartbeatsSent = "tether_client_heartbeats_sent_total"
        static let heartbeatsLost = "tether_client_heartbeats_lost_total"
        static let roundTrip = "tether_client_round_trip_seconds"
        static let bytesSent = "tether_client_bytes_sent_total"
        static let bytesReceived = "tether_client_bytes_received_total"
        static let protocolErrors = "tether_client_protocol_errors_total"
        static let requests = "tether_client_requests_total"
        static let requestDuration = "tether_client_request_duration_seconds"
        static let messagesSent = "tether_client_messages_sent_total"
        static let messagesRetransmitted = "tether_client_messages_retransmitted_total"
        static let messagesAcknowledged = "tether_client_messages_acknowledged_total"
        static let messagesExpired = "tether_client_messages_expired_total"
        static let outboxDepth = "tether_client_outbox_depth"
        static let alerts = "tether_client_alerts_total"
    }

    private let state: TetherLock<State>
    private let counts = Counts()
    private let clock: any TetherClock
    private let factory: any MetricsFactory
    private let connectAttempts: Counter
    private let connectFailures: Counter
    private let heartbeatsSent: Counter
    private let heartbeatsLost: Counter
    private let roundTrip: CoreMetrics.Timer
    private let bytesSent: Counter
    private let bytesReceived: Counter
    private let protocolErrors: Counter
    private let requestDuration: CoreMetrics.Timer
    private let messagesSent: Counter
    private let messagesRetransmitted: Counter
    private let messagesAcknowledged: Counter
    private let messagesExpired: Counter
    private let outboxDepth: Meter
    /// `tether_client_requests_total{outcome="ok"}`, made at once: the one a request that
    /// succeeds counts, without a lookup.
    private let requestsOK: Counter
    /// Counters whose label is one of a small fixed set (a transport, a status, a reason), made on first use.
    private let labelled = TetherLock<[String: Counter]>([:])

    init(alerts: AlertMonitor.Thresholds, clock: any TetherClock, factory: (any MetricsFactory)?) {
        self.state = TetherLock(State(alerts: AlertMonitor(thresholds: alerts)))
        self.clock = clock
        let factory = factory ?? MetricsSystem.factory
        self.factory = factory
        self.connectAttempts = Counter(label: Names.connectAttempts, factory: factory)
        self.connectFailures = Counter(label: Names.connectFailures, factory: factory)
        self.heartbeatsSent = Counter(label: Names.heartbeatsSent, factory: factory)
        self.heartbeatsLost = Counter(label: Names.heartbeatsLost, factory: factory)
        self.roundTrip = Timer(label: Names.roundTrip, factory: factory)
        self.bytesSent = Counter(label: Names.bytesSent, factory: factory)
        self.bytesReceived = Counter(label: Names.bytesReceived, factory: factory)
        self.protocolErrors = Counter(label: Names.protocolErrors, factory: factory)
        self.requestDuration = Timer(label: Names.requestDuration, factory: factory)
        self.messagesSent = Counter(label: Names.messagesSent, factory: factory)
        self.messagesRetransmitted = Counter(label: Names.messagesRetransmitted, factory: factory)
        self.messagesAcknowledged = Counter(label: Names.messagesAcknowledged, factory: factory)
        self.messagesExpired = Counter(label: Names.messagesExpired, factory: factory)
        self.outboxDepth = Meter(label: Names.outboxDepth, factory: factory)
        self.requestsOK = Counter(label: Names.requests, dimensions: [("outcome", "ok")], factory: factory)
    }

    /// The statistics now, the current connection's time included.
    var snapshot: ConnectionStatistics {
        let now = self.clock.now
        return self.state.withLockedValue { state in
            var statistics = state.statistics
            self.counts.add(to: &statistics)
            if let since = state.connectedAt, let transport = statistics.currentTransport {
                statistics.timeConnected[transport, default: .zero] += now - since
            }
            return statistics
        }
    }

    private func counter(_ label: String, _ dimensions: [(String, String)]) -> Counter {
        let key = label + dimensions.map { "|\($0.1)" }.joined()
        return self.labelled.withLockedValue { counters in
            if let counter = counters[key] { return counter }
            let counter = Counter(label: label, dimensions: dimensions, factory: self.factory)
            counters[key] = counter
            return counter
        }
    }

    // MARK: The connection loop

    func attemptStarted() {
        self.connectAttempts.increment()
        self.state.withLockedValue { $0.statistics.connectAttempts += 1 }
    }

    func attemptFailed() {
        self.connectFailures.increment()
        self.state.withLockedValue { $0.statistics.connectFailures += 1 }
    }

    /// A connection was established over `transport`.
    /// - Returns: An alert, if the reconnections crossed their threshold.
    func connected(over transport: Endpoint.Transport) -> ClientAlert? {
        self.counter(Names.connects, [("transport", transport.rawValue)]).increment()
        let now = self.clock.now
        return self.state.withLockedValue { state in
            state.statistics.connects += 1
            state.statistics.currentTransport = transport
            state.connectedAt = now
            guard state.statistics.connects > 1 else { return nil }
            return self.raise(state.alerts.reconnected(at: now), in: &state)
        }
    }

    /// The established connection closed.
    /// - Returns: An alert, if the heartbeat's losses crossed their threshold.
    func disconnected(_ reason: DisconnectReason) -> ClientAlert? {
        self.counter(Names.disconnects, [("reason", reason.metricLabel)]).increment()
        let heartbeatLost: Bool
        if case .heartbeatTimeout = reason {
            heartbeatLost = true
            self.heartbeatsLost.increment()
        } else {
            heartbeatLost = false
        }
        let now = self.clock.now
        return self.state.withLockedValue { state in
            state.statistics.disconnects += 1
            if let since = state.connectedAt, let transport = state.statistics.currentTransport {
                state.statistics.timeConnected[transport, default: .zero] += now - since
            }
            state.connectedAt = nil
            state.statistics.currentTransport = nil
            guard heartbeatLost else { return nil }
            state.statistics.heartbeatsLost += 1
            return self.raise(state.alerts.heartbeatLost(at: now), in: &state)
        }
    }

    // MARK: The connection handler

    func pingSent() {
        self.heartbeatsSent.increment()
        self.counts.heartbeatsSent.wrappingIncrement(ordering: .relaxed)
    }

    /// A PONG arrived.
    /// - Returns: An alert, if the round trip is over its threshold.
    func heartbeat(roundTrip: Duration?, smoothed: Duration?, interval: Duration) -> ClientAlert? {
        if let roundTrip { self.roundTrip.recordNanoseconds(roundTrip.nanoseconds) }
        return self.state.withLockedValue { state in
            state.statistics.roundTrip = roundTrip ?? state.statistics.roundTrip
            state.statistics.smoothedRoundTrip = smoothed
            state.statistics.heartbeatInterval = interval
            guard let roundTrip else { return nil }
            return self.raise(state.alerts.roundTrip(roundTrip), in: &state)
        }
    }

    func bytes(read: Int, written: Int) {
        if read > 0 { self.bytesReceived.increment(by: read) }
        if written > 0 { self.bytesSent.increment(by: written) }
        if read > 0 { self.counts.bytesReceived.wrappingIncrement(by: read, ordering: .relaxed) }
        if written > 0 { self.counts.bytesSent.wrappingIncrement(by: written, ordering: .relaxed) }
    }

    func protocolError() {
        self.protocolErrors.increment()
        self.counts.protocolErrors.wrappingIncrement(ordering: .relaxed)
    }

    func messageSent(first: Bool) {
        (first ? self.messagesSent : self.messagesRetransmitted).increment()
        (first ? self.counts.messagesSent : self.counts.messagesRetransmitted).wrappingIncrement(ordering: .relaxed)
    }

    // MARK: Requests and the outbox

    /// A request ended: `error` is `nil` on success.
    func requestEnded(_ error: TetherError?, after duration: Duration) {
        self.requestDuration.recordNanoseconds(duration.nanoseconds)
        self.counts.requests.wrappingIncrement(ordering: .relaxed)
        guard let error else {
            self.requestsOK.increment()
            return
        }
        let outcome = "\(error.code)".replacingOccurrences(of: " ", with: "_")
        self.counter(Names.requests, [("outcome", outcome)]).increment()
        self.counts.requestsFailed.wrappingIncrement(ordering: .relaxed)
        if error.code == .timedOut { self.counts.requestsTimedOut.wrappingIncrement(ordering: .relaxed) }
    }

    /// A reliable message ended: acknowledged (whatever its status) or expired.
    func messageEnded(expired: Bool) {
        (expired ? self.messagesExpired : self.messagesAcknowledged).increment()
        (expired ? self.counts.messagesExpired : self.counts.messagesAcknowledged).wrappingIncrement(ordering: .relaxed)
    }

    func outbox(depth: Int) {
        self.outboxDepth.set(depth)
        self.counts.outboxDepth.store(depth, ordering: .relaxed)
    }

    private func raise(_ alert: ClientAlert?, in state: inout State) -> ClientAlert? {
        guard let alert else { return nil }
        state.statistics.alerts += 1
        self.counter(Names.alerts, [("kind", alert.metricLabel)]).increment()
        return alert
    }
}

extension ClientAlert {
    var metricLabel: String {
        switch self {
        case .reconnects: "reconnects"
        case .heartbeatLosses: "heartbeat_losses"
        case .slowRoundTrip: "slow_round_trip"
        }
    }
}

extension DisconnectReason {
    /// The reason's kind, as a metric label.
    var metricLabel: String {
        switch self {
        case .closedByPeer: "closed_by_peer"
        case .heartbeatTimeout: "heartbeat_timeout"
        case .goingAway: "going_away"
        case .protocolViolation: "protocol_violation"
        case .gatewayError: "gateway_error"
        case .transportError: "transport_error"
        case .linkFailing: "link_failing"
        case .shutdown: "shutdown"
        case .movingUp: "moving_up"
        }
    }
}
