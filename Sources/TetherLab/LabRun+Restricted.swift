import Foundation
import Logging
import NIOCore
import Tether
import TetherCore
import TetherFaultProxy
import TetherNIO

extension ScenarioRun {
    /// The restrictive-network experiment: every client's endpoint list is the raw port, then
    /// WebSocket, then the HTTP stream. The raw port is rejected or blackholed and WebSocket
    /// upgrades are refused (the gateway's HTTP listener answers `404` on the path the list
    /// names, as a proxy that refuses upgrades does), so clients must reach the gateway over
    /// the HTTP stream; at `liftAt` the raw port opens, and they should move back up to it.
    /// Alice sends reliable messages to bob throughout. Measures the time from start to the
    /// first successful request, the time from the lift to being connected on the raw port,
    /// and delivery across the switches.
    func run(_ restricted: Scenario.RestrictedSetup) async throws -> ScenarioResult {
        let scenario = self.scenario
        let rawUpstream = try await GatewayProcess.freePort()
        let httpPort = try await GatewayProcess.freePort()
        let gateway = GatewayProcess(
            executable: self.lab.executable,
            port: rawUpstream,
            store: "\(self.directory)/gateway.sqlite",
            heartbeat: scenario.heartbeatInterval,
            logFile: "\(self.directory)/gateway.log",
            httpPort: httpPort
        )
        try await gateway.start()
        defer { gateway.kill() }

        // The raw port as the clients see it: a proxy to the gateway's that is not listening
        // yet (connections refused) or swallows everything, until the block is lifted.
        let raw = TCPFaultProxy(upstream: Endpoint(host: "127.0.0.1", port: rawUpstream))
        let rawPort: Int
        switch restricted.rawPort {
        case .rejected:
            rawPort = try await GatewayProcess.freePort()
        case .blackholed:
            raw.mode = .blackhole
            rawPort = try await raw.start().port!
        }
        defer { Task { await raw.stop() } }
        let best = Endpoint(host: "127.0.0.1", port: rawPort)
        let endpoints = [
            best,
            Endpoint(host: "127.0.0.1", port: httpPort, transport: .webSocket, path: "/upgrades-refused-here"),
            Endpoint(host: "127.0.0.1", port: httpPort, transport: .httpStream),
        ]

        var clients: [(String, TetherClient)] = [
            ("alice", try self.restrictedClient("alice", endpoints, restricted, outbox: "alice")),
            ("bob", try self.restrictedClient("bob", endpoints, restricted, outbox: "bob")),
        ]
        for index in 0..<restricted.clients {
            clients.append(("o\(index)", try self.restrictedClient("o\(index)", endpoints, restricted, outbox: nil)))
        }
        let (alice, bob) = (clients[0].1, clients[1].1)
        let everyone = clients
        self.say(
            "gateway: raw port \(rawPort) \(restricted.rawPort.rawValue), WebSocket refused, HTTP stream on \(httpPort); "
                + "\(clients.count) clients; the raw port opens at \(restricted.liftAt.totalSeconds) s"
        )

        let firstRequests = TetherLock<[String: Double]>([:])
        let firstTransports = TetherLock<[String: Int]>([:])
        let movedUp = TetherLock<[String: Double]>([:])
        let lifted = TetherLock<Double?>(nil)
        try await withThrowingTaskGroup(of: Void.self) { group in
            self.run(everyone, in: &group)
            group.addTask { await self.recordDeliveries(to: bob) }
            // Each client's first successful request, from its start, and where it connected.
            for (name, client) in everyone {
                group.addTask {
                    let started = self.recorder.now()
                    while !Task.isCancelled, self.recorder.now() < scenario.steadyDuration.totalSeconds {
                        do {
                            _ = try await client.request("echo", body: Self.requestBody, timeout: .seconds(10))
                            let elapsed = self.recorder.now() - started
                            self.recorder.request(started: started, latency: elapsed)
                            firstRequests.withLockedValue { $0[name] = elapsed }
                            if case .connected(let endpoint) = client.connectionState {
                                firstTransports.withLockedValue { $0[endpoint.transport.scheme, default: 0] += 1 }
                            }
                            return
                        } catch {
                            try? await Task.sleep(for: .milliseconds(50))
                        }
                    }
                }
            }
            // The block is lifted; then each client's move back up to the raw port.
            group.addTask {
                try await self.sleep(until: restricted.liftAt)
                switch restricted.rawPort {
                case .rejected: _ = try await raw.start(port: rawPort)
                case .blackholed: raw.mode = .forward
                }
                let liftTime = self.recorder.now()
                lifted.withLockedValue { $0 = liftTime }
                self.recorder.window(DisruptionWindow(start: 0, restored: liftTime, signalled: false))
                self.say("the raw port opens")
                await self.waitUntil(seconds: scenario.steadyDuration.totalSeconds - liftTime + 30) {
                    for (name, client) in everyone where movedUp.withLockedValue({ $0[name] }) == nil {
                        if client.connectionState == .connected(best) {
                            let now = self.recorder.now()
                            movedUp.withLockedValue { $0[name] = now - liftTime }
                        }
                    }
                    return movedUp.withLockedValue { $0.count } == everyone.count
                }
                self.say("\(movedUp.withLockedValue { $0.count }) of \(everyone.count) clients back on the raw port")
            }

            // Alice's messages to bob, through the fallback and the switch.
            let count = try await self.sendSteadily(alice, for: scenario.steadyDuration.totalSeconds)
            self.say("steady phase over: \(count) messages sent")
            await self.waitUntil(seconds: 120) { self.recorder.allDelivered }
            self.say(self.recorder.allDelivered ? "all delivered" : "gave up waiting: not all delivered")
            await self.waitUntil(seconds: 60) { movedUp.withLockedValue { $0.count } == everyone.count }
            for (_, client) in everyone { client.shutdown() }
            try await group.waitForAll()
        }

        var result = ScenarioResult(name: scenario.name, summary: scenario.summary)
        result.seconds = self.recorder.now()
        result.analyze(self.recorder.snapshot, clients: clients.map(\.0), scenario: scenario)
        result.reconnection = nil  // the lift is not a loss of connection
        let firsts = firstRequests.withLockedValue { $0 }
        let moved = movedUp.withLockedValue { $0 }
        result.restricted = ScenarioResult.Restricted(
            rawPort: restricted.rawPort.rawValue,
            clients: clients.count,
            firstRequest: Percentiles(Array(firsts.values)),
            noFirstRequest: clients.count - firsts.count,
            firstTransports: firstTransports.withLockedValue { $0 },
            liftedAtSeconds: lifted.withLockedValue { $0 },
            heartbeatIntervalSeconds: scenario.heartbeatInterval.totalSeconds,
            moveUpIntervalSeconds: restricted.moveUpInterval.totalSeconds,
            movedUp: Percentiles(Array(moved.values)),
            neverMovedUp: clients.count - moved.count
        )
        self.say(
            String(
                format: "first request p90 %.2f s; moved up p90 %.2f s after the lift",
                result.restricted?.firstRequest?.p90 ?? -1,
                result.restricted?.movedUp?.p90 ?? -1
            )
        )
        return result
    }

    /// A client with the restrictive network's endpoint list and the defaults otherwise.
    private func restrictedClient(
        _ name: String,
        _ endpoints: [Endpoint],
        _ restricted: Scenario.RestrictedSetup,
        outbox: String?
    ) throws -> TetherClient {
        var configuration = ClientConfiguration(endpoints: endpoints, clientID: name)
        configuration.connection.moveUpInterval = restricted.moveUpInterval
        if let outbox {
            configuration.reliability = try .init(outbox: try SQLiteOutboxStore(path: "\(self.directory)/\(outbox).sqlite"))
        }
        var logger = Logger(label: "tether.lab.\(name)")
        logger.logLevel = .critical
        return try TetherClient(configuration: configuration, logger: logger)
    }
}
