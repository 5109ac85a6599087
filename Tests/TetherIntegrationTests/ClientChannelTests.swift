import NIOConcurrencyHelpers
import NIOCore
import Testing
import Tether
import TetherGateway
import TetherGatewayTesting
import TetherTestSupport

extension IntegrationTests {
    /// `client.subscribe` against a real gateway: recovery across cut connections, gaps,
    /// refusals, a reader that falls behind.
    @Suite("Channels on the client", .timeLimit(.minutes(2)))
    struct ClientChannelTests {
        /// The events of a subscription, read by a task of the harness.
        final class Reader: Sendable {
            private let state = NIOLockedValueBox<(events: [SubscriptionEvent], error: (any Error)?, ended: Bool)>(([], nil, false))

            init(_ subscription: ChannelSubscription, in harness: Harness, paused: NIOLockedValueBox<Bool>? = nil) {
                harness.spawn("a channel subscription's reader") {
                    do {
                        for try await event in subscription {
                            while paused?.withLockedValue({ $0 }) == true { try? await Task.sleep(for: .milliseconds(5)) }
                            self.state.withLockedValue { $0.events.append(event) }
                        }
                    } catch {
                        self.state.withLockedValue { $0.error = error }
                    }
                    self.state.withLockedValue { $0.ended = true }
                }
            }

            var events: [SubscriptionEvent] { self.state.withLockedValue { $0.events } }
            var error: (any Error)? { self.state.withLockedValue { $0.error } }
            var ended: Bool { self.state.withLockedValue { $0.ended } }

            var bodies: [String] {
                self.events.compactMap { if case .publication(let publication) = $0 { String(buffer: publication.body) } else { nil } }
            }

            var gaps: [ChannelGap] { self.events.compactMap { if case .gap(let gap) = $0 { gap } else { nil } } }

            var subscriptions: [Bool] { self.events.compactMap { if case .subscribed(let recovered) = $0 { recovered } else { nil } } }
        }

        static func publish(_ gateway: Gateway, _ range: ClosedRange<Int>, to channel: String = "room.lobby") throws {
            for index in range { try gateway.publish(ByteBuffer(string: "msg-\(index)"), toChannel: channel, publisher: "alice") }
        }

        @Test(
            "bob's connection is cut while alice publishes: on reconnect he gets what he missed, then the live ones, each once, in order",
            arguments: Endpoint.Transport.allCases
        )
        func recoversAcrossCut(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(transport: transport)
                let proxy = TCPFaultProxy(upstream: endpoint)
                let address = try await proxy.start()
                harness.onExit { proxy.cutAll() }
                let bob = try harness.client([Endpoint(host: "127.0.0.1", port: address.port!, transport: transport)], clientID: "bob")
                let events = harness.events(of: bob)
                let reader = Reader(bob.subscribe("room.lobby"), in: harness)
                try await eventually("bob is subscribed") { reader.subscriptions == [true] }
                try Self.publish(gateway, 1...20)
                try await eventually("bob has the first 20") { reader.bodies.count == 20 }

                proxy.mode = .refuse
                proxy.cutAll()
                try await eventually("bob notices") { !events.disconnectReasons.isEmpty }
                try Self.publish(gateway, 21...75)  // while bob is away
                proxy.mode = .forward
                try await eventually("bob subscribed again") { reader.subscriptions == [true, true] }
                try Self.publish(gateway, 76...80)
                try await eventually("bob has all 80", timeout: .seconds(20)) { reader.bodies.count >= 80 }
                #expect(reader.bodies == (1...80).map { "msg-\($0)" })
                #expect(reader.gaps.isEmpty)
                await proxy.stop()
            }
        }

        @Test("when the history no longer reaches back, bob is told how many he missed, then gets what is kept")
        func reportsGap() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(configure: { configuration in
                    configuration.channels = try! .init(rules: [
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: 10, maxAge: .seconds(60)))
                    ])
                })
                let proxy = TCPFaultProxy(upstream: endpoint)
                let address = try await proxy.start()
                harness.onExit { proxy.cutAll() }
                let bob = try harness.client([Endpoint(host: "127.0.0.1", port: address.port!)], clientID: "bob")
                let events = harness.events(of: bob)
                let reader = Reader(bob.subscribe("room.lobby"), in: harness)
                try await eventually("bob is subscribed") { reader.subscriptions == [true] }
                try Self.publish(gateway, 1...5)
                try await eventually("bob has 5") { reader.bodies.count == 5 }
                proxy.mode = .refuse
                proxy.cutAll()
                try await eventually("bob notices") { !events.disconnectReasons.isEmpty }
                try Self.publish(gateway, 6...40)  // 30 of them are gone by the time he is back
                proxy.mode = .forward
                try await eventually("bob has what is kept", timeout: .seconds(20)) { reader.bodies.count >= 15 }
                #expect(reader.gaps.map(\.missed) == [25], "6...30 are lost")
                #expect(reader.bodies == (1...5).map { "msg-\($0)" } + (31...40).map { "msg-\($0)" })
                await proxy.stop()
            }
        }

        @Test("a reader far behind its buffer loses nothing: the subscription recovers from the channel's history")
        func slowReader() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway()
                let bob = try harness.client([endpoint], clientID: "bob")
                let paused = NIOLockedValueBox(false)
                let reader = Reader(bob.subscribe("room.lobby", bufferSize: 8), in: harness, paused: paused)
                try await eventually("bob is subscribed") { reader.subscriptions == [true] }
                paused.withLockedValue { $0 = true }
                try Self.publish(gateway, 1...300)
                try await Task.sleep(for: .milliseconds(300))
                paused.withLockedValue { $0 = false }
                try await eventually("bob has all 300", timeout: .seconds(20)) { reader.bodies.count >= 300 }
                #expect(reader.bodies == (1...300).map { "msg-\($0)" })
                #expect(reader.gaps.isEmpty)
            }
        }

        @Test("a subscription the gateway refuses ends with its status; a second subscription to a channel ends at once")
        func refusals() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.authorize { access, _ in access != .subscribe(channel: "room.secret") }
                })
                let bob = try harness.client([endpoint], clientID: "bob")
                let secret = Reader(bob.subscribe("room.secret"), in: harness)
                try await eventually("refused") { secret.ended }
                #expect((secret.error as? TetherError)?.status == .permissionDenied)

                let lobby = Reader(bob.subscribe("room.lobby"), in: harness)
                try await eventually("subscribed") { lobby.subscriptions == [true] }
                let again = Reader(bob.subscribe("room.lobby"), in: harness)
                try await eventually("the second one ends") { again.ended }
                #expect((again.error as? TetherError)?.code == .invalidArgument)
                let unnamed = Reader(bob.subscribe(""), in: harness)
                try await eventually("a bad name ends it") { unnamed.ended }
                #expect((unnamed.error as? TetherError)?.code == .invalidArgument)
                #expect(!lobby.ended)
            }
        }
    }
}
