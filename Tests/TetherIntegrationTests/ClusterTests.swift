import Foundation
import NIOConcurrencyHelpers
import NIOCore
import PostgresNIO
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherGatewayTesting
import TetherPostgres
import TetherStreamForwarding
import TetherTestSupport

/// One node of a test cluster: a gateway with its own PostgreSQL client, store and cluster
/// membership, reachable on a local network.
struct ClusterTestNode {
    let name: String
    let gateway: Gateway
    let store: PostgresMessageStore
    let cluster: PostgresCluster
    let endpoint: Endpoint
    /// The bodies its chat handler processed, in order.
    let processed: NIOLockedValueBox<[String]>
}

extension Harness {
    /// A node of the cluster on the database at `url`: the chat handler (see
    /// ``installChatHandler(on:)``), `room.enter` (joins the room named by the body) and
    /// `push.client` (pushes "topic|client|text" to a client id).
    func clusterNode(
        _ name: String,
        url: String,
        network: LocalNetwork,
        configure: (inout GatewayConfiguration) -> Void = { _ in },
        configureCluster: (inout PostgresCluster.Configuration) -> Void = { _ in },
        routes: (Gateway) -> Void = { _ in }
    ) async throws -> ClusterTestNode {
        let postgres = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: url))
        let running = Task { await postgres.run() }
        self.spawn("the PostgreSQL client of node \(name)") { await running.value }
        let store = try await PostgresMessageStore(client: postgres, logger: testLogger("store-\(name)"))
        var clusterConfiguration = try PostgresCluster.Configuration(url: url, name: name)
        clusterConfiguration.heartbeatInterval = .milliseconds(200)
        clusterConfiguration.nodeTimeout = .seconds(2)
        clusterConfiguration.pollInterval = .milliseconds(250)
        let endpoint = Endpoint(host: name, port: 1)
        clusterConfiguration.address = endpoint.description
        let forwarder = HTTPStreamForwarder(logger: testLogger("streams-\(name)"))
        clusterConfiguration.streamForwarder = forwarder
        configureCluster(&clusterConfiguration)
        let cluster = try PostgresCluster(store: store, configuration: clusterConfiguration, logger: testLogger("cluster-\(name)"))
        var configuration = GatewayConfiguration.defaults
        configuration.listen = nil
        configure(&configuration)
        let gateway = try Gateway(
            configuration: configuration,
            messageStore: store,
            cluster: cluster,
            logger: testLogger("gateway-\(name)")
        )
        let processed = self.installChatHandler(on: gateway)
        gateway.handle("room.enter") { request, context in
            context.join(String(buffer: request.body))
            return ByteBuffer(string: "in")
        }
        routes(gateway)
        network.attach(gateway, at: endpoint)
        // The PostgreSQL client stops once the gateway has left its cluster, as in `tether serve`.
        self.spawn("gateway.run() of node \(name)") {
            try? await gateway.run()
            running.cancel()
            try? await forwarder.shutdown()
        }
        self.describe { "node \(name): \(gateway.connections.count) established connections" }
        self.onExit { gateway.shutdown() }
        try await eventually("node \(name) joined its cluster") { cluster.nodeID != nil }
        return ClusterTestNode(name: name, gateway: gateway, store: store, cluster: cluster, endpoint: endpoint, processed: processed)
    }
}

/// Two nodes, alice connected to A and bob to B, and what bob receives.
struct TwoNodes {
    let network: LocalNetwork
    let a: ClusterTestNode
    let b: ClusterTestNode
    let alice: TetherClient
    let bob: TetherClient
    let bobInbox: DeliveryCollector
}

extension Harness {
    /// Nodes A and B on the database at `url`, alice on A and bob on B (both reliable).
    func twoNodes(url: String, routes: (Gateway) -> Void = { _ in }) async throws -> TwoNodes {
        let network = LocalNetwork()
        let a = try await self.clusterNode("a", url: url, network: network, routes: routes)
        let b = try await self.clusterNode("b", url: url, network: network, routes: routes)
        let alice = try self.messagingClient(network: network, endpoint: a.endpoint, id: "alice")
        let bob = try self.messagingClient(network: network, endpoint: b.endpoint, id: "bob")
        return TwoNodes(network: network, a: a, b: b, alice: alice, bob: bob, bobInbox: DeliveryCollector(bob, in: self))
    }
}

