/// What one scenario measured; encoded to `results.json` and summarised in the report.
public struct ScenarioResult: Codable, Sendable {
    public struct Delivery: Codable, Sendable {
        /// Messages accepted by alice's `send` (steady phase and backlog).
        public var accepted: Int
        public var within5s: Int
        public var within30s: Int
        public var eventually: Int
        /// Seen twice by bob's app: must be 0.
        public var duplicates: Int
        /// Seen out of order by bob's app: must be 0.
        public var orderViolations: Int
        /// Acceptance to bob's app, steady-phase messages, milliseconds.
        public var latency: Percentiles?
    }

    public struct Backlog: Codable, Sendable {
        public var messages: Int
        /// From the first message accepted to the last one delivered, seconds.
        public var drainSeconds: Double?
        /// Acceptance to bob's app, milliseconds.
        public var latency: Percentiles?
    }

    public struct Requests: Codable, Sendable {
        public var sent: Int
        public var succeeded: Int
        /// Milliseconds, successful requests.
        public var latency: Percentiles?
    }

    public struct Reconnection: Codable, Sendable {
        /// Path restored → connected again, seconds, one sample per client and restoration.
        public var restoredToConnected: Percentiles?
        /// Whether the restorations were signalled by the device.
        public var signalled: Bool
        /// Clients that did not lose their connection.
        public var stayedConnected: Int
        /// Clients that had not reconnected when the scenario ended: must be 0.
        public var neverReconnected: Int
        /// Start of a blackhole → the client declares the link dead, seconds.
        public var detection: Percentiles?
    }

    public struct Herd: Codable, Sendable {
        public var clients: Int
        /// Handshakes completed per second, highest 100 ms window × 10.
        public var peakConnectsPerSecond: Double
        /// Connection attempts started per second, highest 100 ms window × 10.
        public var peakAttemptsPerSecond: Double
        /// Gateway back → the last client connected, seconds.
        public var secondsToAllReconnected: Double?
        /// Handshakes completed per 100 ms after the gateway came back.
        public var connectsPer100ms: [Int]
    }

    /// The restrictive-network experiment: clients whose raw port and WebSocket are blocked
    /// fall back to the HTTP stream, then move back up when the raw port opens.
    public struct NodeKill: Codable, Sendable {
        public var nodes: Int
        public var clients: Int
        /// When the node was killed, seconds from the start.
        public var killedAtSeconds: Double
        /// Clients connected to the killed node at that moment.
        public var affected: Int
        /// The kill → the affected client connected to another node, seconds.
        public var back: Percentiles?
        /// Affected clients not connected again by the end: must be 0.
        public var neverBack: Int
    }

    /// The channels experiment: what the subscribers received against the channels' tops.
    public struct Channels: Codable, Sendable {
        public var clients: Int
        public var channels: Int
        /// The publications each channel keeps.
        public var history: Int
        /// Publications in all the channels (their tops).
        public var published: Int
        /// Publish requests answered, and those that failed, by error code (timed out under
        /// loss, their connection lost: they may have been published all the same).
        public var publishAcknowledged: Int
        public var publishFailed: [String: Int]
        /// The lengths of the subscribers' cuts, seconds.
        public var cuts: Percentiles?
        /// Publications the subscribers should have had: each one's channel's top, but for those
        /// published before it first subscribed (``startedLate``).
        public var expected: Int
        /// Publications made before a subscriber first subscribed (a link so lossy that its
        /// first subscription came after the publisher started), which it never asked for.
        public var startedLate: Int
        /// Publications the subscribers received, each once.
        public var received: Int
        /// SUBSCRIBEs answered (the first ones and each one after a reconnect).
        public var subscriptions: Int
        /// Gap events, and the publications they said were lost.
        public var gaps: Int
        public var missedInGaps: Int
        /// Each must be 0.
        public var duplicates: Int
        public var silentlyLost: Int
        public var inexactGaps: Int
        /// Gaps that resume later than the oldest publication the history could still hold.
        public var unjustifiedGaps: Int
        public var epochChanges: Int
        public var notCaughtUp: Int
        /// A link back → the subscriber had every publication made before it came back, seconds.
        public var caughtUpAfterCut: Percentiles?
    }

    public struct Restricted: Codable, Sendable {
        /// `rejected` or `blackholed`.
        public var rawPort: String
        public var clients: Int
        /// A client's start → its first successful request, seconds.
        public var firstRequest: Percentiles?
        /// Clients whose requests never succeeded: must be 0.
        public var noFirstRequest: Int
        /// Where the clients were connected at their first successful request, by scheme.
        public var firstTransports: [String: Int]
        /// When the raw port opened, seconds from the start.
        public var liftedAtSeconds: Double?
        public var heartbeatIntervalSeconds: Double
        public var moveUpIntervalSeconds: Double
        /// The raw port opened → the client connected there, seconds.
        public var movedUp: Percentiles?
        /// Clients still on a fallback at the end: must be 0.
        public var neverMovedUp: Int
    }

