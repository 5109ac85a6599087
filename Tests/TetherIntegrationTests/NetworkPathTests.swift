import NIOCore
import Testing
import Tether
import TetherCore
import TetherGatewayTesting
import TetherTestSupport

@Suite("Network path monitors")
struct NetworkPathMonitorTests {
    @Test("the polling monitor reads the interfaces: loopback counts only when asked")
    func polling() async throws {
        let withLoopback = PollingNetworkPathMonitor.currentPath(includeLoopback: true)
        #expect(withLoopback.isAvailable)
        #expect(withLoopback.identity.contains("lo=127.0.0.1"))
        let without = PollingNetworkPathMonitor.currentPath()
        #expect(!without.identity.contains("lo="))
        var paths = PollingNetworkPathMonitor(interval: .milliseconds(50), includeLoopback: true).paths().makeAsyncIterator()
        #expect(await paths.next() == withLoopback, "the current path comes first")
    }
}

extension IntegrationTests {
    @Suite("Network path", .timeLimit(.minutes(1)))
    struct NetworkPathTests {
        /// A connected client, on an in-process network, with a manual path monitor and a
        /// backoff far longer than the tests wait: only a path report can explain a prompt reconnect.
        struct Setup {
            var network: LocalNetwork
            var endpoint: Endpoint
            var paths: ManualNetworkPathMonitor
            var client: TetherClient
            var events: EventRecorder
        }

        func connectedClient(_ harness: Harness) async throws -> Setup {
            let network = LocalNetwork()
            let endpoint = Endpoint(host: "gateway", port: 1)
            _ = try harness.localGateway(
                network: network,
                at: endpoint,
                routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                }
            )
            let paths = ManualNetworkPathMonitor()
            let client = try harness.client([endpoint], transport: network.transport) {
                $0.reconnect.backoff = try! Backoff(initial: .seconds(60), maximum: .seconds(60), jitter: 0)
                $0.reconnect.stableAfter = .seconds(3_600)
                $0.pathMonitor = paths
            }
            let events = harness.events(of: client)
            try await eventually("connected") { events.connects == 1 }
            return Setup(network: network, endpoint: endpoint, paths: paths, client: client, events: events)
        }

        @Test("no network: the client waits for one without attempts, then reconnects at once when it is back")
        func waitsThenReconnects() async throws {
            try await withHarness { harness in
                let setup = try await self.connectedClient(harness)
                let (network, paths, client, events) = (setup.network, setup.paths, setup.client, setup.events)

                paths.set(.unavailable)  // airplane mode: the connection drops, nothing answers
                network.faults.refuse(setup.endpoint)
                network.faults.dropConnections()
                try await eventually("the client waits for a network") {
                    events.all.contains { if case .waitingForNetwork = $0 { true } else { false } }
                }
                let attempts = events.all.filter { if case .connecting = $0 { true } else { false } }.count
                try await Task.sleep(for: .milliseconds(300))
                #expect(events.all.filter { if case .connecting = $0 { true } else { false } }.count == attempts, "no attempts meanwhile")
                if case .waitingForNetwork = client.connectionState {} else { Issue.record("state: \(client.connectionState)") }

                network.faults.heal()
                paths.set(NetworkPath(isAvailable: true, identity: "cellular"))
                try await eventually("reconnected long before the 60 s backoff", timeout: .seconds(5)) { events.connects == 2 }
                #expect(try await client.request("echo", body: ByteBuffer(string: "back")).string == "back")
            }
        }

        @Test("a path change under a live connection replaces it at once")
        func changeReplacesConnection() async throws {
            try await withHarness { harness in
                let setup = try await self.connectedClient(harness)
                let (paths, client, events) = (setup.paths, setup.client, setup.events)
                paths.set(NetworkPath(isAvailable: true, identity: "cellular"))
                try await eventually("a new connection", timeout: .seconds(5)) { events.connects == 2 }
                #expect(events.disconnectReasons.count == 1)
                #expect(try await client.request("echo", body: ByteBuffer(string: "new path")).string == "new path")
            }
        }
    }
}
