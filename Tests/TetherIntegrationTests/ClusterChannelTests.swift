import Foundation
import NIOCore
import PostgresNIO
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherGatewayTesting
import TetherPostgres
import TetherTestSupport

extension IntegrationTests {
    /// Channels kept in PostgreSQL, shared by the nodes of a cluster.
    @Suite("Channels across a cluster on PostgreSQL", .requires(.postgresql), .timeLimit(.minutes(3)))
    struct ClusterChannelTests {
        typealias Reader = ClientChannelTests.Reader

        static func stored(_ configuration: inout GatewayConfiguration) {
            configuration.channels = try! .init(rules: [
                .init(pattern: .all, history: try! ChannelRetention(maxCount: 1_000, maxAge: .seconds(600)), storage: .store)
            ])
        }

        static func texts(_ reader: Reader) -> [String] { reader.bodies }

        @Test(
            "subscribers on three nodes get every publication made on any node once, in the channel's order; one whose node leaves recovers on another"
        )
        func acrossNodes() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(150)) { harness in
                let network = LocalNetwork()
                var nodes: [ClusterTestNode] = []
                for name in ["a", "b", "c"] {
                    nodes.append(try await harness.clusterNode(name, url: url, network: network, configure: Self.stored))
                }
                var readers: [Reader] = []
                for node in nodes {
                    let client = try harness.client([node.endpoint], clientID: "s-\(node.name)", transport: network.transport)
                    readers.append(Reader(client.subscribe("room.lobby"), in: harness))
                }
                let all = readers
                try await eventually("every subscriber is subscribed", timeout: .seconds(10)) {
                    all.allSatisfy { $0.subscriptions == [true] }
                }
                try await withThrowingTaskGroup { group in
                    for node in nodes {
                        group.addTask {
                            for index in 1...50 {
                                try await node.gateway.publish(ByteBuffer(string: "\(node.name)\(index)"), toChannel: "room.lobby")
                            }
                        }
                    }
                    try await group.waitForAll()
                }
                try await eventually("every subscriber has the 150", timeout: .seconds(20)) { all.allSatisfy { $0.bodies.count >= 150 } }
                let order = readers[0].bodies
                for (reader, node) in zip(readers, nodes) {
                    #expect(reader.publications.map(\.position.offset) == Array(1...150), "on node \(node.name)")
                    #expect(reader.bodies == order, "every node sends the channel's one order (node \(node.name))")
                    #expect(reader.gaps.isEmpty)
                }
                for node in nodes {
                    #expect(order.filter { $0.hasPrefix(node.name) } == (1...50).map { "\(node.name)\($0)" })
                }

                // The subscriber on node B: B leaves, its GOAWAY names another node.
                let (a, b) = (nodes[0], nodes[1])
                try await eventually("B knows another node", timeout: .seconds(5)) { b.cluster.alternateEndpoint != nil }
                b.gateway.shutdown()
                for index in 151...200 {
                    try await a.gateway.publish(ByteBuffer(string: "a\(index)"), toChannel: "room.lobby")
                }
                let moved = readers[1]
                try await eventually("the subscriber of B has all 200", timeout: .seconds(20)) { moved.bodies.count >= 200 }
                #expect(moved.publications.map(\.position.offset) == Array(1...200))
                #expect(moved.gaps.isEmpty)
                #expect(moved.subscriptions == [true, true], "subscribed again on the other node, recovered")
                #expect(Set(moved.publications.map(\.position.epoch)).count == 1, "one epoch on every node")
            }
        }
    }
}

extension IntegrationTests.ClusterChannelTests {
    static func presence(_ configuration: inout GatewayConfiguration) {
        configuration.channels = try! .init(rules: [.init(pattern: .all, history: nil, presence: true)])
    }