    /// The NAT-timeout experiment: idle background clients behind a NAT that forgets idle
    /// connections, with NAT-timeout probing and without.
    public struct NATTimeout: Codable, Sendable {
        public struct Group: Codable, Sendable {
            public var clients: Int
            /// Connections lost (the NAT forgot them and the heartbeat found out).
            public var linksLost: Int
            /// Of those, lost after the group's search had settled (probing group).
            public var linksLostAfterSettled: Int?
            /// The share of client-time spent on a connection the NAT had forgotten: pushes
            /// then go nowhere until the heartbeat notices.
            public var unreachableFraction: Double
            /// Bytes on the wire per client and hour, both ways (after settling, for the
            /// probing group), reconnections included.
            public var bytesPerHourPerClient: Double?
        }

        public var natTimeoutSeconds: Double
        /// The fixed group's interval (half the gateway's idle timeout).
        public var fixedIntervalSeconds: Double
        /// The probing group's first interval and step.
        public var probingInitialSeconds: Double
        public var probingStepSeconds: Double
        /// The interval each probing client ended with, seconds.
        public var learnedSeconds: [Double]
        /// Start → the last probing client settled, seconds; `nil` if some had not.
        public var settledAfterSeconds: Double?
        public var probing: Group
        public var fixed: Group
    }

    public var name: String
    public var summary: String
    /// Why the scenario did not run, if it did not.
    public var skipped: String?
    public var seconds: Double = 0
    public var delivery: Delivery?
    public var backlog: Backlog?
    public var requests: Requests?
    /// `run()` called → connected, milliseconds, all clients.
    public var firstConnect: Percentiles?
    public var reconnection: Reconnection?
    public var herd: Herd?
    public var natTimeout: NATTimeout?
    public var restricted: Restricted?
    public var nodeKill: NodeKill?
    public var channels: Channels?
    /// Bytes on the wire (application level, both ways) of one idle connection, per hour.
    public var heartbeatBytesPerHour: Double?
    /// Bytes on the wire (both links, both ways) per backlog message, minus its body.
    public var overheadBytesPerMessage: Double?
    /// A message with a 5 s TTL sent into the blackhole: its outcome (should be "expired").
    public var ttlProbe: String?
    /// What the gateway counted itself (its `/metrics`), at the end, beside the lab's figures.
    public var gateway: GatewayView?
    /// Disconnections by reason.
    public var disconnects: [String: Int] = [:]
    public var windows: [DisruptionWindow] = []
    /// [accepted, delivered or -1] per message, seconds since the start (for the plots).
    public var messages: [[Double]] = []

    /// The gateway's own view of a scenario, from its `/metrics` once every client was
    /// connected again at the end. Its counters start with the gateway process: in scenarios
    /// that restart it, they cover only the last process.
    public struct GatewayView: Codable, Sendable {
        /// The gateway was restarted during the scenario (its counters cover the last process).
        public var restarted: Bool
        /// `tether_connections_open`: must equal ``clients``.
        public var connectionsOpen: Int
        /// Clients the lab had connected at that moment.
        public var clients: Int
        /// `tether_handshakes_total{result="ok"}`.
        public var handshakes: Int
        /// `tether_requests_total{method="echo",status="ok"}`; the lab's successes are at most
        /// this (an answer can be lost on its way back).
        public var echoAnswered: Int
        /// `tether_reliable_messages_processed_total`: without a restart, exactly the lab's
        /// messages (each processed once).
        public var messagesProcessed: Int
        /// `tether_reliable_duplicates_total`: retransmissions the gateway answered without
        /// running the handler again.
        public var duplicatesDropped: Int
        public var deliveriesSent: Int
        public var deliveriesAcknowledged: Int
        /// Whether the two views agree (see each field), and if not, why.
        public var disagreements: [String]
    }

    public init(name: String, summary: String, skipped: String? = nil) {
        self.name = name
        self.summary = summary
        self.skipped = skipped
    }
}

