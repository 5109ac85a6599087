import NIOConcurrencyHelpers
import NIOCore
import SwiftProtobuf
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherProtobuf
import TetherTestSupport

/// Collects the pushes a client receives.
final class PushCollector: Sendable {
    private let received = NIOLockedValueBox<[Push]>([])

    init(_ client: TetherClient, topic: String? = nil, in harness: Harness) {
        let stream = client.pushes(topic: topic)
        harness.spawn {
            for await push in stream { self.received.withLockedValue { $0.append(push) } }
        }
    }

    var bodies: [String] { self.received.withLockedValue { $0.map(\.body.string) } }
    var topics: [String] { self.received.withLockedValue { $0.map(\.topic) } }
}

extension IntegrationTests {
    @Suite("Pushes", .timeLimit(.minutes(2)))
    struct PushTests {
        @Test("pushes reach a connection, all connections of a client id, a room, or everyone", arguments: Endpoint.Transport.allCases)
        func targets(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    transport: transport,
                    routes: { gateway in
                        gateway.handle("join") { request, context in
                            context.join(request.body.string)
                            return ByteBuffer(string: "ok")
                        }
                        gateway.handle("leave") { request, context in
                            context.leave(request.body.string)
                            return ByteBuffer(string: "ok")
                        }
                        gateway.handle("poke-me") { _, context in
                            try context.push("poke", ByteBuffer(string: "to you"))
                            return ByteBuffer(string: "ok")
                        }
                    }
                )
                let alicePhone = try harness.client([endpoint], clientID: "alice")
                let aliceLaptop = try harness.client([endpoint], clientID: "alice")
                let bob = try harness.client([endpoint], clientID: "bob")
                let phone = PushCollector(alicePhone, in: harness)
                let laptop = PushCollector(aliceLaptop, in: harness)
                let bobs = PushCollector(bob, in: harness)

                _ = try await alicePhone.request("join", body: ByteBuffer(string: "lobby"))
                _ = try await bob.request("join", body: ByteBuffer(string: "lobby"))
                _ = try await aliceLaptop.request("join", body: ByteBuffer(string: "kitchen"))
                #expect(gateway.members(of: "lobby").map(\.clientID).sorted() == ["alice", "bob"])

                #expect(try gateway.push("room", ByteBuffer(string: "lobby news"), to: .room("lobby")) == 2)
                #expect(try gateway.push("dm", ByteBuffer(string: "for alice"), to: .client("alice")) == 2)
                #expect(try gateway.push("all", ByteBuffer(string: "everyone"), to: .all) == 3)
                // A push from outside the connection's event loop is queued on it: a request read
                // in the same turn of the loop may be answered first. Poke once bob has them.
                try await eventually("bob has the room's and everyone's pushes") { bobs.bodies.count == 2 }
                _ = try await bob.request("poke-me")
                try await eventually("every push arrives") {
                    phone.bodies.count == 3 && laptop.bodies.count == 2 && bobs.bodies.count == 3
                }
                #expect(phone.bodies == ["lobby news", "for alice", "everyone"])
                #expect(laptop.bodies == ["for alice", "everyone"])
                #expect(bobs.bodies == ["lobby news", "everyone", "to you"])