extension IntegrationTests {
    @Suite("A cluster of gateways on PostgreSQL", .requires(.postgresql), .timeLimit(.minutes(3)))
    struct ClusterTests {
        @Test("alice on node A and bob on node B: reliable messages and pushes both ways, each once and in order")
        func twoNodes() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let setup = try await harness.twoNodes(url: url)
                let (a, b, alice, bob) = (setup.a, setup.b, setup.alice, setup.bob)
                let aliceInbox = DeliveryCollector(alice, in: harness)
                let bobInbox = setup.bobInbox
                let alicePushes = PushCollector(alice, topic: "note", in: harness)
                let bobPushes = PushCollector(bob, topic: "note", in: harness)
                try await eventually("both clients are present in the cluster") {
                    a.gateway.connections.count == 1 && b.gateway.connections.count == 1
                }

                for index in 1...50 {
                    _ = try await alice.send("chat.send", body: ByteBuffer(string: "to bob \(index)"), conversation: "bob")
                    _ = try await bob.send("chat.send", body: ByteBuffer(string: "to alice \(index)"), conversation: "alice")
                }
                try await eventually("each gets the other's 50 messages", timeout: .seconds(20)) {
                    bobInbox.count == 50 && aliceInbox.count == 50
                }
                #expect(bobInbox.bodies == (1...50).map { "to bob \($0)" })
                #expect(aliceInbox.bodies == (1...50).map { "to alice \($0)" })
                #expect(bobInbox.violations.isEmpty && aliceInbox.violations.isEmpty)
                #expect(a.processed.withLockedValue { $0 } == (1...50).map { "to bob \($0)" })
                #expect(b.processed.withLockedValue { $0 } == (1...50).map { "to alice \($0)" })

