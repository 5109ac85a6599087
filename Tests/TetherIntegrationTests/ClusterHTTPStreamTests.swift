import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherGatewayTesting
import TetherNIO
import TetherNIOTransports
import TetherPostgres
import TetherTestSupport

extension IntegrationTests {
    @Suite("The HTTP stream in a cluster: no sticky sessions", .requires(.postgresql), .timeLimit(.minutes(3)))
    struct ClusterHTTPStreamTests {
        /// Nodes A and B with an HTTP listener on 127.0.0.1 each; `node` answers the node's name.
        static func nodes(url: String, harness: Harness) async throws -> (LocalNetwork, ClusterTestNode, ClusterTestNode) {
            let network = LocalNetwork()
            var nodes: [ClusterTestNode] = []
            for name in ["a", "b"] {
                nodes.append(
                    try await harness.clusterNode(
                        name,
                        url: url,
                        network: network,
                        configure: { $0.configureListener(.httpStream) },
                        routes: { gateway in gateway.handle("node") { _, _ in ByteBuffer(string: name) } }
                    )
                )
            }
            return (network, nodes[0], nodes[1])
        }

        static func streamURL(_ node: ClusterTestNode) async throws -> String {
            "http://127.0.0.1:\(try await node.gateway.webSocketAddress.port!)\(Endpoint.defaultHTTPStreamPath)"
        }