                _ = try await bob.request("leave", body: ByteBuffer(string: "lobby"))
                #expect(try gateway.push("room", ByteBuffer(string: "after bob left"), to: .room("lobby")) == 1)
                try await eventually("alice gets it") { phone.bodies.count == 4 }
                // Pushes from one thread reach a connection in order: once bob has a push sent
                // after the room's, the room's would have arrived before it.
                #expect(try gateway.push("dm", ByteBuffer(string: "barrier"), to: .client("bob")) == 1)
                try await eventually("bob gets the push sent after the room's") { bobs.bodies.count == 4 }
                #expect(bobs.bodies == ["lobby news", "everyone", "to you", "barrier"], "bob left the room")
                _ = try await aliceLaptop.request("join", body: ByteBuffer(string: "lobby"))
                #expect(try gateway.push("room", ByteBuffer(string: "laptop joined"), to: .room("lobby")) == 2)
                try await eventually("both of alice's connections get it") { phone.bodies.count == 5 && laptop.bodies.count == 3 }
                #expect(try gateway.push("x", ByteBuffer(), to: .room("nobody-here")) == 0)
                #expect(throws: GatewayError.self) { try gateway.push("", ByteBuffer(), to: .all) }
            }
        }

        @Test("subscribers get only their topic; a closed connection leaves its rooms")
        func topicsAndCleanup() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("join") { request, context in
                        context.join(request.body.string)
                        return ByteBuffer()
                    }
                })
                let client = try harness.client([endpoint])
                let news = PushCollector(client, topic: "news", in: harness)
                let everything = PushCollector(client, in: harness)
                _ = try await client.request("join", body: ByteBuffer(string: "r"))
                try gateway.push("news", ByteBuffer(string: "n1"), to: .room("r"))
                try gateway.push("sports", ByteBuffer(string: "s1"), to: .room("r"))
                try await eventually("both arrive") { everything.bodies.count == 2 }
                #expect(news.bodies == ["n1"])
                #expect(everything.topics == ["news", "sports"])

                client.shutdown()
                try await eventually("the gateway forgets the connection") { gateway.connections.isEmpty }
                #expect(gateway.members(of: "r").isEmpty)
                #expect(try gateway.push("news", ByteBuffer(string: "n2"), to: .room("r")) == 0, "a push after the close reaches no one")
            }
        }

        @Test("a client that stops reading is closed as a slow consumer; the others keep getting pushes")
        func slowConsumer() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    configure: { $0.limits.maxBufferedOutboundBytes = 1 << 20 },
                    routes: { gateway in gateway.handle("echo") { request, _ in request.body } }
                )
                let healthy = try harness.client([endpoint], clientID: "healthy")
                let received = PushCollector(healthy, in: harness)
                _ = try await healthy.request("echo")
                let stuck = try await RawConnection.connect(to: endpoint)
                #expect(try await stuck.handshake(clientID: "stuck") != nil)
                try await stuck.stopReading()

                // 32 MiB: more than the kernel's socket buffers and the 1 MiB limit together.
                let chunk = ByteBuffer(repeating: 0x2A, count: 32 * 1024)
                for _ in 0..<1024 {
                    try gateway.push("bulk", chunk, to: .client("stuck"))
                }
                try await eventually("the gateway drops the stuck client") {
                    !gateway.connections.contains { $0.clientID == "stuck" }
                }
                try gateway.push("after", ByteBuffer(string: "still here"), to: .client("healthy"))
                try await eventually("the healthy client still gets pushes") { received.bodies.contains("still here") }
                stuck.close()
            }
        }

        @Test("rooms per connection and members per room are limited: a join beyond fails; a leave makes room")
        func roomLimits() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    configure: {
                        $0.limits.maxRoomsPerConnection = 2
                        $0.limits.maxMembersPerRoom = 2
                    },
                    routes: { gateway in
                        gateway.handle("join") { request, context in
                            ByteBuffer(string: context.join(String(buffer: request.body)) ? "in" : "refused")
                        }
                        gateway.handle("leave") { request, context in
                            context.leave(String(buffer: request.body))
                            return ByteBuffer()
                        }
                    }
                )
                let alice = try harness.client([endpoint], clientID: "alice")
                #expect(try await alice.request("join", body: ByteBuffer(string: "a")).string == "in")
                #expect(try await alice.request("join", body: ByteBuffer(string: "a")).string == "in", "already in: no new room")
                #expect(try await alice.request("join", body: ByteBuffer(string: "b")).string == "in")
                #expect(try await alice.request("join", body: ByteBuffer(string: "c")).string == "refused", "a third room")
                _ = try await alice.request("leave", body: ByteBuffer(string: "a"))
                #expect(try await alice.request("join", body: ByteBuffer(string: "c")).string == "in")

                let bob = try harness.client([endpoint], clientID: "bob")
                let carol = try harness.client([endpoint], clientID: "carol")
                #expect(try await bob.request("join", body: ByteBuffer(string: "c")).string == "in")
                #expect(try await carol.request("join", body: ByteBuffer(string: "c")).string == "refused", "a third member")
            }
        }

        @Test("an idle client that stops reading is closed within the close timeout, though its GOAWAY cannot be written")
        func idleClientThatStopsReading() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(configure: {
                    $0.timeouts.heartbeatInterval = .milliseconds(200)
                    $0.timeouts.idle = .milliseconds(600)
                    $0.timeouts.closeTimeout = .milliseconds(500)
                    $0.limits.maxBufferedOutboundBytes = 256 << 20  // no slow-consumer close: only the idle one
                })
                let stuck = try await RawConnection.connect(to: endpoint)
                #expect(try await stuck.handshake(clientID: "stuck") != nil)
                try await stuck.stopReading()
                // 16 MiB: more than the kernel's socket buffers, so the GOAWAY waits behind them.
                let chunk = ByteBuffer(repeating: 0x2A, count: 32 * 1024)
                for _ in 0..<512 { try gateway.push("bulk", chunk, to: .client("stuck")) }
                let started = ContinuousClock.now
                try await eventually("the gateway closes the connection", timeout: .seconds(10)) {
                    !gateway.connections.contains { $0.clientID == "stuck" }
                }
                #expect(ContinuousClock.now - started < .seconds(5), "idle (0.6 s) plus the close timeout (0.5 s), not for ever")
                stuck.close()
            }
        }

        @Test("a push or reply larger than the client accepts is not sent, and the connection survives")
        func oversizedPush() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                    gateway.handle("big") { _, _ in ByteBuffer(repeating: 1, count: 4096) }
                })
                let client = try harness.client([endpoint]) { $0.connection.maxBodySize = 2048 }
                let pushes = PushCollector(client, in: harness)
                _ = try await client.request("echo")
                try gateway.push("big", ByteBuffer(repeating: 0, count: 4096), to: .all)
                try gateway.push("small", ByteBuffer(string: "fits"), to: .all)
                try await eventually("the small push arrives") { pushes.bodies == ["fits"] }
                #expect(try await client.request("echo", body: ByteBuffer(string: "alive")).string == "alive")

                // The same for a reply: the request fails with a clear status, the connection stays.
                let error = await #expect(throws: TetherError.self) { try await client.request("big") }
                #expect(error?.status == .resourceExhausted)
                #expect(error?.message.contains("2048") == true)
                #expect(try await client.request("echo", body: ByteBuffer(string: "still")).string == "still")
            }
        }
    }

}

