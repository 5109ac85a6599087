import NIOConcurrencyHelpers
import NIOCore
import PostgresNIO
import Testing
import Tether
import TetherGateway
import TetherPostgres
import TetherStreamForwarding
import TetherTestSupport

extension IntegrationTests {
    /// The README's examples, verbatim except for the port, so that they keep compiling and working.
    @Suite("README examples")
    struct ReadmeExamplesTests {
        @Test("the gateway and client examples work together")
        func examples() async throws {
            // --- README: "A gateway in ten lines" (listening on an ephemeral port here) ---
            var configuration = GatewayConfiguration.defaults
            configuration.listen = .init(host: "127.0.0.1", port: 0)
            let gateway = try Gateway(configuration: configuration, logger: testLogger("readme-gateway"))
            gateway.handle("echo") { request, _ in request.body }
            gateway.handle("room.enter") { request, context in
                let room = String(buffer: request.body)
                context.join(room)
                try context.push("room.joined", ByteBuffer(string: context.connection.clientID), to: .room(room))
                return ByteBuffer(string: "welcome to \(room)")
            }
            let gatewayRun = Task { try await gateway.run() }
            let port = try await gateway.listeningAddress.port!

            // --- README: "A client in ten lines" ---
            let printed = NIOLockedValueBox<[String]>([])
            @Sendable func print(_ text: String) { printed.withLockedValue { $0.append(text) } }

            let client = try TetherClient(configuration: .init(endpoints: [Endpoint(host: "127.0.0.1", port: port)], clientID: "alice"))
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { try await client.run() }  // connects, heartbeats, reconnects
                group.addTask { for await push in client.pushes(topic: "room.joined") { print(String(buffer: push.body)) } }
                let reply = try await client.request("echo", body: ByteBuffer(string: "hi"), timeout: .seconds(3))
                print(String(buffer: reply))
                print(String(buffer: try await client.request("room.enter", body: ByteBuffer(string: "lobby"))))
                try await eventually("the push arrives") { printed.withLockedValue { $0.count == 3 } }
                client.shutdown()  // graceful: in-flight requests finish
            }
            #expect(Set(printed.withLockedValue { $0 }) == ["hi", "welcome to lobby", "alice"])

            // --- README: "Errors" (after the client shut down, every call fails) ---
            let body = ByteBuffer(string: "lobby")
            var outcome = "none"
            do {
                _ = try await client.request("room.enter", body: body, timeout: .seconds(3))
            } catch  where error.code == .timedOut {
                outcome = "timed out"
            } catch  where error.code == .serverError && error.status == .permissionDenied {
                outcome = "denied"
            } catch  where error.code == .connectionLost {
                outcome = "lost"
            } catch {
                outcome = "\(error.code)"
            }
            #expect(outcome == "shut down")
            gateway.shutdown()
            try await gatewayRun.value
        }

        @Test("the mobile-network example compiles and switches modes")
        func mobileExample() throws {
            // --- README: "Staying connected on mobile networks" (not run: no such gateway) ---
            var configuration = ClientConfiguration(endpoints: [Endpoint(host: "gw.example.com", port: 7700)], clientID: "alice")
            configuration.pathMonitor = PollingNetworkPathMonitor()  // NWPathNetworkMonitor() on Apple platforms
            configuration.heartbeat.natProbing = .defaults  // learn each network's NAT timeout
            let client = try TetherClient(configuration: configuration)
            #expect(client.natTimeoutProber?.interval(for: "wifi") == .seconds(60))
            client.setHeartbeatMode(.background)  // when the app goes to the background
            #expect(client.heartbeatMode == .background)
            client.setHeartbeatMode(.foreground)  // and back
            #expect(client.heartbeatMode == .foreground)
        }

        @Test("the cluster example compiles; its node has a stream forwarder")
        func clusterExample() async throws {
            // --- README: "A cluster" in code (the part after the PostgreSQL client; not run
            // against a server here, ClusterTests run clusters) ---
            let example: @Sendable (String, PostgresClient, GatewayConfiguration) async throws -> Gateway = {
                url,
                postgres,
                configuration in
                let store = try await PostgresMessageStore(client: postgres)  // migrates the tether_* tables
                var clusterConfiguration = try PostgresCluster.Configuration(url: url, name: "node-a")
                let forwarder = HTTPStreamForwarder()  // TetherStreamForwarding: HTTP-stream POSTs to the node that holds them
                clusterConfiguration.streamForwarder = forwarder
                let cluster = try PostgresCluster(store: store, configuration: clusterConfiguration)
                let gateway = try Gateway(configuration: configuration, messageStore: store, cluster: cluster)
                try await forwarder.shutdown()  // … once the gateway stopped
                return gateway
            }
            _ = example
            var configuration = try PostgresCluster.Configuration(url: "postgres://tether@127.0.0.1:5433/tether", name: "node-a")
            let forwarder = HTTPStreamForwarder()
            configuration.streamForwarder = forwarder
            #expect(configuration.streamForwarder != nil)
            try await forwarder.shutdown()
        }

