import Foundation
import Logging
import NIOCore
import Tether
import TetherCore
import TetherFaultProxy
import TetherNIO
import TetherPostgres

/// Runs lab scenarios against a real gateway process and real clients.
///
/// ```swift
/// let lab = Lab(executable: "/usr/local/bin/tether", directory: "/tmp/lab", packetFilter: try PacketFilter())
/// let result = try await lab.run(Scenario.named("loss-30")!)
/// ```
public struct Lab: Sendable {
    /// The `tether` executable, started as `tether serve` for the gateway.
    public var executable: String
    /// Where stores, outboxes and logs go (one directory per scenario).
    public var directory: String
    /// Drops packets, or `nil` where the machine cannot (those scenarios are skipped).
    public var packetFilter: PacketFilter?
    /// Why there is no packet filter, for the skipped scenarios.
    public var packetFilterUnavailable: String?
    /// Progress lines.
    public var progress: @Sendable (String) -> Void

    public init(
        executable: String,
        directory: String,
        packetFilter: PacketFilter?,
        packetFilterUnavailable: String? = nil,
        progress: @escaping @Sendable (String) -> Void = { print($0) }
    ) {
        self.executable = executable
        self.directory = directory
        self.packetFilter = packetFilter
        self.packetFilterUnavailable = packetFilterUnavailable
        self.progress = progress
    }

    /// Runs one scenario and returns what it measured (or why it was skipped).
    public func run(_ scenario: Scenario) async throws -> ScenarioResult {
        if scenario.needsPacketFilter && self.packetFilter == nil {
            let reason = self.packetFilterUnavailable ?? "no packet filter"
            self.progress("\(scenario.name): skipped: \(reason)")
            return ScenarioResult(name: scenario.name, summary: scenario.summary, skipped: reason)
        }
        let directory = "\(self.directory)/\(scenario.name)"
        try? FileManager.default.removeItem(atPath: directory)
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let run = ScenarioRun(scenario: scenario, lab: self, directory: directory)
        defer { try? self.packetFilter?.clear() }
        if let nat = scenario.nat { return try await run.run(nat) }
        if let restricted = scenario.restricted { return try await run.run(restricted) }
        if let nodeKill = scenario.nodeKill {
            guard LocalPostgres.isInstalled else {
                let reason = "PostgreSQL's server is not installed (apt-get install postgresql)"
                self.progress("\(scenario.name): skipped: \(reason)")
                return ScenarioResult(name: scenario.name, summary: scenario.summary, skipped: reason)
            }
            return try await run.run(nodeKill)
        }
        if let channels = scenario.channels { return try await run.run(channels) }
        return try await run.run()
    }
}

/// One run of one scenario.
struct ScenarioRun: Sendable {
    static let requestBody = ByteBuffer(repeating: UInt8(ascii: "r"), count: 32)

    let scenario: Scenario
    let lab: Lab
    let directory: String
    let recorder = LabRecorder()

    func say(_ text: String) {
        self.lab.progress(String(format: "%@ [%6.2fs] %@", self.scenario.name, self.recorder.now(), text))
    }

