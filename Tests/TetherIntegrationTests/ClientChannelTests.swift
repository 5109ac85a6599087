import Foundation
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

            var publications: [ChannelPublication] {
                self.events.compactMap { if case .publication(let publication) = $0 { publication } else { nil } }
            }

            var subscriptions: [Bool] { self.events.compactMap { if case .subscribed(let recovered) = $0 { recovered } else { nil } } }
        }

        /// bob, subscribed to room.lobby through a fault proxy in front of `endpoint`: ``leave()``
        /// cuts him off (new connections refused) until ``comeBack()``.
        struct AwayClient {
            let proxy: TCPFaultProxy
            let bob: TetherClient
            let reader: Reader
            let events: EventRecorder

            static func start(_ harness: Harness, endpoint: Endpoint, presence: Bool = false) async throws -> AwayClient {
                let proxy = TCPFaultProxy(upstream: endpoint)
                let address = try await proxy.start()
                harness.onExit { proxy.cutAll() }
                let bob = try harness.client(
                    [Endpoint(host: "127.0.0.1", port: address.port!, transport: endpoint.transport)],
                    clientID: "bob"
                )
                let away = AwayClient(
                    proxy: proxy,
                    bob: bob,
                    reader: Reader(bob.subscribe("room.lobby", presence: presence), in: harness),
                    events: harness.events(of: bob)
                )
                try await eventually("bob is subscribed") { away.reader.subscriptions == [true] }
                return away
            }

            /// Cuts bob's connection and returns once he noticed.
            func leave() async throws {
                self.proxy.mode = .refuse
                self.proxy.cutAll()
                try await eventually("bob notices") { !self.events.disconnectReasons.isEmpty }
            }

            func comeBack() {
                self.proxy.mode = .forward
            }
        }

        static func publish(_ gateway: Gateway, _ range: ClosedRange<Int>, to channel: String = "room.lobby") async throws {
            for index in range { try await gateway.publish(ByteBuffer(string: "msg-\(index)"), toChannel: channel, publisher: "alice") }
        }

        @Test(
            "bob's connection is cut while alice publishes: on reconnect he gets what he missed, then the live ones, each once, in order",
            arguments: Endpoint.Transport.allCases
        )
        func recoversAcrossCut(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(transport: transport)
                let away = try await AwayClient.start(harness, endpoint: endpoint)
                let reader = away.reader
                try await Self.publish(gateway, 1...20)
                try await eventually("bob has the first 20") { reader.bodies.count == 20 }

                try await away.leave()
                try await Self.publish(gateway, 21...75)  // while bob is away
                away.comeBack()
                try await eventually("bob subscribed again") { reader.subscriptions == [true, true] }
                try await Self.publish(gateway, 76...80)
                try await eventually("bob has all 80", timeout: .seconds(20)) { reader.bodies.count >= 80 }
                #expect(reader.bodies == (1...80).map { "msg-\($0)" })
                #expect(reader.gaps.isEmpty)
                await away.proxy.stop()
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
                let away = try await AwayClient.start(harness, endpoint: endpoint)
                let reader = away.reader
                try await Self.publish(gateway, 1...5)
                try await eventually("bob has 5") { reader.bodies.count == 5 }
                try await away.leave()
                try await Self.publish(gateway, 6...40)  // 30 of them are gone by the time he is back
                away.comeBack()
                try await eventually("bob has what is kept", timeout: .seconds(20)) { reader.bodies.count >= 15 }
                #expect(reader.gaps.map(\.missed) == [25], "6...30 are lost")
                #expect(reader.bodies == (1...5).map { "msg-\($0)" } + (31...40).map { "msg-\($0)" })
                await away.proxy.stop()
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
                try await Self.publish(gateway, 1...300)
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

extension IntegrationTests.ClientChannelTests {
    @Test("history pages: the latest ones, the ones after a position in pages, a gap past what is kept, refusals")
    func historyPages() async throws {
        try await withHarness { harness in
            let (gateway, endpoint) = try await harness.gateway(
                configure: { configuration in
                    configuration.channels = try! .init(rules: [
                        .init(pattern: try! ChannelPattern("live.*"), history: nil),
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: 50, maxAge: .seconds(60))),
                    ])
                },
                routes: { gateway in gateway.authorize { access, _ in access != .subscribe(channel: "room.secret") } }
            )
            let bob = try harness.client([endpoint], clientID: "bob")
            try await Self.publish(gateway, 1...80)  // keeps 31...80

            let latest = try await bob.history(of: "room.lobby", limit: 10)
            #expect(latest.publications.map { String(buffer: $0.body) } == (71...80).map { "msg-\($0)" })
            #expect(latest.top == 80 && latest.gap == nil && !latest.more && latest.epoch != 0)
            #expect(latest.publications.allSatisfy { $0.publisher == "alice" && $0.channel == "room.lobby" })

            var position = ChannelPosition(epoch: latest.epoch, offset: 40)
            var read: [UInt64] = []
            var pages = 0
            while true {
                let page = try await bob.history(of: "room.lobby", after: position, limit: 15)
                pages += 1
                read += page.publications.map(\.position.offset)
                guard page.more, let last = page.publications.last else { break }
                position = last.position
            }
            #expect(read == Array(41...80) && pages == 3)

            let behind = try await bob.history(of: "room.lobby", after: ChannelPosition(epoch: latest.epoch, offset: 5), limit: 1_000)
            #expect(behind.gap?.missed == 25 && behind.publications.first?.position.offset == 31 && behind.publications.count == 50)
            #expect(try await gateway.history(of: "room.lobby", limit: 3).publications.map(\.position.offset) == [78, 79, 80])

            let none = try await bob.history(of: "live.scores")
            #expect(none.epoch == 0 && none.publications.isEmpty)

            await #expect {
                _ = try await bob.history(of: "room.secret")
            } throws: { ($0 as? TetherError)?.status == .permissionDenied }
            await #expect {
                _ = try await bob.history(of: "room.lobby", limit: 0)
            } throws: { ($0 as? TetherError)?.code == .invalidArgument }
        }
    }
}

