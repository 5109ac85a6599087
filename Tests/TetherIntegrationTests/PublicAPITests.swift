import Foundation
import NIOCore
import Testing
import Tether
import TetherGateway
import TetherTestSupport

extension IntegrationTests {
    @Suite("The client's and the gateway's public API", .timeLimit(.minutes(1)))
    struct PublicAPITests {
        struct Enter: Codable, Sendable {
            var room: String
        }

        struct Entered: Codable, Sendable, Equatable {
            var room: String
            var members: Int
        }

        @Test("withTetherClient runs a client for its body and shuts it down when the body returns or throws")
        func scopedClient() async throws {
            struct Failed: Error {}
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                })
                let configuration = try ClientConfiguration(endpoints: ["tether://\(endpoint)"], clientID: "scoped")
                var seen: TetherClient?
                let reply = try await withTetherClient(configuration, logger: testLogger("scoped")) { client in
                    seen = client
                    return try await client.request("echo", body: ByteBuffer(string: "hi")).string
                }
                #expect(reply == "hi")
                #expect(seen?.connectionState == .shutDown, "shut down once the body returned")

                await #expect(throws: Failed.self) {
                    try await withTetherClient(configuration, logger: testLogger("scoped")) { client in
                        seen = client
                        _ = try await client.request("echo")
                        throw Failed()
                    }
                }
                #expect(seen?.connectionState == .shutDown, "shut down once the body threw")
            }
        }

        @Test("Data and JSON overloads: requests, handlers and pushes; a body that does not decode is a clear error")
        func codable() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("room.enter", json: Enter.self) { enter, context in
                        Entered(room: enter.room, members: 3)
                    }
                    gateway.handle("echo") { request, _ in request.body }
                })
                let client = try harness.client([endpoint], clientID: "json")
                let entered = try await client.request("room.enter", json: Enter(room: "lobby"), as: Entered.self)
                #expect(entered == Entered(room: "lobby", members: 3))
                #expect(try await client.request("echo", data: Data("raw".utf8)) == Data("raw".utf8))

                let invalid = await #expect(throws: TetherError.self) {
                    _ = try await client.request("room.enter", json: ["not": "an enter"], as: Entered.self)
                }
                #expect(invalid?.status == .invalidRequest, "the handler never ran")
                let undecodable = await #expect(throws: TetherError.self) {
                    _ = try await client.request("echo", json: Enter(room: "x"), as: Entered.self)
                }
                #expect(undecodable?.code == .invalidResponse)

                let pushes = client.pushes(topic: "score")
                var iterator = pushes.makeAsyncIterator()
                try gateway.push("score", json: Entered(room: "match", members: 2), to: .client("json"))
                let push = await iterator.next()
                #expect(try push?.decode(Entered.self) == Entered(room: "match", members: 2))

                // Channels: JSON published by the gateway and by a client, decoded by the subscriber.
                var events = client.subscribe("json.room").makeAsyncIterator()
                #expect(try await events.next() == .subscribed(recovered: true))
                try await gateway.publish(json: Entered(room: "json.room", members: 1), toChannel: "json.room")
                let event = try await events.next()
                guard case .publication(let first)? = event else {
                    Issue.record("not a publication: \(String(describing: event))")
                    return
                }
                #expect(try first.decode(Entered.self) == Entered(room: "json.room", members: 1))
                let refused = await #expect(throws: TetherError.self) {
                    try await client.publish(json: Enter(room: "x"), toChannel: "json.room")
                }
                #expect(refused?.status == .permissionDenied, "clients may not publish unless the channel's rule says so")
            }
        }

        @Test("the unknown-method answer reads as PROTOCOL.md's vector")
        func unknownMethodText() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway()
                let client = try harness.client([endpoint])
                let error = await #expect(throws: TetherError.self) { try await client.request("nope") }
                #expect(error?.status == .unknownMethod && error?.message == "no handler for 'nope'")
            }
        }
    }
}