    func run() async throws -> ScenarioResult {
        let scenario = self.scenario
        let certificate = scenario.transport.isSecure ? try LabCertificate(in: self.directory) : nil
        let gateway = GatewayProcess(
            executable: self.lab.executable,
            port: try await GatewayProcess.freePort(),
            store: "\(self.directory)/gateway.sqlite",
            heartbeat: scenario.heartbeatInterval,
            logFile: "\(self.directory)/gateway.log",
            transport: scenario.transport,
            certificate: certificate,
            adminPort: try await GatewayProcess.freePort()
        )
        try await gateway.start()
        defer { gateway.kill() }
        let upstream = Endpoint(host: "127.0.0.1", port: gateway.port, transport: scenario.transport)
        let transport = try TCPClientTransport(tls: .init(trustRoots: certificate.map { .only(.file($0.certificate)) } ?? .system))
        let impairment = try TCPFaultProxy.Impairment(latency: scenario.latency, jitter: scenario.jitter)

        // Each client's link is a proxy: it counts bytes, adds delay, and can go silent.
        let observersDirect = scenario.observersConnectDirectly
        var proxies: [String: TCPFaultProxy] = [:]
        var endpoints: [String: Endpoint] = [:]
        for link in ["alice", "bob", "carol"] + (observersDirect || scenario.observers == 0 ? [] : ["observers"]) {
            let proxy = TCPFaultProxy(upstream: upstream)
            proxy.impairment = impairment
            endpoints[link] = Endpoint(host: "127.0.0.1", port: try await proxy.start().port!, transport: scenario.transport)
            proxies[link] = proxy
        }
        endpoints["observers"] = endpoints["observers"] ?? upstream
        let clientPorts = proxies.keys.sorted().map { endpoints[$0]!.port }
        defer { for proxy in proxies.values { Task { await proxy.stop() } } }
        if scenario.loss > 0 { try self.lab.packetFilter?.drop(probability: scenario.loss, ports: clientPorts) }

        let path = ManualNetworkPathMonitor()
        let alice = try self.client("alice", endpoint: endpoints["alice"]!, path: path, outbox: "alice", transport: transport)
        let bob = try self.client("bob", endpoint: endpoints["bob"]!, path: path, outbox: "bob", transport: transport)
        let carol = try self.client("carol", endpoint: endpoints["carol"]!, path: path, outbox: nil, transport: transport)
        var clients: [(String, TetherClient)] = [("alice", alice), ("bob", bob), ("carol", carol)]
        for index in 0..<scenario.observers {
            clients.append(
                (
                    "o\(index)",
                    try self.client("o\(index)", endpoint: endpoints["observers"]!, path: path, outbox: nil, transport: transport)
                )
            )
        }
        self.say(
            "gateway on \(gateway.port), \(clients.count) clients"
                + (scenario.loss > 0
                    ? String(format: ", dropping %.0f %% of packets on ports %@", scenario.loss * 100, "\(clientPorts)") : "")
        )

        let links = proxies
        let allProxies = Array(proxies.values)
        let everyone = clients
        var result = ScenarioResult(name: scenario.name, summary: scenario.summary)
        let ttlProbe = TetherLock<String?>(nil)  // set by the blackhole scenario
        try await withThrowingTaskGroup(of: Void.self) { group in
            self.run(everyone, in: &group)
            group.addTask { await self.recordDeliveries(to: bob) }
            group.addTask {
                try await self.disrupt(gateway: gateway, proxies: allProxies, ports: clientPorts, path: path, alice: alice, ttl: ttlProbe)
            }
            let steadyEnd = scenario.steadyDuration.totalSeconds
            group.addTask { await self.requests(alice, until: steadyEnd) }
            // Carol does nothing but keep her connection alive: her bytes are the heartbeat's.
            let idleStart = TetherLock<(time: Double, bytes: Int)?>(nil)
            if scenario.loss == 0, scenario.disruption == nil {
                group.addTask {
                    await self.waitUntil(seconds: 10) { if case .connected = carol.connectionState { true } else { false } }
                    try? await Task.sleep(for: .seconds(1))
                    let bytes = links["carol"]!.forwardedBytes
                    let sample = (time: self.recorder.now(), bytes: bytes.toUpstream + bytes.toClient)
                    idleStart.withLockedValue { $0 = sample }
                }
            }

            // The steady phase.
            let count = try await self.sendSteadily(alice, for: steadyEnd)
            if let (time, bytes) = idleStart.withLockedValue({ $0 }) {
                let now = links["carol"]!.forwardedBytes
                result.heartbeatBytesPerHour = Double(now.toUpstream + now.toClient - bytes) / (self.recorder.now() - time) * 3600
            }
            self.say("steady phase over: \(count) messages sent")

            if scenario.backlog > 0 {
                await self.waitUntil(seconds: 60) { self.recorder.allDelivered }
                let before = (links["alice"]!.forwardedBytes, links["bob"]!.forwardedBytes)
                self.say("backlog: \(scenario.backlog) messages at once")
                for _ in 0..<scenario.backlog { try await self.send(alice, backlog: true) }
                await self.waitUntil(seconds: 180) { self.recorder.allDelivered }
                let after = (links["alice"]!.forwardedBytes, links["bob"]!.forwardedBytes)
                let wire =
                    (after.0.toUpstream + after.0.toClient + after.1.toUpstream + after.1.toClient)
                    - (before.0.toUpstream + before.0.toClient + before.1.toUpstream + before.1.toClient)
                let bodies = (count..<(count + scenario.backlog)).reduce(0) { $0 + "\($1)".utf8.count }
                result.overheadBytesPerMessage = Double(wire - bodies) / Double(scenario.backlog)
            }
            await self.waitUntil(seconds: 180) { self.recorder.allDelivered }
            self.say(self.recorder.allDelivered ? "all delivered" : "gave up waiting: not all delivered")
            // None may fail for good: wait for every client to be connected again.
            await self.waitUntil(seconds: 60) {
                everyone.allSatisfy { if case .connected = $0.1.connectionState { true } else { false } }
            }
            let connected = everyone.filter { if case .connected = $0.1.connectionState { true } else { false } }.count
            do {
                result.gateway = try await self.gatewayView(gateway, clients: connected)
            } catch {
                self.say("could not read the gateway's metrics: \(error)")
            }
            for (_, client) in everyone { client.shutdown() }
            try await group.waitForAll()
        }
        result.seconds = self.recorder.now()
        result.ttlProbe = ttlProbe.withLockedValue { $0 }
        result.analyze(self.recorder.snapshot, clients: clients.map(\.0), scenario: scenario)
        return result
    }