extension IntegrationTests.ClientChannelTests {
    @Test("a client publishes where the channel's rule and its credentials allow, as itself; elsewhere it is refused")
    func clientPublishes() async throws {
        try await withHarness { harness in
            let (_, endpoint) = try await harness.gateway(
                configure: { configuration in
                    configuration.channels = try! .init(rules: [
                        .init(pattern: try! ChannelPattern("news.*"), history: try! ChannelRetention(maxCount: 10, maxAge: .seconds(60))),
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: 10, maxAge: .seconds(60)), clientsMayPublish: true),
                    ])
                },
                routes: { gateway in gateway.authorize { access, _ in access != .publish(channel: "room.quiet") } }
            )
            let alice = try harness.client([endpoint], clientID: "alice")
            let bob = try harness.client([endpoint], clientID: "bob")
            let reader = Reader(bob.subscribe("room.lobby"), in: harness)
            try await eventually("bob is subscribed") { reader.subscriptions == [true] }
            let first = try await alice.publish(ByteBuffer(string: "hi bob"), toChannel: "room.lobby")
            let second = try await alice.publish(ByteBuffer(string: "still there?"), toChannel: "room.lobby")
            #expect(first.offset == 1 && second.offset == 2 && first.epoch == second.epoch && first.epoch != 0)
            try await eventually("bob has both") { reader.bodies == ["hi bob", "still there?"] }
            let publishers = reader.events.compactMap { if case .publication(let message) = $0 { message.publisher } else { nil } }
            #expect(publishers == ["alice", "alice"])

            await #expect {
                try await alice.publish(ByteBuffer(string: "breaking"), toChannel: "news.today")
            } throws: { ($0 as? TetherError)?.status == .permissionDenied }
            await #expect {
                try await alice.publish(ByteBuffer(string: "psst"), toChannel: "room.quiet")
            } throws: { ($0 as? TetherError)?.status == .permissionDenied }
            await #expect {
                try await alice.publish(ByteBuffer(), toChannel: "")
            } throws: { ($0 as? TetherError)?.code == .invalidArgument }
        }
    }
}

extension IntegrationTests.ClientChannelTests {
    /// Gives each client the info "I-" followed by its id.
    struct InfoAuthenticator: ClientAuthenticator {
        func authenticate(_ hello: HandshakeInfo) async throws -> ClientIdentity {
            ClientIdentity(clientID: hello.clientID, info: "I-\(hello.clientID)")
        }
    }

