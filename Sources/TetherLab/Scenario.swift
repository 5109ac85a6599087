public import TetherCore

/// One weak-network condition the lab reproduces, and the traffic it measures under it.
///
/// Every scenario runs a real gateway (a `tether serve` process with its SQLite store) and real
/// clients in the lab's process: alice sends reliable messages to bob at a steady rate and makes
/// one request at a time; carol only keeps her connection alive (heartbeat bytes); observers are
/// more idle clients whose reconnects give the time-to-reconnect samples.
public struct Scenario: Sendable, Hashable {
    /// An event that breaks the path during the run.
    public enum Disruption: Sendable, Hashable {
        /// All packets of the clients' links are dropped for `lasting` (the half-open case: no
        /// RST, no FIN, no path signal), then flow again.
        case blackhole(at: Duration, lasting: Duration)
        /// The current connections go silent for good and the device reports a new network at
        /// once, as when Wi-Fi hands over to cellular.
        case networkSwitch(at: Duration)
        /// The link goes down (packets dropped, the device reports no network) for `down`, then
        /// up for `up`, `cycles` times.
        case flap(at: Duration, up: Duration, down: Duration, cycles: Int)
        /// The gateway process is killed (SIGKILL) and started again `downFor` later on the same
        /// port and store.
        case gatewayRestart(at: Duration, downFor: Duration)
    }

    /// A NAT that forgets idle connections, and two groups of idle background clients behind
    /// it: one with NAT-timeout probing, one with the default fixed interval.
    public struct NATSetup: Sendable, Hashable {
        /// How long the NAT keeps a connection that carries nothing.
        public var natTimeout: Duration
        /// The gateway's idle timeout: background clients ping every half of it by default.
        public var gatewayIdleTimeout: Duration
        /// The probing clients' search.
        public var probing: NATTimeoutProber.Configuration
        /// Clients in each group.
        public var clientsPerGroup: Int
        /// How long the clients run.
        public var duration: Duration
    }

    /// A network that lets only plain HTTP requests through at first: the raw Tether port is
    /// rejected or blackholed and WebSocket upgrades are refused, so clients whose endpoint
    /// list is `[tether://, ws://, http://…/tether/stream]` must fall back to the HTTP stream;
    /// later the raw port opens and they should move back up.
    public struct RestrictedSetup: Sendable, Hashable {
        /// How the network blocks the raw port.
        public enum RawPort: String, Sendable, Hashable, Codable {
            /// Connections are refused (RST): a firewall that rejects.
            case rejected
            /// Connections open and then nothing comes back: a captive portal that swallows them.
            case blackholed
        }

        public var rawPort: RawPort
        /// Idle clients measuring their first request and their move up, besides alice and bob.
        public var clients: Int
        /// When the raw port opens (from the start of the run).
        public var liftAt: Duration
        /// The clients' ``ClientConfiguration/Connection-swift.struct/moveUpInterval``.
        public var moveUpInterval: Duration
    }

    /// Several gateways as the nodes of a cluster on a private PostgreSQL, one of them killed
    /// with SIGKILL mid-run: its clients must come back on the others, and alice's messages to
    /// bob (on different nodes) arrive once each.
    public struct NodeKillSetup: Sendable, Hashable {
        /// Gateway nodes.
        public var nodes: Int
        /// Idle clients, spread over the nodes (each lists every node, its own first).
        public var clients: Int
        /// When the first node is killed (from the start of the run).
        public var killAt: Duration
    }

    /// Subscribers in channels whose links are cut, each once, for a while, as publications go
    /// on: each must end with every publication once and in order, or a gap event exactly
    /// where the channel's history ran out.
    public struct ChannelsSetup: Sendable, Hashable {
        /// Subscribers, spread over the channels.
        public var clients: Int
        public var channels: Int
        /// Publications per second, over all channels.
        public var rate: Int
        /// How long the publisher publishes.
        public var publishing: Duration
        /// The shortest and the longest cut of a subscriber's link.
        public var shortestCut: Duration
        public var longestCut: Duration
        /// The publications each channel keeps (`tether serve --channel-history`).
        public var history: Int
        /// The seed of the cuts' times and lengths.
        public var seed: UInt64
    }

    /// A short identifier, used on the command line and in the report.
    public var name: String
    /// What the scenario reproduces, in a few words.
    public var summary: String
    /// The probability that a packet on the clients' links is dropped (each way), 0 for none.
    public var loss: Double
    /// The one-way delay added by the lab's proxy, each way.
    public var latency: Duration
    /// The largest extra random one-way delay, drawn per chunk (order is kept).
    public var jitter: Duration
    /// What breaks during the run, if anything.
    public var disruption: Disruption?
    /// How long alice sends at the steady rate.
    public var steadyDuration: Duration
    /// Alice's steady sending rate, messages per second.
    public var messageRate: Int
    /// How many messages alice queues at once after the steady phase (0 for none).
    public var backlog: Int
    /// How many idle clients measure reconnection.
    public var observers: Int
    /// The heartbeat interval the gateway announces.
    public var heartbeatInterval: Duration
    /// The NAT-timeout experiment instead of the usual traffic, if set.
    public var nat: NATSetup?
    /// The restrictive-network experiment instead of the usual traffic, if set.
    public var restricted: RestrictedSetup?
    /// The node-kill experiment instead of the usual traffic, if set.
    public var nodeKill: NodeKillSetup?
    /// The channels experiment instead of the usual traffic, if set.
    public var channels: ChannelsSetup?
    /// How the clients reach the gateway: TCP, or WebSocket over TLS (`wss://`) for the
    /// scenarios named `…-wss`.
    public var transport: Endpoint.Transport = .tcp