    func client(
        _ name: String,
        endpoint: Endpoint,
        path: ManualNetworkPathMonitor,
        outbox: String?,
        transport: TCPClientTransport
    ) throws -> TetherClient {
        // The defaults a user gets, plus the device's network path.
        var configuration = ClientConfiguration(endpoints: [endpoint], clientID: name)
        configuration.pathMonitor = path
        if let outbox {
            configuration.reliability = try .init(outbox: try SQLiteOutboxStore(path: "\(self.directory)/\(outbox).sqlite"))
        }
        var logger = Logger(label: "tether.lab.\(name)")
        logger.logLevel = .critical
        return try TetherClient(configuration: configuration, transport: transport, logger: logger)
    }

    /// Alice's steady phase: the scenario's message rate for `seconds` from the start.
    /// - Returns: How many messages she sent.
    func sendSteadily(_ alice: TetherClient, for seconds: Double) async throws -> Int {
        let count = self.scenario.messageRate * Int(seconds)
        for index in 0..<count {
            let due = Double(index) / Double(self.scenario.messageRate)
            let wait = due - self.recorder.now()
            if wait > 0 { try await Task.sleep(for: .milliseconds(Int(wait * 1000))) }
            try await self.send(alice, backlog: false)
        }
        return count
    }

    /// Records each message bob's app is given, until his client stops.
    func recordDeliveries(to bob: TetherClient) async {
        do {
            for try await delivery in bob.deliveries() {
                guard let number = Int(String(buffer: delivery.body)) else { continue }
                self.recorder.delivered(number)
            }
        } catch {}
    }

    func send(_ alice: TetherClient, backlog: Bool) async throws {
        let number = self.recorder.accepted(backlog: backlog)
        _ = try await alice.send("dm", body: ByteBuffer(string: "\(number)"), conversation: "bob")
    }

    /// Runs each client, and records its connection events, in `group`.
    func run(_ clients: [(String, TetherClient)], in group: inout ThrowingTaskGroup<Void, any Error>) {
        for (name, client) in clients {
            let events = client.events
            group.addTask { await self.record(events, of: name) }
            group.addTask {
                self.recorder.event(name, .started)
                do { try await client.run() } catch { self.say("\(name) stopped: \(error)") }
            }
        }
    }

    private func record(_ events: AsyncStream<ConnectionEvent>, of client: String) async {
        for await event in events {
            switch event {
            case .connecting: self.recorder.event(client, .connecting)
            case .connected: self.recorder.event(client, .connected)
            case .disconnected(.shutdown): break  // the end of the run
            case .disconnected(.heartbeatTimeout): self.recorder.event(client, .disconnected(heartbeatTimeout: true))
            case .disconnected: self.recorder.event(client, .disconnected(heartbeatTimeout: false))
            default: break
            }
        }
    }

    /// One echo request at a time, five per second, until `end`.
    private func requests(_ alice: TetherClient, until end: Double) async {
        while self.recorder.now() < end, !Task.isCancelled {
            let started = self.recorder.now()
            do {
                _ = try await alice.request("echo", body: Self.requestBody, timeout: .seconds(10))
                self.recorder.request(started: started, latency: self.recorder.now() - started)
            } catch {
                self.recorder.request(started: started, latency: nil)
            }
            try? await Task.sleep(for: .milliseconds(200))
        }
    }