    /// A gateway whose channels keep presence (but `quiet.*`), its clients' info "I-" and their
    /// id, and mallory not allowed to see room.lobby's.
    static func presenceGateway(_ harness: Harness) async throws -> (Gateway, Endpoint) {
        try await harness.gateway(
            configure: { configuration in
                configuration.channels = try! .init(rules: [
                    .init(pattern: try! ChannelPattern("quiet.*"), history: nil),
                    .init(pattern: .all, history: nil, presence: true),
                ])
            },
            authenticator: InfoAuthenticator(),
            routes: { gateway in
                gateway.authorize { access, connection in access != .presence(channel: "room.lobby") || connection.clientID != "mallory" }
            }
        )
    }

    @Test("presence: who is subscribed, each client once with its connections and info, in client id order; it follows who leaves")
    func presence() async throws {
        try await withHarness { harness in
            let (gateway, endpoint) = try await Self.presenceGateway(harness)
            var readers: [Reader] = []
            for clientID in ["carol", "alice", "bob", "alice"] {  // alice on two devices
                let client = try harness.client([endpoint], clientID: clientID)
                readers.append(Reader(client.subscribe("room.lobby"), in: harness))
            }
            let all = readers
            try await eventually("everyone is subscribed") { all.allSatisfy { $0.subscriptions == [true] } }
            let dave = try harness.client([endpoint], clientID: "dave")
            let page = try await dave.presence(of: "room.lobby")
            #expect(page.total == 3)
            #expect(
                page.members == [
                    .init(clientID: "alice", connections: 2, info: "I-alice"), .init(clientID: "bob", connections: 1, info: "I-bob"),
                    .init(clientID: "carol", connections: 1, info: "I-carol"),
                ]
            )
            let second = try await dave.presence(of: "room.lobby", after: "alice", limit: 1)
            #expect(second.total == 3 && second.members.map(\.clientID) == ["bob"])
            #expect(try gateway.presence(of: "room.lobby").members.map(\.clientID) == ["alice", "bob", "carol"])

            let bob = try harness.client([endpoint], clientID: "bob2")
            let leaving = Task { for try await _ in bob.subscribe("room.lobby") {} }
            try await eventually("bob2 is in") { (try? await dave.presence(of: "room.lobby").total) == 4 }
            leaving.cancel()  // the subscription ends with the task reading it
            try await eventually("bob2 left") { (try? await dave.presence(of: "room.lobby").total) == 3 }

            await #expect {
                _ = try await dave.presence(of: "quiet.room")
            } throws: { ($0 as? TetherError)?.status == .invalidRequest }
            let mallory = try harness.client([endpoint], clientID: "mallory")
            await #expect {
                _ = try await mallory.presence(of: "room.lobby")
            } throws: { ($0 as? TetherError)?.status == .permissionDenied }
            #expect(throws: GatewayError.self) { try gateway.presence(of: "quiet.room") }
        }
    }
}

extension IntegrationTests.ClientChannelTests.Reader {
    /// Who is in the channel, folded from the presence events since the last `.subscribed`.
    var members: [String: String] {
        var members: [String: String] = [:]
        for event in self.events {
            switch event {
            case .subscribed: members = [:]
            case .joined(let clientID, let info): members[clientID] = info
            case .left(let clientID): members[clientID] = nil
            case .publication, .gap: break
            }
        }
        return members
    }

    /// The presence events, as "+client" and "-client".
    var presence: [String] {
        self.events.compactMap {
            switch $0 {
            case .joined(let clientID, _): "+\(clientID)"
            case .left(let clientID): "-\(clientID)"
            default: nil
            }
        }
    }
}