    @Test(
        "presence across nodes: a subscriber on A sees clients join and leave on B and C, one member whatever its nodes; a node that joins later sees them; a dead node's members leave once it is no longer alive"
    )
    func presenceAcrossNodes() async throws {
        try await TestPostgres.withDatabase { postgres, url in
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let network = LocalNetwork()
                var nodes: [ClusterTestNode] = []
                for name in ["a", "b", "c"] {
                    nodes.append(try await harness.clusterNode(name, url: url, network: network, configure: Self.presence))
                }
                let (a, b, c) = (nodes[0], nodes[1], nodes[2])
                let watcher = try harness.client([a.endpoint], clientID: "w", transport: network.transport)
                let watching = Reader(watcher.subscribe("room.lobby", presence: true), in: harness)
                try await eventually("w sees itself") { watching.members.keys.sorted() == ["w"] }

                // x on B: seen on A within a second.
                let xOnB = try harness.client([b.endpoint], clientID: "x", transport: network.transport)
                let started = ContinuousClock.now
                let xB = Task { for try await _ in xOnB.subscribe("room.lobby") {} }
                try await eventually("A sees x join on B", timeout: .seconds(5)) { watching.members["x"] != nil }
                // A figure, not an assertion (the poll interval here is 250 ms; a notification
                // wakes the nodes at once).
                print("presenceAcrossNodes: x's join on B seen on A after \(ContinuousClock.now - started)")
                try await eventually("C answers for the cluster", timeout: .seconds(5)) {
                    (try? c.gateway.presence(of: "room.lobby").members.map(\.clientID)) == ["w", "x"]
                }

                // x on C too: one member; leaving B, x is still in; leaving C, x leaves.
                let xOnC = try harness.client([c.endpoint], clientID: "x", transport: network.transport)
                let xC = Task { for try await _ in xOnC.subscribe("room.lobby") {} }
                try await eventually("C counts x's second connection", timeout: .seconds(5)) {
                    (try? a.gateway.presence(of: "room.lobby").members.first { $0.clientID == "x" }?.connections) == 2
                }
                xB.cancel()
                try await eventually("A counts one connection of x", timeout: .seconds(5)) {
                    (try? a.gateway.presence(of: "room.lobby").members.first { $0.clientID == "x" }?.connections) == 1
                }
                #expect(watching.members["x"] != nil, "x is still in on C")
                #expect(watching.presence == ["+w", "+x"])

                // A node that joins now sees who is in.
                let d = try await harness.clusterNode("d", url: url, network: network, configure: Self.presence)
                let late = try harness.client([d.endpoint], clientID: "late", transport: network.transport)
                let lateWatching = Reader(late.subscribe("room.lobby", presence: true), in: harness)
                try await eventually("D sees w and x", timeout: .seconds(5)) { lateWatching.members.keys.sorted() == ["late", "w", "x"] }

                try await eventually("A sees late join on D", timeout: .seconds(5)) { watching.members["late"] != nil }
                xC.cancel()
                try await eventually("A and D see x leave", timeout: .seconds(5)) {
                    watching.members["x"] == nil && lateWatching.members["x"] == nil
                }
                #expect(watching.presence == ["+w", "+x", "+late", "-x"])

                // A node that dies (it stops saying it is alive) with a member: its member leaves
                // once it is no longer seen within the node timeout (2 s in these nodes).
                let ghost = try await Self.ghostNode(postgres, member: "ghost", of: "room.lobby")
                try await eventually("A sees the ghost node's member", timeout: .seconds(5)) { watching.members["ghost"] != nil }
                let died = ContinuousClock.now
                try await eventually("A and D see it leave", timeout: .seconds(10)) {
                    watching.members["ghost"] == nil && lateWatching.members["ghost"] == nil
                }
                let gone = ContinuousClock.now - died
                print("presenceAcrossNodes: the dead node's member gone \(gone) after A saw it (node timeout 2 s, heartbeat 0.2 s)")
                #expect(gone > .seconds(1), "kept while alive: gone \(gone) after A saw it")
                _ = ghost
            }
        }
    }

    /// A node that registered, said `member` is in `channel`, and then never said it is alive again.
    static func ghostNode(_ postgres: PostgresClient, member: String, of channel: String) async throws -> Int64 {
        var id: Int64 = 0
        for try await value in try await postgres.query("INSERT INTO tether_nodes (name) VALUES ('ghost') RETURNING id").decode(Int64.self)
        {
            id = value
        }
        var body = ByteBuffer()
        body.writeInteger(UInt32(1))
        body.writeString("I-ghost")
        try await postgres.query(
            "INSERT INTO tether_channel_members (channel, client, node, connections, info) VALUES (\(channel), \(member), \(id), 1, 'I-ghost')"
        )
        try await postgres.query(
            "INSERT INTO tether_pushes (origin, kind, target, topic, body) VALUES (\(id), 4, \(channel), \(member), \(body))"
        )
        try await postgres.query("SELECT pg_notify('tether_pushes', '')")
        return id
    }
}