    /// Breaks the path as the scenario says, recording when it broke and came back.
    private func disrupt(
        gateway: GatewayProcess,
        proxies: [TCPFaultProxy],
        ports: [Int],
        path: ManualNetworkPathMonitor,
        alice: TetherClient,
        ttl: TetherLock<String?>
    ) async throws {
        switch self.scenario.disruption {
        case nil:
            return
        case .blackhole(let at, let lasting):
            try await self.sleep(until: at)
            try self.lab.packetFilter!.drop(probability: 1, ports: ports)
            let start = self.recorder.now()
            self.say("blackhole: dropping every packet of the clients' links")
            // A message that cannot make its TTL must fail visibly.
            let receipt = try await alice.send("dm", body: ByteBuffer(string: "ttl-probe"), conversation: "carol", ttl: .seconds(5))
            try await Task.sleep(for: lasting)
            try self.lab.packetFilter!.clear()
            self.recorder.window(DisruptionWindow(start: start, restored: self.recorder.now(), signalled: false))
            self.say("blackhole lifted")
            let outcome = (await alice.outcome(of: receipt)).map { "\($0)" } ?? "unknown"
            ttl.withLockedValue { $0 = outcome }

        case .networkSwitch(let at):
            try await self.sleep(until: at)
            for proxy in proxies { proxy.abandonAll() }
            path.set(NetworkPath(isAvailable: true, identity: "cellular"))
            let now = self.recorder.now()
            self.recorder.window(DisruptionWindow(start: now, restored: now, signalled: true))
            self.say("network switch: old connections silent, the device reports a new network")

        case .flap(let at, let up, let down, let cycles):
            try await self.sleep(until: at)
            for _ in 0..<cycles {
                try self.lab.packetFilter!.drop(probability: 1, ports: ports)
                path.set(.unavailable)
                let start = self.recorder.now()
                try await Task.sleep(for: down)
                try self.lab.packetFilter!.clear()
                path.set(NetworkPath(isAvailable: true, identity: "wifi"))
                self.recorder.window(DisruptionWindow(start: start, restored: self.recorder.now(), signalled: true))
                try await Task.sleep(for: up)
            }
            self.say("flapping over")

        case .gatewayRestart(let at, let downFor):
            try await self.sleep(until: at)
            let start = self.recorder.now()
            gateway.kill()
            self.say("gateway killed")
            try await Task.sleep(for: downFor)
            try await gateway.start()
            self.recorder.window(DisruptionWindow(start: start, restored: self.recorder.now(), signalled: false))
            self.say("gateway back")
        }
    }

    func sleep(until offset: Duration) async throws {
        let wait = offset.totalSeconds - self.recorder.now()
        if wait > 0 { try await Task.sleep(for: .milliseconds(Int(wait * 1000))) }
    }

    func waitUntil(seconds: Double, _ condition: () -> Bool) async {
        let deadline = self.recorder.now() + seconds
        while !condition(), self.recorder.now() < deadline {
            try? await Task.sleep(for: .milliseconds(20))
        }
    }
}

extension ScenarioRun {
    /// What the gateway counted itself. Its connections count is read until it equals the
    /// lab's for up to 2 s (a closed connection is counted when the gateway sees it close).
    func gatewayView(_ gateway: GatewayProcess, clients: Int) async throws -> ScenarioResult.GatewayView {
        // The lab's counts first: the gateway counts an answer before it sends it, so a request
        // answered while the metrics are read is in the gateway's count, never only in the lab's.
        let accepted = self.recorder.acceptedCount
        let succeeded = self.recorder.requestsSucceeded
        var samples = try await gateway.metrics()
        let deadline = ContinuousClock.now + .seconds(2)
        while Int(samples.total("tether_connections_open")) != clients, ContinuousClock.now < deadline {
            try await Task.sleep(for: .milliseconds(50))
            samples = try await gateway.metrics()
        }
        func total(_ name: String) -> Int { Int(samples.total(name)) }
        var view = ScenarioResult.GatewayView(
            restarted: gateway.starts > 1,
            connectionsOpen: total("tether_connections_open"),
            clients: clients,
            handshakes: Int(samples[#"tether_handshakes_total{result="ok"}"#] ?? 0),
            echoAnswered: Int(samples[#"tether_requests_total{method="echo",status="ok"}"#] ?? 0),
            messagesProcessed: total("tether_reliable_messages_processed_total"),
            duplicatesDropped: total("tether_reliable_duplicates_total"),
            deliveriesSent: total("tether_reliable_deliveries_sent_total"),
            deliveriesAcknowledged: total("tether_reliable_deliveries_acknowledged_total"),
            disagreements: []
        )
        if view.connectionsOpen != clients {
            view.disagreements.append("the gateway holds \(view.connectionsOpen) connections, the lab has \(clients) clients connected")
        }
        if !view.restarted {
            if view.messagesProcessed != accepted {
                view.disagreements.append("the gateway processed \(view.messagesProcessed) messages, alice sent \(accepted)")
            }
            if view.echoAnswered < succeeded {
                view.disagreements.append("the gateway answered \(view.echoAnswered) echo requests, alice got \(succeeded) answers")
            }
        }
        return view
    }
}
