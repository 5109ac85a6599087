import Foundation
import Logging
import NIOCore
import Tether
import TetherCore
import TetherNIO
import TetherPostgres

extension ScenarioRun {
    /// The node-kill experiment: a private PostgreSQL, `nodes` `tether serve --postgres`
    /// processes, and clients spread over them, each listing every node with its own first.
    /// Alice (on the first node) sends reliable messages to bob (on the second) throughout; at
    /// `killAt` the first node is killed with SIGKILL. Measures how long each client of the
    /// killed node takes to be connected to another, and delivery across the kill.
    func run(_ setup: Scenario.NodeKillSetup) async throws -> ScenarioResult {
        let scenario = self.scenario
        let postgres = try LocalPostgres(
            directory: URL(fileURLWithPath: "\(self.directory)/postgres"),
            port: try await GatewayProcess.freePort()
        )
        try postgres.start()
        defer { postgres.destroy() }
        let url = postgres.url + "?sslmode=disable"
        var nodes: [GatewayProcess] = []
        for index in 0..<max(2, setup.nodes) {
            let node = GatewayProcess(
                executable: self.lab.executable,
                port: try await GatewayProcess.freePort(),
                store: "",
                heartbeat: scenario.heartbeatInterval,
                logFile: "\(self.directory)/node-\(index + 1).log",
                postgres: (url, "node-\(index + 1)")
            )
            try await node.start()
            nodes.append(node)
        }
        defer { for node in nodes { node.kill() } }
        let endpoints = nodes.map { Endpoint(host: "127.0.0.1", port: $0.port) }
        /// Every node, starting with the `first`-th.
        func rotated(_ first: Int) -> [Endpoint] { (0..<endpoints.count).map { endpoints[(first + $0) % endpoints.count] } }

        var clients: [(String, TetherClient)] = [
            ("alice", try self.clusterClient("alice", rotated(0), outbox: "alice")),
            ("bob", try self.clusterClient("bob", rotated(1), outbox: "bob")),
        ]
        for index in 0..<setup.clients {
            clients.append(("o\(index)", try self.clusterClient("o\(index)", rotated(index % endpoints.count), outbox: nil)))
        }
        let (alice, bob) = (clients[0].1, clients[1].1)
        let everyone = clients
        self.say("\(nodes.count) nodes on PostgreSQL, \(clients.count) clients; node-1 is killed at \(setup.killAt.totalSeconds) s")

        let killed = endpoints[0]
        let first = nodes[0]
        let affected = TetherLock<Set<String>>([])
        let back = TetherLock<[String: Double]>([:])
        let killedAt = TetherLock<Double?>(nil)
        try await withThrowingTaskGroup(of: Void.self) { group in
            self.run(everyone, in: &group)
            group.addTask { await self.recordDeliveries(to: bob) }
            group.addTask {
                try await self.sleep(until: setup.killAt)
                let onKilled = Set(everyone.filter { $0.1.connectionState == .connected(killed) }.map(\.0))
                affected.withLockedValue { $0 = onKilled }
                first.kill()
                let time = self.recorder.now()
                killedAt.withLockedValue { $0 = time }
                self.recorder.window(DisruptionWindow(start: time, restored: time, signalled: false))
                self.say("node-1 killed with \(onKilled.count) clients on it")
                await self.waitUntil(seconds: 60) {
                    for (name, client) in everyone where onKilled.contains(name) && back.withLockedValue({ $0[name] }) == nil {
                        if case .connected(let endpoint) = client.connectionState, endpoint != killed {
                            let now = self.recorder.now()
                            back.withLockedValue { $0[name] = now - time }
                        }
                    }
                    return back.withLockedValue { $0.count } == onKilled.count
                }
                self.say("\(back.withLockedValue { $0.count }) of \(onKilled.count) clients back on another node")
            }
            let count = try await self.sendSteadily(alice, for: scenario.steadyDuration.totalSeconds)
            self.say("steady phase over: \(count) messages sent")
            await self.waitUntil(seconds: 120) { self.recorder.allDelivered }
            self.say(self.recorder.allDelivered ? "all delivered" : "gave up waiting: not all delivered")
            await self.waitUntil(seconds: 60) {
                killedAt.withLockedValue { $0 } != nil && back.withLockedValue { $0.count } == affected.withLockedValue { $0.count }
            }
            for (_, client) in everyone { client.shutdown() }
            try await group.waitForAll()
        }

        var result = ScenarioResult(name: scenario.name, summary: scenario.summary)
        result.seconds = self.recorder.now()
        result.analyze(self.recorder.snapshot, clients: clients.map(\.0), scenario: scenario)
        let samples = back.withLockedValue { $0 }
        let hit = affected.withLockedValue { $0 }
        result.nodeKill = ScenarioResult.NodeKill(
            nodes: nodes.count,
            clients: clients.count,
            killedAtSeconds: killedAt.withLockedValue { $0 } ?? -1,
            affected: hit.count,
            back: Percentiles(Array(samples.values)),
            neverBack: hit.count - samples.count
        )
        self.say(
            String(
                format: "%d clients on the killed node: back on another node p50 %.2f s, p95 %.2f s, max %.2f s",
                hit.count,
                result.nodeKill?.back?.p50 ?? -1,
                result.nodeKill?.back?.p95 ?? -1,
                result.nodeKill?.back?.max ?? -1
            )
        )
        return result
    }

    /// A client of the cluster with the defaults otherwise.
    private func clusterClient(_ name: String, _ endpoints: [Endpoint], outbox: String?) throws -> TetherClient {
        var configuration = ClientConfiguration(endpoints: endpoints, clientID: name)
        if let outbox {
            configuration.reliability = try .init(outbox: try SQLiteOutboxStore(path: "\(self.directory)/\(outbox).sqlite"))
        }
        var logger = Logger(label: "tether.lab.\(name)")
        logger.logLevel = .critical
        return try TetherClient(configuration: configuration, logger: logger)
    }
}
