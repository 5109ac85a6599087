import Foundation
import Logging
import Tether
import TetherCore
import TetherFaultProxy
import TetherNIO

extension ScenarioRun {
    /// The NAT-timeout experiment: two groups of idle clients in the background mode behind a
    /// NAT (the proxy's NAT timeout), one probing the timeout, one with the default interval
    /// (half the gateway's idle timeout). Measures connections lost, time unreachable, bytes.
    func run(_ nat: Scenario.NATSetup) async throws -> ScenarioResult {
        let gateway = GatewayProcess(
            executable: self.lab.executable,
            port: try await GatewayProcess.freePort(),
            store: "\(self.directory)/gateway.sqlite",
            heartbeat: self.scenario.heartbeatInterval,
            idleTimeout: nat.gatewayIdleTimeout,
            logFile: "\(self.directory)/gateway.log"
        )
        try await gateway.start()
        defer { gateway.kill() }
        let upstream = Endpoint(host: "127.0.0.1", port: gateway.port)
        // One NAT per group, so that each group's unreachable time and bytes are its own.
        var proxies: [TCPFaultProxy] = []
        var endpoints: [Endpoint] = []
        for _ in 0..<2 {
            let proxy = TCPFaultProxy(upstream: upstream)
            proxy.natTimeout = nat.natTimeout
            endpoints.append(Endpoint(host: "127.0.0.1", port: try await proxy.start().port!))
            proxies.append(proxy)
        }
        defer { for proxy in proxies { Task { await proxy.stop() } } }
        let (probingNAT, fixedNAT) = (proxies[0], proxies[1])

        var probing: [(String, TetherClient)] = []
        var fixed: [(String, TetherClient)] = []
        for index in 0..<nat.clientsPerGroup {
            probing.append(("p\(index)", try self.backgroundClient("p\(index)", endpoint: endpoints[0], probing: nat.probing)))
            fixed.append(("f\(index)", try self.backgroundClient("f\(index)", endpoint: endpoints[1], probing: nil)))
        }
        let everyone = probing + fixed
        let probingClients = probing
        self.say(
            "gateway on \(gateway.port) (idle timeout \(nat.gatewayIdleTimeout)), NAT timeout \(nat.natTimeout), "
                + "\(nat.clientsPerGroup) probing + \(nat.clientsPerGroup) fixed clients in the background"
        )

        // When every probing client had settled, and the bytes through their NAT then.
        let settledSample = TetherLock<(time: Double, bytes: Int)?>(nil)
        try await withThrowingTaskGroup(of: Void.self) { group in
            self.run(everyone, in: &group)
            group.addTask {
                // When every probing client has settled, start measuring the settled phase.
                while self.recorder.now() < nat.duration.totalSeconds {
                    if probingClients.allSatisfy({ $0.1.natTimeoutProber?.isSettled("") == true }) {
                        let bytes = probingNAT.forwardedBytes
                        let now = self.recorder.now()
                        settledSample.withLockedValue { $0 = (now, bytes.toUpstream + bytes.toClient) }
                        self.say("every probing client settled: \(Self.intervals(probingClients))")
                        return
                    }
                    try await Task.sleep(for: .milliseconds(200))
                }
            }
            try await self.sleep(until: nat.duration)
            for (_, client) in everyone { client.shutdown() }
            try await group.waitForAll()
        }

        let end = self.recorder.now()
        var result = ScenarioResult(name: self.scenario.name, summary: self.scenario.summary)
        result.seconds = end
        let recorded = self.recorder.snapshot
        func lost(_ group: [(String, TetherClient)], after: Double = 0) -> Int {
            let names = Set(group.map(\.0))
            return recorded.events.filter { names.contains($0.client) && $0.kind.isDisconnect && $0.time >= after }.count
        }
        let clientSeconds = Double(nat.clientsPerGroup) * end
        let fixedBytes = fixedNAT.forwardedBytes
        let sample = settledSample.withLockedValue { $0 }
        let settled = sample?.time
        let probingBytes = probingNAT.forwardedBytes
        result.natTimeout = ScenarioResult.NATTimeout(
            natTimeoutSeconds: nat.natTimeout.totalSeconds,
            fixedIntervalSeconds: nat.gatewayIdleTimeout.totalSeconds / 2,
            probingInitialSeconds: nat.probing.initialInterval.totalSeconds,
            probingStepSeconds: nat.probing.step.totalSeconds,
            learnedSeconds: probing.map { ($0.1.natTimeoutProber?.interval(for: "") ?? .zero).totalSeconds },
            settledAfterSeconds: settled,
            probing: .init(
                clients: nat.clientsPerGroup,
                linksLost: lost(probing),
                linksLostAfterSettled: settled.map { lost(probing, after: $0) },
                unreachableFraction: probingNAT.natUnreachableTime.totalSeconds / clientSeconds,
                bytesPerHourPerClient: sample.map {
                    Double(probingBytes.toUpstream + probingBytes.toClient - $0.bytes) / (end - $0.time) * 3600
                        / Double(nat.clientsPerGroup)
                }
            ),
            fixed: .init(
                clients: nat.clientsPerGroup,
                linksLost: lost(fixed),
                unreachableFraction: fixedNAT.natUnreachableTime.totalSeconds / clientSeconds,
                bytesPerHourPerClient: Double(fixedBytes.toUpstream + fixedBytes.toClient) / end * 3600 / Double(nat.clientsPerGroup)
            )
        )
        result.countDisconnects(recorded.events)
        self.say("probing: \(Self.intervals(probing)); lost \(lost(probing)) vs \(lost(fixed)) connections")
        return result
    }

    private static func intervals(_ clients: [(String, TetherClient)]) -> String {
        let seconds = clients.map { ($0.1.natTimeoutProber?.interval(for: "") ?? .zero).totalSeconds }
        return "intervals " + Set(seconds).sorted().map { String(format: "%.0f s", $0) }.joined(separator: ", ")
    }

    /// An idle client in the background mode, with the default configuration otherwise.
    private func backgroundClient(_ name: String, endpoint: Endpoint, probing: NATTimeoutProber.Configuration?) throws -> TetherClient {
        var configuration = ClientConfiguration(endpoints: [endpoint], clientID: name)
        configuration.heartbeat.natProbing = probing
        var logger = Logger(label: "tether.lab.\(name)")
        logger.logLevel = .critical
        let client = try TetherClient(configuration: configuration, logger: logger)
        client.setHeartbeatMode(.background)
        return client
    }
}