    /// The same scenario over another transport, named `NAME-SCHEME` (`loss-30-wss`).
    public func over(_ transport: Endpoint.Transport) -> Scenario {
        var scenario = self
        scenario.name = "\(self.name)-\(transport.scheme)"
        scenario.summary = "\(self.summary), over \(transport.scheme)://"
        scenario.transport = transport
        return scenario
    }

    public init(
        name: String,
        summary: String,
        loss: Double = 0,
        latency: Duration = .zero,
        jitter: Duration = .zero,
        disruption: Disruption? = nil,
        steadyDuration: Duration = .seconds(30),
        messageRate: Int = 20,
        backlog: Int = 0,
        observers: Int = 0,
        heartbeatInterval: Duration = .seconds(10),
        nat: NATSetup? = nil,
        restricted: RestrictedSetup? = nil,
        nodeKill: NodeKillSetup? = nil,
        channels: ChannelsSetup? = nil
    ) {
        self.nodeKill = nodeKill
        self.channels = channels
        self.name = name
        self.summary = summary
        self.loss = loss
        self.latency = latency
        self.jitter = jitter
        self.disruption = disruption
        self.steadyDuration = steadyDuration
        self.messageRate = messageRate
        self.backlog = backlog
        self.observers = observers
        self.heartbeatInterval = heartbeatInterval
        self.nat = nat
        self.restricted = restricted
    }

    /// Whether the scenario drops packets with iptables (root and a lab network namespace).
    public var needsPacketFilter: Bool {
        if self.loss > 0 { return true }
        switch self.disruption {
        case .blackhole, .flap: return true
        case .networkSwitch, .gatewayRestart, nil: return false
        }
    }

    /// Whether the observers connect straight to the gateway: a thousand of them would make the
    /// proxy measure itself. Such a run is a herd measurement (``ScenarioResult/herd``).
    var observersConnectDirectly: Bool { self.observers > 100 }

    /// Whether the clients' links go through the lab's userspace proxy.
    var usesProxyImpairment: Bool { self.latency > .zero || self.jitter > .zero }

    /// The scenarios of a full lab run (`quick` shortens them for CI).
    public static func catalog(quick: Bool = false) -> [Scenario] {
        quick ? Self.quickCatalog : Self.fullCatalog
    }

    /// The scenario called `name`, in the full or quick catalog.
    public static func named(_ name: String, quick: Bool = false) -> Scenario? {
        Self.catalog(quick: quick).first { $0.name == name }
    }

    private static var fullCatalog: [Scenario] {
        let catalog = Self.fullTCPCatalog
        return catalog + catalog.filter { ["loss-30", "blackhole"].contains($0.name) }.map { $0.over(.secureWebSocket) }
            + catalog.filter { ["loss-10", "loss-30"].contains($0.name) }.map { $0.over(.httpStream) }
            + Self.restrictedCatalog(clients: 50, heartbeat: .seconds(10), steady: .seconds(30), liftAt: .seconds(15))
            + [
                Scenario(
                    name: "node-kill",
                    summary: "three gateway nodes on PostgreSQL, one killed (SIGKILL) with a third of 1,000 clients on it",
                    steadyDuration: .seconds(30),
                    nodeKill: .init(nodes: 3, clients: 1000, killAt: .seconds(12))
                ),
                Scenario(
                    name: "channels",
                    summary:
                        "200 subscribers in 10 channels, 100 publications/s for 90 s, each subscriber cut once for 1–60 s, 30 % loss; channels keep 300",
                    loss: 0.3,
                    channels: .init(
                        clients: 200,
                        channels: 10,
                        rate: 100,
                        publishing: .seconds(90),
                        shortestCut: .seconds(1),
                        longestCut: .seconds(60),
                        history: 300,
                        seed: 42
                    )
                ),
            ]
    }

    /// The restrictive-network family: the raw port rejected or blackholed, WebSocket upgrades
    /// refused, the HTTP stream open; the raw port opens at `liftAt`.
    private static func restrictedCatalog(clients: Int, heartbeat: Duration, steady: Duration, liftAt: Duration) -> [Scenario] {
        [Scenario.RestrictedSetup.RawPort.rejected, .blackholed].map { rawPort in
            Scenario(
                name: "restricted-\(rawPort.rawValue)",
                summary:
                    "raw port \(rawPort.rawValue), WebSocket upgrades refused, the HTTP stream open; the raw port opens after \(liftAt.totalSeconds.formatted()) s",
                steadyDuration: steady,
                heartbeatInterval: heartbeat,
                restricted: .init(rawPort: rawPort, clients: clients, liftAt: liftAt, moveUpInterval: heartbeat / 2)
            )
        }
    }

