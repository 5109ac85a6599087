import Foundation
import NIOCore
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