extension IntegrationTests {
    @Suite("Protobuf conveniences", .timeLimit(.minutes(2)))
    struct ProtobufTests {
        static let shout = ProtobufMethod<Google_Protobuf_StringValue, Google_Protobuf_StringValue>("shout")

        @Test("typed requests, handlers and pushes round-trip protobuf messages")
        func typed() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle(Self.shout) { message, _ in
                        Google_Protobuf_StringValue(message.value.uppercased())
                    }
                    gateway.handle("length", as: Google_Protobuf_StringValue.self) { message, _ in
                        Google_Protobuf_Int64Value(Int64(message.value.count))
                    }
                    gateway.handle("not-protobuf") { _, _ in ByteBuffer(bytes: [0xFF, 0xFF, 0xFF]) }
                })
                let client = try harness.client([endpoint])
                let pushes = PushCollector(client, topic: "typed", in: harness)

                #expect(try await client.call(Self.shout, Google_Protobuf_StringValue("hi")).value == "HI")
                let length: Google_Protobuf_Int64Value = try await client.request("length", Google_Protobuf_StringValue("four"))
                #expect(length.value == 4)

                let invalidRequest = await #expect(throws: TetherError.self) {
                    _ = try await client.request("shout", body: ByteBuffer(bytes: [0xFF, 0xFF]))
                }
                #expect(invalidRequest?.status == .invalidRequest)

                let invalidResponse = await #expect(throws: TetherError.self) {
                    let _: Google_Protobuf_StringValue = try await client.request("not-protobuf", Google_Protobuf_StringValue("x"))
                }
                #expect(invalidResponse?.code == .invalidResponse)

                try gateway.push("typed", Google_Protobuf_StringValue("pushed"), to: .all)
                try await eventually("the typed push arrives") { pushes.bodies.count == 1 }

                // A channel's publication, typed both ways.
                let reader = IntegrationTests.ClientChannelTests.Reader(client.subscribe("typed.channel"), in: harness)
                try await eventually("subscribed") { reader.subscriptions == [true] }
                let position = try await gateway.publish(Google_Protobuf_StringValue("published"), toChannel: "typed.channel")
                try await eventually("the typed publication arrives") { reader.publications.count == 1 }
                #expect(try reader.publications[0].decode(as: Google_Protobuf_StringValue.self).value == "published")
                #expect(reader.publications[0].position == position)
            }
        }
    }
}