        @Test("the reliable messaging examples work together")
        func reliableExamples() async throws {
            try await withHarness { harness in
                // --- README: "Reliable messages", the gateway (on an ephemeral port here) ---
                var gatewayConfiguration = GatewayConfiguration.defaults
                gatewayConfiguration.listen = .init(host: "127.0.0.1", port: 0)
                let gatewayPath = temporaryFile("readme-gateway", in: harness)
                let gateway = try Gateway(configuration: gatewayConfiguration, messageStore: try SQLiteMessageStore(path: gatewayPath))
                gateway.onMessage("dm") { message, context in
                    try context.deliver(to: message.conversation, topic: "dm", body: message.body)
                }
                harness.spawn { try? await gateway.run() }
                harness.onExit { gateway.shutdown() }
                let port = try await gateway.listeningAddress.port!

                // --- README: "Reliable messages", the client ---
                let printed = NIOLockedValueBox<[String]>([])
                @Sendable func print(_ text: String) { printed.withLockedValue { $0.append(text) } }
                let outboxPath = temporaryFile("readme-alice", in: harness)
                var configuration = ClientConfiguration(endpoints: [Endpoint(host: "127.0.0.1", port: port)], clientID: "alice")
                configuration.reliability = try .init(outbox: try SQLiteOutboxStore(path: outboxPath))  // or InMemoryOutboxStore()
                let client = try TetherClient(configuration: configuration)
                harness.spawn { try? await client.run() }
                harness.onExit { client.shutdown() }
                let receipt = try await client.send("dm", body: ByteBuffer(string: "hello"), conversation: "bob", ttl: .seconds(60))
                switch await client.outcome(of: receipt) {
                case .acknowledged: print("processed once")
                case .refused(let status): print("the handler refused it: \(status)")
                case .expired, nil: print("not acknowledged within its time to live")
                }
                #expect(printed.withLockedValue { $0 } == ["processed once"])

                // --- README: "Reliable messages", the deliveries loop (as bob) ---
                let bob = try harness.client([Endpoint(host: "127.0.0.1", port: port)], clientID: "bob") {
                    $0.reliability = try! .init(outbox: InMemoryOutboxStore())
                }
                let saved = NIOLockedValueBox<[String]>([])
                @Sendable func save(_ delivery: Delivery) throws { saved.withLockedValue { $0.append(delivery.body.string) } }
                harness.spawn {
                    do {
                        for try await delivery in bob.deliveries() {
                            try save(delivery)  // acknowledged (and never handed out again) once the loop moves on
                        }
                    } catch {
                        Issue.record("\(error)")
                    }
                }
                try await eventually("bob saves the message") { saved.withLockedValue { $0 } == ["hello"] }
            }
        }
        /// Who the README's subscriber sees in its channel.
        final class Roster: Sendable {
            private let members = NIOLockedValueBox<Set<String>>([])
            func removeAll() { self.members.withLockedValue { $0.removeAll() } }
            func insert(_ member: String) { self.members.withLockedValue { _ = $0.insert(member) } }
            func remove(_ member: String) { self.members.withLockedValue { _ = $0.remove(member) } }
            var all: Set<String> { self.members.withLockedValue { $0 } }
        }

        @Test("the channels example works: the subscriber shows what the gateway publishes, and who is in the channel")
        func channels() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(configure: { configuration in
                    configuration.channels!.rules[0].presence = true
                })
                let client = try harness.client([endpoint], clientID: "bob")
                let roster = Roster()
                let shown = NIOLockedValueBox<[String]>([])
                @Sendable func show(_ publisher: String, _ body: ByteBuffer) {
                    shown.withLockedValue { $0.append("\(publisher): \(String(buffer: body))") }
                }
                @Sendable func showBanner(_ text: String) { shown.withLockedValue { $0.append(text) } }
                let subscribed = NIOLockedValueBox(false)
                harness.spawn("the README's subscription") {
                    // --- README: "Channels: rooms that remember" ---
                    do {
                        for try await event in client.subscribe("room.lobby", presence: true) {
                            switch event {
                            // Keep message.position to resume there after a restart.
                            case .publication(let message): show(message.publisher, message.body)
                            case .gap(let gap): showBanner("\(gap.missed.map(String.init) ?? "some") messages missed")
                            case .subscribed:
                                roster.removeAll()  // the members follow, as joins
                                subscribed.withLockedValue { $0 = true }
                            case .joined(let member, _): roster.insert(member)
                            case .left(let member): roster.remove(member)
                            }
                        }
                    } catch {
                        showBanner("ended: \(error)")
                    }
                }
                try await eventually("subscribed") { subscribed.withLockedValue { $0 } }
                try await gateway.publish(ByteBuffer(string: "hi all"), toChannel: "room.lobby", publisher: "alice")
                try await eventually("shown") { shown.withLockedValue { $0 } == ["alice: hi all"] }
                try await eventually("bob sees himself") { roster.all == ["bob"] }
                let alice = try harness.client([endpoint], clientID: "alice")
                let aliceIn = Task { for try await _ in alice.subscribe("room.lobby") {} }
                try await eventually("bob sees alice join") { roster.all == ["alice", "bob"] }
                aliceIn.cancel()
                try await eventually("bob sees alice leave") { roster.all == ["bob"] }
            }
        }
    }
}