                // Pushes from either node reach a client on the other, in order.
                for index in 1...20 {
                    try a.gateway.push("note", ByteBuffer(string: "a\(index)"), to: .client("bob"))
                    try b.gateway.push("note", ByteBuffer(string: "b\(index)"), to: .client("alice"))
                }
                try await eventually("the pushes crossed", timeout: .seconds(10)) {
                    bobPushes.bodies.count == 20 && alicePushes.bodies.count == 20
                }
                #expect(bobPushes.bodies == (1...20).map { "a\($0)" })
                #expect(alicePushes.bodies == (1...20).map { "b\($0)" })
                // Every node hears a push to everyone once; none comes back to its own node twice.
                try a.gateway.push("note", ByteBuffer(string: "all"), to: .all)
                try await eventually("a push to everyone") { bobPushes.bodies.last == "all" && alicePushes.bodies.last == "all" }
                try await Task.sleep(for: .milliseconds(600))
                #expect(alicePushes.bodies.filter { $0 == "all" }.count == 1)
                #expect(bobPushes.bodies.filter { $0 == "all" }.count == 1)
            }
        }

        @Test("a room whose members are on three nodes gets every push made on any of them")
        func roomOverThreeNodes() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let network = LocalNetwork()
                var nodes: [ClusterTestNode] = []
                for name in ["a", "b", "c"] { nodes.append(try await harness.clusterNode(name, url: url, network: network)) }
                var collectors: [PushCollector] = []
                for (index, node) in nodes.enumerated() {
                    for member in 0..<3 {
                        let client = try harness.client([node.endpoint], clientID: "m\(index)-\(member)", transport: network.transport)
                        let collector = PushCollector(client, topic: "room.say", in: harness)
                        _ = try await client.request("room.enter", body: ByteBuffer(string: "lobby"), timeout: .seconds(5))
                        collectors.append(collector)
                    }
                }
                for node in nodes {
                    for line in 1...5 {
                        try node.gateway.push("room.say", ByteBuffer(string: "\(node.name)\(line)"), to: .room("lobby"))
                    }
                }
                let members = collectors
                try await eventually("every member got the 15 pushes", timeout: .seconds(10)) {
                    members.allSatisfy { $0.bodies.count == 15 }
                }
                for collector in members {
                    // Each node's pushes arrive in the order it made them.
                    for node in nodes {
                        #expect(collector.bodies.filter { $0.hasPrefix(node.name) } == (1...5).map { "\(node.name)\($0)" })
                    }
                }
                #expect(nodes[0].gateway.members(of: "lobby").count == 3)
            }
        }

        @Test("node A's server API reaches bob on node B: his credentials refreshed, then ended (he comes back), then revoked")
        func clientCommandsAcrossNodes() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let setup = try await harness.twoNodes(url: url)
                let (a, b) = (setup.a, setup.b)
                let api = APICaller(port: try await harness.serverAPI(a.gateway, keys: BackendTests.keys), key: BackendTests.keys[0])
                let events = harness.events(of: setup.bob)
                try await eventually("bob is connected to node B") { b.gateway.connections(of: "bob").count == 1 }

                // Refreshed far off: nothing happens to his connection.
                let later = Int(Date().timeIntervalSince1970) + 3600
                let refreshed = try await api.call(.POST, "/v1/clients/bob/refresh", body: #"{"expires_at":\#(later)}"#)
                #expect(refreshed.status == 200 && refreshed.json["connections"] as? Int == 0, "none on node A")
                try await eventually("node B set bob's expiry") {
                    b.gateway.connections(of: "bob").first?.identity?.expiresAt == Date(timeIntervalSince1970: TimeInterval(later))
                }
                #expect(events.connects == 1)

                // Ended: GOAWAY `credentials expired` on node B, and bob connects again.
                let expired = try await api.call(.POST, "/v1/clients/bob/expire", body: #"{"message":"from node A"}"#)
                #expect(expired.status == 200 && expired.json["connections"] as? Int == 0)
                try await eventually("bob's credentials ended on node B, and he is back", timeout: .seconds(10)) {
                    events.all.contains {
                        if case .disconnected(.goingAway(let goAway)) = $0 {
                            goAway.reason == .credentialsExpired && goAway.message == "from node A"
                        } else {
                            false
                        }
                    } && events.connects == 2
                }

                // Revoked: bob stops connecting.
                let revoked = try await api.call(.POST, "/v1/clients/bob/disconnect", body: #"{"message":"banned on A","reconnect":false}"#)
                #expect(revoked.status == 200)
                try await eventually("bob stops connecting", timeout: .seconds(10)) {
                    events.all.contains { if case .failed(let error) = $0 { error.message.contains("banned on A") } else { false } }
                }
                try await eventually("node B closed bob's connection") { b.gateway.connections(of: "bob").isEmpty }
                #expect(a.gateway.connections(of: "alice").count == 1, "alice, on node A, was not touched")
            }
        }

        @Test(
            "the server API's queries reach every node: a client's connections and a room's members on both nodes, each named by its node; a live node that does not answer is named"
        )
        func queriesAcrossNodes() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let network = LocalNetwork()
                let a = try await harness.clusterNode(
                    "a",
                    url: url,
                    network: network,
                    configureCluster: { $0.queryTimeout = .milliseconds(800) }
                )
                let b = try await harness.clusterNode("b", url: url, network: network)
                let api = APICaller(port: try await harness.serverAPI(a.gateway, keys: BackendTests.keys), key: BackendTests.keys[0])
                // alice on both nodes (two devices), bob on B; alice's first device and bob in the room.
                let aliceA = try harness.client([a.endpoint], clientID: "alice", transport: network.transport)
                _ = try harness.client([b.endpoint], clientID: "alice", transport: network.transport)  // her second device
                let bob = try harness.client([b.endpoint], clientID: "bob", transport: network.transport)
                for client in [aliceA, bob] { _ = try await client.request("room.enter", body: ByteBuffer(string: "lobby")) }
                try await eventually("alice is on both nodes") {
                    a.gateway.connections(of: "alice").count == 1 && b.gateway.connections(of: "alice").count == 1
                }
                try await eventually("A knows B is alive", timeout: .seconds(5)) { a.cluster.alternateEndpoint != nil }

                func nodes(_ json: [String: Any]) -> [String] {
                    (json["connections"] as? [[String: Any]] ?? []).map {
                        "\($0["node"] as? String ?? "-")/\($0["client"] as? String ?? "-")"
                    }
                }
                let alice = try await api.call(.GET, "/v1/clients/alice/connections")
                #expect(alice.status == 200)
                #expect(nodes(alice.json) == ["a/alice", "b/alice"], "\(alice.json)")
                #expect(alice.json["unanswered_nodes"] as? [String] == [])
                let ids = (alice.json["connections"] as? [[String: Any]] ?? []).compactMap { $0["id"] as? Int }
                let expected = [a, b].compactMap { $0.gateway.connections(of: "alice").first.map { Int($0.id) } }
                #expect(ids == expected)
                let lobby = try await api.call(.GET, "/v1/rooms/lobby/members")
                #expect(nodes(lobby.json) == ["a/alice", "b/bob"], "\(lobby.json)")
                let nobody = try await api.call(.GET, "/v1/clients/carol/connections")
                #expect(nobody.status == 200 && nodes(nobody.json).isEmpty)

                // A node that is alive by the table but never answers (a node of an older version,
                // or one that hangs): the answer comes after the timeout, naming it.
                let store = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: url))
                let running = Task { await store.run() }
                defer { running.cancel() }
                _ = try await store.query("INSERT INTO tether_nodes (name) VALUES ('mute')").collect()
                let heartbeat = Task {
                    while !Task.isCancelled {
                        _ = try? await store.query("UPDATE tether_nodes SET seen_at = now() WHERE name = 'mute'").collect()
                        try? await Task.sleep(for: .milliseconds(100))
                    }
                }
                defer { heartbeat.cancel() }
                try await eventually("A counts the mute node as alive") {
                    let answers = try? await a.cluster.ask(.members(room: "x"))
                    return answers?.unanswered == ["mute"]
                }
                let started = ContinuousClock.now
                let partial = try await api.call(.GET, "/v1/clients/alice/connections")
                let took = ContinuousClock.now - started
                #expect(partial.status == 200 && nodes(partial.json) == ["a/alice", "b/alice"], "\(partial.json)")
                #expect(partial.json["unanswered_nodes"] as? [String] == ["mute"])
                #expect(took >= .milliseconds(700) && took < .seconds(5), "after the query timeout: \(took)")
                try await eventually("the answers were deleted") {
                    (try? await store.query("SELECT count(*) FROM tether_answers").collect().first?.decode(Int.self)) == 0
                }
            }
        }

        @Test("a node that shuts down names another in its GOAWAY: its clients move there, and their messages go on once each")
        func gracefulLeave() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let setup = try await harness.twoNodes(url: url)
                let (a, b, alice) = (setup.a, setup.b, setup.alice)
                // alice knows only node A: B comes from A's GOAWAY.
                let inbox = setup.bobInbox
                for index in 1...20 { _ = try await alice.send("chat.send", body: ByteBuffer(string: "m\(index)"), conversation: "bob") }
                try await eventually("A knows B's address", timeout: .seconds(5)) { a.cluster.alternateEndpoint != nil }
                a.gateway.shutdown()
                try await eventually("alice moved to node B", timeout: .seconds(15)) { alice.connectionState == .connected(b.endpoint) }
                for index in 21...40 { _ = try await alice.send("chat.send", body: ByteBuffer(string: "m\(index)"), conversation: "bob") }
                try await eventually("bob gets all 40", timeout: .seconds(15)) { inbox.count == 40 }
                #expect(inbox.bodies == (1...40).map { "m\($0)" })
                #expect(inbox.violations.isEmpty)
                #expect(a.processed.withLockedValue { $0 } + b.processed.withLockedValue { $0 } == (1...40).map { "m\($0)" })
            }
        }

        @Test("carol moves to node B while node A still runs her message's handler: B waits for A's commit, the handler runs once")
        func moveWhileProcessing() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let gate = NIOLockedValueBox(false)
                let runs = NIOLockedValueBox<[String]>([])
                let setup = try await harness.twoNodes(url: url) { gateway in
                    gateway.onMessage("gated") { message, context in
                        runs.withLockedValue { $0.append(context.connection.clientID) }
                        while !gate.withLockedValue({ $0 }) { try await Task.sleep(for: .milliseconds(10)) }
                        try context.deliver(to: "bob", topic: "chat.message", body: message.body)
                    }
                }
                let (a, b, network) = (setup.a, setup.b, setup.network)
                let carol = try harness.client([a.endpoint, b.endpoint], clientID: "carol", transport: network.transport) {
                    $0.reliability = try! .init(outbox: InMemoryOutboxStore())
                }
                try await eventually("carol is on node A") { carol.connectionState == .connected(a.endpoint) }
                let receipt = try await carol.send("gated", body: ByteBuffer(string: "once"), conversation: "c")
                try await eventually("node A runs the handler") { runs.withLockedValue { $0.count } == 1 }

                // Carol's network changes: node A is out of reach; she resends to node B, whose
                // claim on her lane waits for node A's batch.
                network.faults.refuse(a.endpoint)
                network.faults.dropConnections()
                try await eventually("carol is on node B", timeout: .seconds(10)) { carol.connectionState == .connected(b.endpoint) }
                try await Task.sleep(for: .seconds(1))
                #expect(runs.withLockedValue { $0.count } == 1, "node B waits for the lane instead of running the handler again")
                gate.withLockedValue { $0 = true }

                try await eventually("bob gets it", timeout: .seconds(20)) { setup.bobInbox.count == 1 }
                try await eventually("carol's message is acknowledged", timeout: .seconds(20)) {
                    await carol.outcome(of: receipt) == .acknowledged
                }
                try await Task.sleep(for: .milliseconds(500))
                #expect(runs.withLockedValue { $0.count } == 1, "the handler ran once")
                #expect(setup.bobInbox.bodies == ["once"])
            }
        }

        @Test("a delivery committed by a statement that began before bob's presence was written still reaches bob on his node")
        func presenceWrittenDuringACommit() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let network = LocalNetwork()
                _ = try await harness.clusterNode("a", url: url, network: network)
                let b = try await harness.clusterNode("b", url: url, network: network)
                let admin = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: url))
                try await withThrowingTaskGroup { group in
                    group.addTask { await admin.run() }
                    // What a group commit on node A does for bob while his presence is not
                    // written yet (its statement's snapshot has none): append his delivery and
                    // lock his stream row, then commit, signalling nobody. Here it stays open
                    // while bob connects to B and B writes his presence.
                    let appended = AsyncStream.makeStream(of: Void.self)
                    let commit = AsyncStream.makeStream(of: Void.self)
                    group.addTask {
                        try await admin.withTransaction(logger: testLogger("admin")) { connection in
                            try await connection.query(
                                "INSERT INTO tether_streams (recipient, next_sequence, waiting, waiting_bytes) VALUES ('bob', 2, 1, 4)",
                                logger: testLogger("admin")
                            )
                            try await connection.query(
                                "INSERT INTO tether_deliveries (recipient, sequence, topic, body) VALUES ('bob', 1, 'chat', 'late'::bytea)",
                                logger: testLogger("admin")
                            )
                            appended.continuation.yield()
                            for await _ in commit.stream { break }
                        }
                    }
                    for await _ in appended.stream { break }
                    let bob = try harness.messagingClient(network: network, endpoint: b.endpoint, id: "bob")
                    let bobInbox = DeliveryCollector(bob, in: harness)
                    try await eventually("bob's presence on B is written") {
                        let rows = try? await admin.query("SELECT count(*) FROM tether_presence WHERE client = 'bob'")
                            .decode(Int64.self).reduce(0, +)
                        return (rows ?? 0) > 0
                    }
                    // B's read of bob's deliveries after writing his presence waits for the commit
                    // (without the wait it read nothing, and bob would never be told).
                    try await Task.sleep(for: .milliseconds(500))
                    #expect(bobInbox.count == 0)
                    commit.continuation.yield()
                    try await eventually("bob gets the delivery", timeout: .seconds(10)) { bobInbox.count == 1 }
                    #expect(bobInbox.bodies == ["late"])
                    group.cancelAll()
                }
            }
        }

        @Test("a node whose lane was taken over cannot commit with its old fence; the message is processed once")
        func staleFence() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let setup = try await harness.twoNodes(url: url)
                let (a, b, alice) = (setup.a, setup.b, setup.alice)
                let bobInbox = setup.bobInbox
                // Both connected first, as the other tests of the suite: what is tested here is
                // the stale fence (the presence race is presenceWrittenDuringACommit's).
                try await eventually("both clients are present in the cluster") {
                    a.gateway.connections.count == 1 && b.gateway.connections.count == 1
                }
                _ = try await alice.send("chat.send", body: ByteBuffer(string: "one"), conversation: "bob")
                try await eventually("bob gets one") { bobInbox.count == 1 }

                // Node B takes alice's lane over, as it would from a node it believed dead.
                let admin = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: url))
                try await withThrowingTaskGroup { group in
                    group.addTask { await admin.run() }
                    let bID = try #require(b.cluster.nodeID)
                    try await admin.query("UPDATE tether_lanes SET node = \(bID), fence = fence + 1 WHERE client = 'alice'")
                    // A's next commit carries its old fence: refused; A claims the lane back from B
                    // (which no longer uses it), and the message is processed once.
                    _ = try await alice.send("chat.send", body: ByteBuffer(string: "two"), conversation: "bob")
                    try await eventually("bob gets two", timeout: .seconds(15)) { bobInbox.count == 2 }
                    try await Task.sleep(for: .milliseconds(300))
                    #expect(bobInbox.bodies == ["one", "two"])
                    #expect(bobInbox.violations.isEmpty)
                    var fence: Int64 = 0
                    for try await value in try await admin.query("SELECT fence FROM tether_lanes WHERE client = 'alice'").decode(Int64.self)
                    {
                        fence = value
                    }
                    #expect(fence == 3, "claimed by A (1), taken over by B (2), claimed back by A (3)")
                    group.cancelAll()
                }
            }
        }
    }
}

