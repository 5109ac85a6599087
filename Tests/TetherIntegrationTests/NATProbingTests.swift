import NIOCore
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherTestSupport
import TetherTesting

extension IntegrationTests {
    /// NAT-timeout probing against a proxy that forgets idle connections, as a NAT does.
    @Suite("NAT-timeout probing", .timeLimit(.minutes(2)))
    struct NATProbingTests {
        /// A gateway with the idle timeout `idle` behind a NAT that forgets connections idle 1.5 s.
        static func gatewayBehindNAT(_ harness: Harness, idle: Duration) async throws -> (Gateway, TCPFaultProxy, Endpoint) {
            let (gateway, endpoint) = try await harness.gateway(
                configure: { configuration in
                    configuration.timeouts.heartbeatInterval = .milliseconds(200)
                    configuration.timeouts.idle = idle  // background pings are half of it apart
                },
                routes: { gateway in gateway.handle("echo") { request, _ in request.body } }
            )
            let nat = TCPFaultProxy(upstream: endpoint)
            nat.natTimeout = .milliseconds(1500)
            let address = try await nat.start()
            harness.onExit { Task { await nat.stop() } }
            return (gateway, nat, Endpoint(host: "127.0.0.1", port: address.port!))
        }

        @Test("in the background, the client learns how long the NAT keeps an idle connection, then stops losing it")
        func learnsTheNATTimeout() async throws {
            try await withHarness { harness in
                let (_, nat, endpoint) = try await Self.gatewayBehindNAT(harness, idle: .seconds(10))
                let path = ManualNetworkPathMonitor(initial: NetworkPath(isAvailable: true, identity: "wifi"))
                let client = try harness.client([endpoint]) { configuration in
                    configuration.pathMonitor = path
                    configuration.heartbeat.timeout = .milliseconds(500)
                    configuration.heartbeat.natProbing = try! .init(
                        initialInterval: .milliseconds(400),
                        step: .milliseconds(400),
                        minimumInterval: .milliseconds(200),
                        maximumInterval: .seconds(5)
                    )
                }
                client.setHeartbeatMode(.background)
                let events = harness.events(of: client)
                try await eventually("connected") { events.connects == 1 }

                // 0.4, 0.8 and 1.2 s of silence are kept; 1.6 s is not, twice: back to 10 % below 1.2 s.
                try await eventually("the prober settles", timeout: .seconds(30)) {
                    client.natTimeoutProber?.isSettled("wifi") == true
                }
                #expect(client.natTimeoutProber?.interval(for: "wifi") == .milliseconds(1080))
                #expect(client.natTimeoutProber?.networks["wifi"]?.failedAt == .milliseconds(1600))
                // The prober hears of the second failure just before the client reports the disconnection.
                try await eventually("the second lost connection is reported") { events.disconnectReasons.count >= 2 }
                let lost = events.disconnectReasons
                #expect(lost.count == 2, "\(lost)")
                #expect(lost.allSatisfy { if case .heartbeatTimeout = $0 { true } else { false } }, "\(lost)")
                #expect(nat.natExpiredConnections == 2)

                // Settled: the connection now survives idle periods, and still works.
                try await eventually("connected again") { events.connects == 3 }
                try await Task.sleep(for: .seconds(4))
                #expect(events.disconnectReasons.count == 2, "no connection lost at the learned interval")
                #expect(nat.natExpiredConnections == 2)
                #expect(try await client.request("echo", body: ByteBuffer(string: "still here")).string == "still here")

                // Another network: learned from the start; what was learned on Wi-Fi stays.
                path.set(NetworkPath(isAvailable: true, identity: "cellular"))
                try await eventually("connected on the new network") { events.connects == 4 }
                try await eventually("cellular is probed from the initial interval") {
                    client.natTimeoutProber?.interval(for: "cellular") == .milliseconds(800)
                }
                #expect(client.natTimeoutProber?.interval(for: "wifi") == .milliseconds(1080))
            }
        }

        @Test("without probing, a background interval longer than the NAT timeout loses the connection every time")
        func fixedIntervalKeepsDying() async throws {
            try await withHarness { harness in
                let (_, nat, endpoint) = try await Self.gatewayBehindNAT(harness, idle: .seconds(4))
                let client = try harness.client([endpoint]) { configuration in
                    configuration.heartbeat.timeout = .milliseconds(500)
                    configuration.heartbeat.jitter = 0
                }
                client.setHeartbeatMode(.background)
                let events = harness.events(of: client)
                try await eventually("the connection is lost twice", timeout: .seconds(15)) { events.disconnectReasons.count >= 2 }
                #expect(nat.natExpiredConnections >= 2)
                #expect(client.natTimeoutProber == nil)
            }
        }
    }
}