extension IntegrationTests.ClientChannelTests {
    @Test(
        "presence events: the members first, then joins and leaves, one per client whatever its devices, across a reconnect; refused where the channel or the client may not"
    )
    func presenceEvents() async throws {
        try await withHarness { harness in
            let (_, endpoint) = try await Self.presenceGateway(harness)
            let carol = try harness.client([endpoint], clientID: "carol")
            let carolIn = Reader(carol.subscribe("room.lobby"), in: harness)
            try await eventually("carol is subscribed") { carolIn.subscriptions == [true] }

            let away = try await AwayClient.start(harness, endpoint: endpoint, presence: true)
            try await eventually("bob sees carol and himself") { away.reader.members == ["bob": "I-bob", "carol": "I-carol"] }
            var devices: [Task<Void, any Error>] = []
            let subscribed = NIOLockedValueBox(0)
            for _ in 0..<2 {  // alice on two devices: one member
                let alice = try harness.client([endpoint], clientID: "alice")
                devices.append(
                    Task {
                        for try await event in alice.subscribe("room.lobby") {
                            if case .subscribed = event { subscribed.withLockedValue { $0 += 1 } }
                        }
                    }
                )
            }
            // Both devices, not the first alone: one leaving first would be a leave and a join.
            try await eventually("both of alice's devices are subscribed") { subscribed.withLockedValue { $0 } == 2 }
            try await eventually("bob sees alice") { away.reader.members.keys.sorted() == ["alice", "bob", "carol"] }
            devices[0].cancel()
            try await Task.sleep(for: .milliseconds(200))
            #expect(away.reader.members.keys.sorted() == ["alice", "bob", "carol"], "alice is still there on her other device")
            devices[1].cancel()
            try await eventually("bob sees alice leave") { away.reader.members.keys.sorted() == ["bob", "carol"] }
            #expect(away.reader.presence.filter { $0.hasSuffix("alice") } == ["+alice", "-alice"], "one join and one leave")
            // A client that stops: its connection closes, it leaves.
            let dave = try harness.client([endpoint], clientID: "dave")
            let daveIn = Reader(dave.subscribe("room.lobby", presence: true), in: harness)
            try await eventually("dave is subscribed") { daveIn.subscriptions == [true] }
            try await eventually("bob sees dave") { away.reader.members["dave"] != nil }
            dave.shutdown()
            try await eventually("bob sees dave leave") { away.reader.members["dave"] == nil }

            // bob away: carol leaves meanwhile; back, bob's members are the channel's again.
            try await away.leave()
            carol.shutdown()
            try await Task.sleep(for: .milliseconds(200))
            away.comeBack()
            try await eventually("bob is back, carol gone") {
                away.reader.subscriptions.count == 2 && away.reader.members == ["bob": "I-bob"]
            }

            let refusedQuiet = Reader(away.bob.subscribe("quiet.room", presence: true), in: harness)
            let mallory = try harness.client([endpoint], clientID: "mallory")
            let refusedMallory = Reader(mallory.subscribe("room.lobby", presence: true), in: harness)
            try await eventually("both refused") { refusedQuiet.ended && refusedMallory.ended }
            #expect((refusedQuiet.error as? TetherError)?.status == .invalidRequest)
            #expect((refusedMallory.error as? TetherError)?.status == .permissionDenied)
        }
    }
}

extension IntegrationTests.ClientChannelTests {
    @Test(
        "positions kept in the client's SQLite file: an app started again resumes after the last publication it handled, with no position of its own"
    )
    func positionsKept() async throws {
        try await withHarness { harness in
            let (gateway, endpoint) = try await harness.gateway()
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("positions-\(UUID().uuidString).sqlite").path
            let store = try SQLiteOutboxStore(path: path)
            let channels = try ClientConfiguration.Channels(positions: store, saveInterval: .zero)
            func launch() throws -> TetherClient {
                try harness.client([endpoint], clientID: "bob") { $0.channels = channels }
            }
            // First launch: bob handles 1…5 and quits while handling the 5th.
            let first = try launch()
            let handled = NIOLockedValueBox<[String]>([])
            let subscribed = NIOLockedValueBox(false)
            let reading = Task {
                for try await event in first.subscribe("room.lobby") {
                    if case .subscribed = event { subscribed.withLockedValue { $0 = true } }
                    guard case .publication(let publication) = event else { continue }
                    handled.withLockedValue { $0.append(String(buffer: publication.body)) }
                    if handled.withLockedValue({ $0.count }) == 5 { return }
                }
            }
            try await eventually("bob is subscribed") { subscribed.withLockedValue { $0 } }
            try await Self.publish(gateway, 1...8)
            try await reading.value
            first.shutdown()
            #expect(handled.withLockedValue { $0 } == (1...5).map { "msg-\($0)" })
            try await Self.publish(gateway, 9...12)

            // Second launch, no position passed: from the kept one (4, the last the app asked
            // past), so 5 comes again (it was being handled) and nothing is missed.
            let second = try launch()
            let again = Reader(second.subscribe("room.lobby"), in: harness)
            try await eventually("bob resumes") { again.bodies.count >= 8 }
            #expect(again.bodies == (5...12).map { "msg-\($0)" })
            #expect(again.subscriptions == [true] && again.gaps.isEmpty)
            #expect(try await store.channelPosition(of: "room.lobby")?.offset ?? 0 >= 4)
        }
    }
}