extension IntegrationTests {
    @Suite("A cluster when a node or PostgreSQL dies", .requires(.postgresql), .timeLimit(.minutes(3)))
    struct ClusterFailureTests {
        /// Nodes a and b: `tether serve --postgres` processes on the database at `url`, with
        /// `arguments`, once they listen.
        static func serveNodes(url: String, in harness: Harness, _ arguments: [String] = []) async throws -> [(ChildProcess, Endpoint)] {
            var nodes: [(ChildProcess, Endpoint)] = []
            for name in ["a", "b"] {
                let port = try LocalPostgres.freePort()
                let node = try ChildProcess(
                    ["serve", "--postgres", url, "--node-name", name, "--port", "\(port)", "--store", ":memory:", "--log-level", "info"]
                        + arguments,
                    in: harness
                )
                nodes.append((node, Endpoint(host: "127.0.0.1", port: port)))
            }
            for (node, _) in nodes {
                try await eventually("a node listens", timeout: .seconds(30)) { node.lines.contains { $0.contains("listening") } }
            }
            return nodes
        }

        @Test("node A is killed with SIGKILL mid-stream: alice resumes on node B, nothing lost or doubled, the handler's deliveries once")
        func nodeKilled() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(150)) { harness in
                let nodes = try await Self.serveNodes(url: url, in: harness)
                let (a, b) = (nodes[0], nodes[1])
                let alice = try harness.client([a.1, b.1], clientID: "alice") { $0.reliability = try! .init(outbox: InMemoryOutboxStore()) }
                let bob = try harness.client([b.1], clientID: "bob") { $0.reliability = try! .init(outbox: InMemoryOutboxStore()) }
                let inbox = DeliveryCollector(bob, in: harness)
                let count = 600
                let sent = NIOLockedValueBox(0)
                harness.spawn("alice sends") {
                    for index in 1...count {
                        guard (try? await alice.send("dm", body: ByteBuffer(string: "m\(index)"), conversation: "bob")) != nil else {
                            return
                        }
                        sent.withLockedValue { $0 = index }
                        try? await Task.sleep(for: .milliseconds(3))  // a stream, not a burst: the kill lands mid-way
                    }
                }
                try await eventually("bob gets the first messages through node A", timeout: .seconds(30)) { inbox.count >= 100 }
                let sentBeforeKill = sent.withLockedValue { $0 }
                a.0.kill()
                #expect(try await a.0.exitStatus() == SIGKILL)
                let killedAt = ContinuousClock.now
                try await eventually("alice sends the rest through node B", timeout: .seconds(60)) { inbox.count >= count }
                print(
                    "node killed after alice sent \(sentBeforeKill): bob had all \(count) messages \(ContinuousClock.now - killedAt) after the kill"
                )
                #expect(sentBeforeKill < count - 100, "the kill landed mid-stream")
                try await Task.sleep(for: .milliseconds(500))
                #expect(inbox.bodies == (1...count).map { "m\($0)" }, "once each, in order")
                #expect(inbox.violations.isEmpty)
                #expect(sent.withLockedValue { $0 } == count)
            }
        }

        @Test(
            "bob's node is killed with SIGKILL while alice publishes to a channel: bob subscribes again on the other node and recovers, every publication once, in order, no gap"
        )
        func channelNodeKilled() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(150)) { harness in
                let nodes = try await Self.serveNodes(url: url, in: harness, ["--channel-history", "5000", "--channel-clients-publish"])
                let (a, b) = (nodes[0], nodes[1])
                let bob = try harness.client([a.1, b.1], clientID: "bob")
                let reader = IntegrationTests.ClientChannelTests.Reader(bob.subscribe("room.lobby"), in: harness)
                try await eventually("bob is subscribed on A", timeout: .seconds(10)) { reader.subscriptions == [true] }
                let alice = try harness.client([b.1], clientID: "alice")
                let count = 600
                let published = NIOLockedValueBox(0)
                harness.spawn("alice publishes") {
                    for index in 1...count {
                        guard (try? await alice.publish(ByteBuffer(string: "p\(index)"), toChannel: "room.lobby")) != nil else { return }
                        published.withLockedValue { $0 = index }
                        try? await Task.sleep(for: .milliseconds(3))  // a stream: the kill lands mid-way
                    }
                }
                try await eventually("bob gets the first ones through A", timeout: .seconds(30)) { reader.bodies.count >= 100 }
                let publishedBeforeKill = published.withLockedValue { $0 }
                a.0.kill()
                #expect(try await a.0.exitStatus() == SIGKILL)
                try await eventually("bob has every publication through B", timeout: .seconds(60)) { reader.bodies.count >= count }
                #expect(publishedBeforeKill < count - 100, "the kill landed mid-stream")
                try await Task.sleep(for: .milliseconds(300))
                #expect(reader.bodies == (1...count).map { "p\($0)" }, "once each, in order")
                #expect(reader.publications.map(\.position.offset) == Array(1...UInt64(count)))
                #expect(reader.gaps.isEmpty && reader.subscriptions == [true, true], "subscribed again on B, recovered")
            }
        }

        @Test("PostgreSQL is restarted while alice sends to bob across nodes: every message arrives once, in order")
        func postgresRestarted() async throws {
            try OutsideTool.postgresql.require()
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-pg-restart-\(UUID().uuidString)")
            let server = try LocalPostgres(directory: directory, port: try LocalPostgres.freePort())
            try server.start(fsync: false)
            defer { server.destroy() }
            let url = server.url + "?sslmode=disable"
            try await withHarness(timeLimit: .seconds(150)) { harness in
                let setup = try await harness.twoNodes(url: url)
                let (a, alice) = (setup.a, setup.alice)
                let inbox = setup.bobInbox
                let count = 300
                harness.spawn("alice sends") {
                    for index in 1...count {
                        _ = try? await alice.send("chat.send", body: ByteBuffer(string: "m\(index)"), conversation: "bob")
                    }
                }
                try await eventually("the first messages arrive", timeout: .seconds(30)) { inbox.count >= 50 }
                try server.stop()
                try await Task.sleep(for: .seconds(1))
                try server.start(fsync: false)
                try await eventually("everything arrives once PostgreSQL is back", timeout: .seconds(90)) { inbox.count >= count }
                try await Task.sleep(for: .milliseconds(500))
                #expect(inbox.bodies == (1...count).map { "m\($0)" }, "once each, in order")
                #expect(inbox.violations.isEmpty)
                #expect(Set(a.processed.withLockedValue { $0 }).count == count)
            }
        }
    }
}