extension ScenarioResult {
    /// Fills the figures in from what the run recorded.
    mutating func analyze(_ recorded: LabRecorder.State, clients: [String], scenario: Scenario) {
        let messages = recorded.messages
        func latency(_ message: LabRecorder.Message) -> Double? { message.delivered.map { ($0 - message.accepted) * 1000 } }
        let latencies = messages.compactMap(latency)
        self.delivery = Delivery(
            accepted: messages.count,
            within5s: latencies.filter { $0 <= 5000 }.count,
            within30s: latencies.filter { $0 <= 30000 }.count,
            eventually: latencies.count,
            duplicates: recorded.arrivals.duplicates,
            orderViolations: recorded.arrivals.orderViolations,
            latency: Percentiles(messages.filter { !$0.backlog }.compactMap(latency))
        )
        let backlog = messages.filter(\.backlog)
        if !backlog.isEmpty {
            let drained = backlog.allSatisfy { $0.delivered != nil }
            self.backlog = Backlog(
                messages: backlog.count,
                drainSeconds: drained ? backlog.compactMap(\.delivered).max()! - backlog[0].accepted : nil,
                latency: Percentiles(backlog.compactMap(latency))
            )
        }
        self.requests = Requests(
            sent: recorded.requests.count,
            succeeded: recorded.requests.filter { $0.latency != nil }.count,
            latency: Percentiles(recorded.requests.compactMap { $0.latency.map { $0 * 1000 } })
        )
        self.messages = messages.map { [$0.accepted, $0.delivered ?? -1] }
        self.windows = recorded.windows

        let byClient = Dictionary(grouping: recorded.events, by: \.client)
        self.firstConnect = Percentiles(
            clients.compactMap { client in
                guard let timeline = byClient[client], let started = timeline.first(where: { $0.kind == .started }),
                    let connected = timeline.first(where: { $0.kind == .connected })
                else { return nil }
                return (connected.time - started.time) * 1000
            }
        )
        self.countDisconnects(recorded.events)
        if !recorded.windows.isEmpty {
            self.reconnection = Self.reconnection(recorded.windows, events: byClient, clients: clients, scenario: scenario)
        }
        if scenario.observersConnectDirectly {
            self.herd = Self.herd(recorded, clients: scenario.observers)
        }
    }

    /// Counts the disconnections in `events` by reason.
    mutating func countDisconnects(_ events: [ClientEvent]) {
        for event in events {
            if case .disconnected(let heartbeat) = event.kind {
                self.disconnects[heartbeat ? "heartbeat timeout" : "closed or reset", default: 0] += 1
            }
        }
    }

    /// How the observers came back after the first disruption (a gateway restart).
    private static func herd(_ recorded: LabRecorder.State, clients: Int) -> Herd? {
        guard let window = recorded.windows.first else { return nil }
        let observers = recorded.events.filter { $0.client.hasPrefix("o") && $0.time >= window.start }
        let connected = observers.filter { $0.kind == .connected }
        let connects = connected.map(\.time)
        let attempts = observers.filter { $0.kind == .connecting }.map(\.time)
        func buckets(_ times: [Double], from origin: Double) -> [Int] {
            guard let last = times.max(), last >= origin else { return [] }
            var counts = [Int](repeating: 0, count: Int((last - origin) / 0.1) + 1)
            for time in times where time >= origin { counts[Int((time - origin) / 0.1)] += 1 }
            return counts
        }
        let perClient = Dictionary(grouping: connected, by: \.client)
        return Herd(
            clients: clients,
            peakConnectsPerSecond: Double(buckets(connects, from: window.start).max() ?? 0) * 10,
            peakAttemptsPerSecond: Double(buckets(attempts, from: window.start).max() ?? 0) * 10,
            secondsToAllReconnected: perClient.count == clients
                ? perClient.values.compactMap { $0.first?.time }.max()! - window.restored : nil,
            connectsPer100ms: buckets(connects, from: window.restored)
        )
    }

    private static func reconnection(
        _ windows: [DisruptionWindow],
        events: [String: [ClientEvent]],
        clients: [String],
        scenario: Scenario
    ) -> Reconnection {
        var restored: [Double] = []
        var detection: [Double] = []
        var stayed = 0
        var never = 0
        for (index, window) in windows.enumerated() {
            let nextStart = index + 1 < windows.count ? windows[index + 1].start : .infinity
            for client in clients {
                let timeline = events[client] ?? []
                guard let lost = timeline.first(where: { $0.time >= window.start && $0.time < nextStart && $0.kind.isDisconnect })
                else {
                    stayed += 1
                    continue
                }
                if case .blackhole = scenario.disruption, lost.kind == .disconnected(heartbeatTimeout: true) {
                    detection.append(lost.time - window.start)
                }
                guard let back = timeline.first(where: { $0.time > lost.time && $0.kind == .connected }) else {
                    never += 1
                    continue
                }
                restored.append(max(0, back.time - window.restored))
            }
        }
        return Reconnection(
            restoredToConnected: Percentiles(restored),
            signalled: windows.allSatisfy(\.signalled),
            stayedConnected: stayed,
            neverReconnected: never,
            detection: Percentiles(detection)
        )
    }
}

extension ClientEvent.Kind {
    var isDisconnect: Bool {
        if case .disconnected = self { return true }
        return false
    }
}