        /// Opens a stream with a GET to `url`, read until cancelled.
        /// - Returns: The session's token, and the task that reads the stream.
        static func openStream(_ url: String) async throws -> (token: String, key: String, stream: Task<Void, any Error>) {
            let opened = AsyncStream.makeStream(of: String.self)
            let stream = Task {
                defer { opened.continuation.finish() }
                let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: url), timeout: .seconds(60))
                var line = ""
                for try await chunk in response.body where !line.contains("\n") {
                    line += String(buffer: chunk)
                    if line.contains("\n") { opened.continuation.yield(String(line.prefix { $0 != "\n" && $0 != "\r" })) }
                }
            }
            var lines = opened.stream.makeAsyncIterator()
            guard let line = await lines.next(), let (token, key) = HTTPStreamBinding.parseSessionLine(line) else {
                Issue.record("no session line from \(url)")
                throw CancellationError()
            }
            return (token, key, stream)
        }

        @Test("behind a load balancer without affinity, the stream's GET on node A and its POSTs on node B: B forwards them to A")
        func postsForwarded() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let (network, a, b) = try await Self.nodes(url: url, harness: harness)
                let balancer = TCPFaultProxy(upstreams: [
                    Endpoint(host: "127.0.0.1", port: try await a.gateway.webSocketAddress.port!),
                    Endpoint(host: "127.0.0.1", port: try await b.gateway.webSocketAddress.port!),
                ])
                let port = try await balancer.start().port!
                harness.onExit { balancer.cutAll() }
                let carol = try harness.client([Endpoint(host: "127.0.0.1", port: port, transport: .httpStream)], clientID: "carol") {
                    $0.reliability = try! ClientConfiguration.Reliability(outbox: InMemoryOutboxStore())
                }
                let carolInbox = DeliveryCollector(carol, in: harness)
                let bob = try harness.messagingClient(network: network, endpoint: b.endpoint, id: "bob")
                let bobInbox = DeliveryCollector(bob, in: harness)

                // The balancer sends the stream's connection to A and the POST connection to B.
                #expect(try await carol.request("node").string == "a")
                #expect(balancer.acceptedConnections == 2)
                try await eventually("bob is connected") { b.gateway.connections.contains { $0.clientID == "bob" } }
                #expect(a.gateway.connections.map(\.clientID) == ["carol"], "the stream's connection is on A")

                for index in 1...30 {
                    _ = try await carol.send("chat.send", body: ByteBuffer(string: "to bob \(index)"), conversation: "bob")
                    _ = try await bob.send("chat.send", body: ByteBuffer(string: "to carol \(index)"), conversation: "carol")
                }
                try await eventually("each gets the other's 30 messages", timeout: .seconds(20)) {
                    bobInbox.count == 30 && carolInbox.count == 30
                }
                #expect(bobInbox.bodies == (1...30).map { "to bob \($0)" })
                #expect(carolInbox.bodies == (1...30).map { "to carol \($0)" })
                #expect(bobInbox.violations.isEmpty && carolInbox.violations.isEmpty)
                #expect(a.processed.withLockedValue { $0 } == (1...30).map { "to bob \($0)" }, "carol's messages processed on A, once")
                #expect(harness.events(of: carol).connects == 1, "no reconnection: every forwarded POST was answered 204")
                #expect(balancer.acceptedConnections == 2)
            }
        }

        @Test("forwarded POSTs get the statuses of the node that holds the stream; unknown and already forwarded sessions get 404")
        func forwardedStatuses() async throws {
            let url = try await TestPostgres.makeDatabase()
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let (_, a, b) = try await Self.nodes(url: url, harness: harness)
                let (onA, onB) = (try await Self.streamURL(a), try await Self.streamURL(b))
                let http = HTTPClient.shared

                // A stream opened on A; its token names A.
                let (token, key, stream) = try await Self.openStream(onA)
                #expect(HTTPStreamBinding.isWellFormedToken(token))

                /// POSTs an empty body, proven as the session's POST number `number` with `key`
                /// (another key for sessions the test does not read).
                @Sendable func post(
                    _ url: String,
                    token: String,
                    key: String = HTTPStreamBinding.makeKey(),
                    number: UInt64 = 0,
                    forwarded: Bool = false
                ) async throws -> (Int, String) {
                    var request = HTTPClientRequest(url: url)
                    request.method = .POST
                    request.headers.add(name: HTTPStreamBinding.sessionHeader, value: token)
                    request.headers.add(
                        name: HTTPStreamBinding.proofHeader,
                        value: HTTPStreamBinding.proof(key: key, post: number, body: ByteBuffer())!
                    )
                    if forwarded { request.headers.add(name: HTTPStreamBinding.forwardedHeader, value: "1") }
                    request.body = .bytes(ByteBuffer())
                    let response = try await http.execute(request, timeout: .seconds(30))
                    let body = try await response.body.collect(upTo: 4096)
                    return (Int(response.status.code), String(buffer: body))
                }

                // An empty POST through B reaches A's stream, its proof checked by A.
                #expect(try await post(onB, token: token, key: key, number: 0).0 == 204)
                // One with the token but not the key: A's 403 comes back through B.
                let (forbidden, why403) = try await post(onB, token: token, number: 1)
                #expect(forbidden == 403 && why403.contains(HTTPStreamBinding.proofHeader), "\(forbidden) \(why403)")
                #expect(try await post(onB, token: token, key: key, number: 1).0 == 204)
                // A POST another node already forwarded is not forwarded again.
                #expect(try await post(onB, token: token, key: key, number: 2, forwarded: true).0 == 404)
                // A's key with a session A does not have: A's 404 comes back through B.
                let nodeKey = try #require(HTTPStreamBinding.nodeKey(of: token))
                let (status, message) = try await post(onB, token: HTTPStreamBinding.makeToken(nodeKey: nodeKey))
                #expect(status == 404 && message.contains("no such session"), "\(status) \(message)")
                // A key no node has.
                #expect(try await post(onB, token: HTTPStreamBinding.makeToken(nodeKey: nodeKey &+ 1)).0 == 404)

                // The stream ends (its client closes it): A says 410 through B.
                stream.cancel()
                _ = await stream.result
                try await eventually("A remembers the stream ended") {
                    (try? await post(onA, token: token, key: key, number: 2).0) == 410
                }
                #expect(try await post(onB, token: token, key: key, number: 2).0 == 410)

                // Node C registered a stream URL where nothing listens: a POST for its stream
                // that B receives gets 502, with a sentence.
                let nowhere = "http://127.0.0.1:\(try await freePort())\(Endpoint.defaultHTTPStreamPath)"
                let c = try await harness.clusterNode(
                    "c",
                    url: url,
                    network: LocalNetwork(),
                    configure: { $0.configureListener(.httpStream) },
                    configureCluster: { $0.streamURL = nowhere }
                )
                let cKey = try #require(HTTPStreamBinding.nodeKey(of: try await Self.openStream(Self.streamURL(c)).token))
                let (unreachable, why) = try await post(onB, token: HTTPStreamBinding.makeToken(nodeKey: cKey))
                #expect(unreachable == 502 && why.contains("did not answer"), "\(unreachable) \(why)")

                // Node D has no stream forwarder: a POST for A's stream that D receives gets 502,
                // saying why.
                let d = try await harness.clusterNode(
                    "d",
                    url: url,
                    network: LocalNetwork(),
                    configure: { $0.configureListener(.httpStream) },
                    configureCluster: { $0.streamForwarder = nil }
                )
                let (unforwarded, whyNot) = try await post(
                    try await Self.streamURL(d),
                    token: HTTPStreamBinding.makeToken(nodeKey: nodeKey)
                )
                #expect(unforwarded == 502 && whyNot.contains("no stream forwarder"), "\(unforwarded) \(whyNot)")
            }
        }
    }
}