    private static var fullTCPCatalog: [Scenario] {
        [
            Scenario(name: "clean", summary: "loopback, no impairment", backlog: 1000, observers: 20),
            Scenario(name: "loss-10", summary: "10 % packet loss each way", loss: 0.1, backlog: 1000),
            Scenario(name: "loss-30", summary: "30 % packet loss each way", loss: 0.3, backlog: 1000),
            Scenario(name: "loss-50", summary: "50 % packet loss each way", loss: 0.5, backlog: 1000),
            Scenario(
                name: "latency",
                summary: "200–800 ms round trip (100 ms + 0–300 ms jitter each way)",
                latency: .milliseconds(100),
                jitter: .milliseconds(300),
                backlog: 1000
            ),
            Scenario(
                name: "blackhole",
                summary: "every packet dropped for 30 s, no signal",
                disruption: .blackhole(at: .seconds(10), lasting: .seconds(30)),
                steadyDuration: .seconds(60),
                observers: 20
            ),
            Scenario(
                name: "switch",
                summary: "network switch: old connections go silent, a new network is reported",
                disruption: .networkSwitch(at: .seconds(10)),
                steadyDuration: .seconds(25),
                observers: 20
            ),
            Scenario(
                name: "flap",
                summary: "link up 5 s / down 3 s, reported by the device, 5 times",
                disruption: .flap(at: .seconds(5), up: .seconds(5), down: .seconds(3), cycles: 5),
                steadyDuration: .seconds(50),
                observers: 20
            ),
            Scenario(
                name: "restart",
                summary: "gateway killed (SIGKILL), back 2 s later",
                disruption: .gatewayRestart(at: .seconds(10), downFor: .seconds(2)),
                steadyDuration: .seconds(30),
                observers: 20
            ),
            Scenario(
                name: "loss-30+latency",
                summary: "30 % loss each way and 300 ms round trip",
                loss: 0.3,
                latency: .milliseconds(150),
                backlog: 1000
            ),
            Scenario(
                name: "nat",
                summary: "a NAT that forgets connections idle 20 s; background clients, probing or not",
                nat: NATSetup(
                    natTimeout: .seconds(20),
                    gatewayIdleTimeout: .seconds(120),
                    probing: try! .init(
                        initialInterval: .seconds(8),
                        step: .seconds(4),
                        minimumInterval: .seconds(4),
                        maximumInterval: .seconds(60)
                    ),
                    clientsPerGroup: 10,
                    duration: .seconds(180)
                )
            ),
            Scenario(
                name: "herd",
                summary: "gateway restart with 1,000 connected clients",
                disruption: .gatewayRestart(at: .seconds(15), downFor: .seconds(2)),
                steadyDuration: .seconds(40),
                observers: 1000
            ),
        ]
    }

    private static var quickCatalog: [Scenario] {
        let catalog = Self.quickTCPCatalog
        return catalog + catalog.filter { ["loss-30", "blackhole"].contains($0.name) }.map { $0.over(.secureWebSocket) }
            + catalog.filter { $0.name == "loss-30" }.map { $0.over(.httpStream) }
            + Self.restrictedCatalog(clients: 10, heartbeat: .seconds(2), steady: .seconds(6), liftAt: .seconds(3))
            + [
                Scenario(
                    name: "channels",
                    summary:
                        "30 subscribers in 3 channels, 30 publications/s for 16 s, each cut once for 1–8 s, 30 % loss; channels keep 60",
                    loss: 0.3,
                    heartbeatInterval: .seconds(2),
                    channels: .init(
                        clients: 30,
                        channels: 3,
                        rate: 30,
                        publishing: .seconds(16),
                        shortestCut: .seconds(1),
                        longestCut: .seconds(8),
                        history: 60,
                        seed: 42
                    )
                )
            ]
    }

    private static var quickTCPCatalog: [Scenario] {
        [
            Scenario(name: "clean", summary: "loopback, no impairment", steadyDuration: .seconds(3), backlog: 300, observers: 5),
            Scenario(name: "loss-30", summary: "30 % packet loss each way", loss: 0.3, steadyDuration: .seconds(4), backlog: 1000),
            Scenario(
                name: "blackhole",
                summary: "every packet dropped for 8 s, no signal (2 s heartbeat)",
                disruption: .blackhole(at: .seconds(2), lasting: .seconds(8)),
                steadyDuration: .seconds(12),
                observers: 10,
                heartbeatInterval: .seconds(2)
            ),
            Scenario(
                name: "switch",
                summary: "network switch: old connections go silent, a new network is reported",
                disruption: .networkSwitch(at: .seconds(2)),
                steadyDuration: .seconds(5),
                observers: 10
            ),
            Scenario(
                name: "herd",
                summary: "gateway restart with 300 connected clients",
                disruption: .gatewayRestart(at: .seconds(3), downFor: .seconds(1)),
                steadyDuration: .seconds(10),
                observers: 300
            ),
        ]
    }
}
