import NIOConcurrencyHelpers
import NIOCore
import Testing
import TetherCore
import TetherGateway
import TetherTestSupport

extension IntegrationTests {
    /// Channels on the gateway (PROTOCOL.md, section 12), driven by raw frames over TCP.
    @Suite("Channels on the gateway", .timeLimit(.minutes(2)))
    struct ChannelTests {
        struct Failure: Error, CustomStringConvertible {
            var description: String
            init(_ description: String) { self.description = description }
        }

        /// Subscribes and returns the SUBSCRIBED.
        static func subscribe(
            _ connection: RawConnection,
            _ channel: String,
            id: UInt64 = 1,
            from position: ChannelPosition? = nil
        ) async throws -> Frame.Subscribed {
            try await connection.send(.subscribe(.init(id: id, channel: channel, recoverFrom: position)))
            guard case .subscribed(let subscribed)? = await connection.next(where: { if case .subscribed = $0 { true } else { false } })
            else { throw Failure("no SUBSCRIBED for \(channel)") }
            #expect(subscribed.id == id)
            return subscribed
        }

        /// The next `count` PUBLICATIONs.
        static func publications(_ connection: RawConnection, count: Int) async -> [Frame.Publication] {
            var publications: [Frame.Publication] = []
            while publications.count < count,
                case .publication(let publication)? = await connection.next(where: { if case .publication = $0 { true } else { false } })
            {
                publications.append(publication)
            }
            return publications
        }

        static func connect(_ endpoint: Endpoint, clientID: String = "raw") async throws -> RawConnection {
            let connection = try await RawConnection.connect(to: endpoint)
            let welcome = try await connection.handshake(clientID: clientID, features: [.checksum, .channels])
            #expect(welcome?.features.contains(.channels) == true)
            return connection
        }

        static func publish(_ gateway: Gateway, _ range: ClosedRange<Int>, to channel: String = "room.lobby") async throws {
            for index in range { try await gateway.publish(ByteBuffer(string: "msg-\(index)"), toChannel: channel, publisher: "alice") }
        }

        @Test("a subscriber gets what is published from then on, numbered 1, 2, 3 in the channel's epoch")
        func live() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway()
                let bob = try await Self.connect(endpoint)
                let subscribed = try await Self.subscribe(bob, "room.lobby")
                #expect(subscribed.status == .ok && subscribed.epoch != 0 && subscribed.startingAfter == 0 && !subscribed.gap)
                try await Self.publish(gateway, 1...3)
                let received = await Self.publications(bob, count: 3)
                #expect(received.map(\.position.offset) == [1, 2, 3])
                #expect(
                    received.allSatisfy { $0.position.epoch == subscribed.epoch && $0.publisher == "alice" && $0.channel == "room.lobby" }
                )
                #expect(received.map { String(buffer: $0.body) } == ["msg-1", "msg-2", "msg-3"])
                bob.close()
            }
        }

        @Test("a subscriber that comes back with its position gets what it missed, then the live ones, each offset once")
        func recovery() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway()
                let first = try await Self.connect(endpoint, clientID: "bob")
                let epoch = try await Self.subscribe(first, "room.lobby").epoch
                try await Self.publish(gateway, 1...5)
                #expect(await Self.publications(first, count: 5).map(\.position.offset) == [1, 2, 3, 4, 5])
                first.close()
                try await first.waitForClose()
                try await Self.publish(gateway, 6...10)  // bob is away

                let second = try await Self.connect(endpoint, clientID: "bob")
                let subscribed = try await Self.subscribe(second, "room.lobby", from: ChannelPosition(epoch: epoch, offset: 5))
                #expect(subscribed.status == .ok && subscribed.epoch == epoch && subscribed.startingAfter == 5 && !subscribed.gap)
                try await Self.publish(gateway, 11...12)
                let received = await Self.publications(second, count: 7)
                #expect(received.map(\.position.offset) == Array(6...12))
                #expect(received.map { String(buffer: $0.body) } == (6...12).map { "msg-\($0)" })
                second.close()
            }
        }

        @Test(
            "when history no longer reaches back, SUBSCRIBED says gap and the count follows from its offsets; another epoch is an unknown gap"
        )
        func gap() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(configure: { configuration in
                    configuration.channels = try! .init(rules: [
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: 3, maxAge: .seconds(60)))
                    ])
                })
                let bob = try await Self.connect(endpoint)
                let epoch = try await Self.subscribe(bob, "room.lobby").epoch
                try await bob.send(.unsubscribe(.init(channel: "room.lobby")))
                try await Self.publish(gateway, 1...10)  // keeps 8, 9, 10

                let behind = try await Self.subscribe(bob, "room.lobby", id: 2, from: ChannelPosition(epoch: epoch, offset: 2))
                #expect(behind.gap && behind.startingAfter == 7, "offsets 3...7 are lost: 5 of them")
                #expect(await Self.publications(bob, count: 3).map(\.position.offset) == [8, 9, 10])

                let stranger = try await Self.subscribe(bob, "room.lobby", id: 3, from: ChannelPosition(epoch: epoch &+ 1, offset: 9))
                #expect(stranger.gap && stranger.epoch == epoch && stranger.startingAfter == 7)
                #expect(await Self.publications(bob, count: 3).map(\.position.offset) == [8, 9, 10])

                let current = try await Self.subscribe(bob, "room.lobby", id: 4, from: ChannelPosition(epoch: epoch, offset: 10))
                #expect(!current.gap && current.startingAfter == 10)
                bob.close()
            }
        }

        /// Where the channels' history is kept in a test that runs with both.
        enum Kept: String, CaseIterable, CustomStringConvertible {
            case memory, store
            var description: String { self.rawValue }

            /// A gateway whose channels keep their last `maxCount` in memory or in its store.
            func gateway(_ harness: Harness, maxCount: Int = 1_000, pageSize: Int = 256) async throws -> (Gateway, Endpoint) {
                let storage: GatewayConfiguration.Channels.Storage = self == .memory ? .memory : .store
                return try await harness.gateway(
                    messageStore: self == .store ? try SQLiteMessageStore.inMemory() : nil,
                    configure: { configuration in
                        configuration.channels = try! .init(
                            rules: [
                                .init(
                                    pattern: .all,
                                    history: try! ChannelRetention(maxCount: maxCount, maxAge: .seconds(60)),
                                    storage: storage
                                )
                            ],
                            recoveryPageSize: pageSize
                        )
                    }
                )
            }
        }

        @Test(
            "a recovery longer than a page goes in pages while publications go on: every offset once, in order",
            arguments: Kept.allCases
        )
        func pages(kept: Kept) async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await kept.gateway(harness, maxCount: 10_000, pageSize: 7)
                let bob = try await Self.connect(endpoint)
                let epoch = try await Self.subscribe(bob, "room.lobby").epoch
                try await bob.send(.unsubscribe(.init(channel: "room.lobby")))
                try await Self.publish(gateway, 1...500)
                let publisher = Task {
                    for index in 501...1_000 {
                        try await gateway.publish(ByteBuffer(string: "msg-\(index)"), toChannel: "room.lobby")
                        if index % 50 == 0 { await Task.yield() }
                    }
                }
                let subscribed = try await Self.subscribe(bob, "room.lobby", id: 2, from: ChannelPosition(epoch: epoch, offset: 0))
                #expect(!subscribed.gap && subscribed.startingAfter == 0)
                try await publisher.value
                let offsets = await Self.publications(bob, count: 1_000).map(\.position.offset)
                let wrong = zip(offsets, 1...1_000).first { $0.0 != UInt64($0.1) }
                #expect(
                    offsets.count == 1_000 && wrong == nil,
                    "\(offsets.count) received; first out of place: \(String(describing: wrong))"
                )
                bob.close()
            }
        }

        @Test(
            "after each SUBSCRIBED of a resubscription, while another thread publishes, only offsets past its start arrive, contiguous",
            arguments: Kept.allCases
        )
        func resubscribeWhilePublishing(kept: Kept) async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await kept.gateway(harness)
                let bob = try await Self.connect(endpoint)
                #expect(try await Self.subscribe(bob, "room.lobby").status == .ok)
                let publisher = Task.detached {
                    for index in 1...4_000 {
                        try await gateway.publish(ByteBuffer(string: "\(index)"), toChannel: "room.lobby")
                        if index % 200 == 0 { try await Task.sleep(for: .milliseconds(1)) }
                    }
                }
                var id: UInt64 = 1
                var awaiting = false
                var last: UInt64 = 0
                var resubscriptions = 0
                var misplaced: [String] = []
                while last < 4_000, let frame = await bob.next() {
                    switch frame.payload {
                    case .publication(let publication) where !awaiting:
                        // As a client does, between its SUBSCRIBE and the SUBSCRIBED it drops
                        // what arrives; after it, every offset must follow the last.
                        if publication.position.offset != last + 1 { misplaced.append("\(publication.position.offset) after \(last)") }
                        last = publication.position.offset
                        if last % 150 == 0, last < 3_900 {
                            id += 1
                            resubscriptions += 1
                            awaiting = true
                            try await bob.send(.subscribe(.init(id: id, channel: "room.lobby")))
                        }
                    case .subscribed(let subscribed) where subscribed.id == id:
                        awaiting = false
                        last = subscribed.startingAfter  // what it sends next follows this
                    default:
                        break
                    }
                }
                try await publisher.value
                #expect(resubscriptions > 10)
                #expect(misplaced.isEmpty, "\(misplaced.prefix(5))")
                bob.close()
            }
        }

        @Test("a client may subscribe only where its credentials and the authorize hook allow; refusals say why")
        func authorization() async throws {
            struct Restricted: ClientAuthenticator {
                func authenticate(_ hello: HandshakeInfo) async throws -> ClientIdentity {
                    ClientIdentity(clientID: hello.clientID, channels: [try ChannelPattern("room.*")])
                }
            }
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    authenticator: Restricted(),
                    routes: { gateway in
                        gateway.authorize { access, _ in access != .subscribe(channel: "room.secret") }
                    }
                )
                let bob = try await Self.connect(endpoint)
                let news = try await Self.subscribe(bob, "news", id: 1)
                #expect(news.status == .permissionDenied && news.message.contains("news"))
                let secret = try await Self.subscribe(bob, "room.secret", id: 2)
                #expect(secret.status == .permissionDenied)
                #expect(try await Self.subscribe(bob, "room.lobby", id: 3).status == .ok)
                bob.close()
            }
        }

        @Test("past the subscriptions a connection may hold, SUBSCRIBE gets resource exhausted; a resubscription does not count twice")
        func subscriptionLimit() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(configure: { configuration in
                    configuration.channels?.maxSubscriptionsPerConnection = 2
                })
                let bob = try await Self.connect(endpoint)
                #expect(try await Self.subscribe(bob, "a", id: 1).status == .ok)
                #expect(try await Self.subscribe(bob, "b", id: 2).status == .ok)
                #expect(try await Self.subscribe(bob, "a", id: 3).status == .ok)
                #expect(try await Self.subscribe(bob, "c", id: 4).status == .resourceExhausted)
                try await bob.send(.unsubscribe(.init(channel: "b")))
                #expect(try await Self.subscribe(bob, "c", id: 5).status == .ok)
                bob.close()
            }
        }

        @Test("after UNSUBSCRIBE nothing of the channel arrives; a channel without history has no positions and recovers nothing")
        func unsubscribeAndNoHistory() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(configure: { configuration in
                    configuration.channels = try! .init(rules: [
                        .init(pattern: try! ChannelPattern("live.*"), history: nil),
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: 10, maxAge: .seconds(60))),
                    ])
                })
                let bob = try await Self.connect(endpoint)
                let live = try await Self.subscribe(bob, "live.scores", from: ChannelPosition(epoch: 0, offset: 0))
                #expect(live.status == .ok && live.epoch == 0 && live.gap, "nothing could be recovered")
                try await Self.publish(gateway, 1...2, to: "live.scores")
                #expect(
                    await Self.publications(bob, count: 2).map(\.position)
                        == Array(repeating: ChannelPosition(epoch: 0, offset: 0), count: 2)
                )

                try await bob.send(.unsubscribe(.init(channel: "live.scores")))
                try await bob.send(.ping(.init(id: 9)))
                guard case .pong? = await bob.next()?.payload else { throw Failure("PONG first") }
                try await Self.publish(gateway, 3...3, to: "live.scores")
                try await bob.send(.ping(.init(id: 10)))
                let next = await bob.next()?.payload
                guard case .pong(let pong)? = next, pong.id == 10 else {
                    throw Failure("nothing of the channel after UNSUBSCRIBE, got \(String(describing: next))")
                }
                bob.close()
            }
        }

        @Test(
            "the histories keep at most maxHistoryBytes together (the channel published to gives up its oldest); past maxChannels a new channel is refused"
        )
        func bounds() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(configure: { configuration in
                    configuration.channels = try! .init(
                        rules: [.init(pattern: .all, history: try! ChannelRetention(maxCount: 1_000, maxAge: .seconds(60)))],
                        maxChannels: 2,
                        maxHistoryBytes: 100
                    )
                })
                let bob = try await Self.connect(endpoint)
                let epoch = try await Self.subscribe(bob, "a", id: 1).epoch
                try await bob.send(.unsubscribe(.init(channel: "a")))
                for _ in 1...20 { try await gateway.publish(ByteBuffer(repeating: 7, count: 10), toChannel: "a") }
                let recovered = try await Self.subscribe(bob, "a", id: 2, from: ChannelPosition(epoch: epoch, offset: 0))
                #expect(recovered.gap && recovered.startingAfter == 10, "100 bytes: the last 10 publications of 10 bytes")
                #expect(await Self.publications(bob, count: 10).map(\.position.offset) == Array(11...20))

                #expect(try await Self.subscribe(bob, "b", id: 3).status == .ok)
                let third = try await Self.subscribe(bob, "c", id: 4)
                #expect(third.status == .resourceExhausted && third.message.contains("2 channels"))
                bob.close()
            }
        }

        @Test(
            "500 SUBSCRIBEs recovering 1 MB each from a client that reads nothing: the gateway holds back what it cannot send, not 500 MB; read later, the last recovery arrives whole"
        )
        func recoveriesWaitForTheReader() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway()
                let probe = try await Self.connect(endpoint)
                let epoch = try await Self.subscribe(probe, "room.lobby").epoch
                probe.close()
                let kilobyte = ByteBuffer(repeating: 0x61, count: 1_024)
                for _ in 1...1_000 { try await gateway.publish(kilobyte, toChannel: "room.lobby") }

                let greedy = try await Self.connect(endpoint)
                try await greedy.stopReading()
                var burst = ByteBuffer()
                for id in 1...500 {
                    let subscribe = Frame.Subscribe(
                        id: UInt64(id),
                        channel: "room.lobby",
                        recoverFrom: ChannelPosition(epoch: epoch, offset: 0)
                    )
                    try FrameEncoder().encode(Frame(.subscribe(subscribe), flags: .checksum), into: &burst)
                }
                try await greedy.send(bytes: burst)
                try await Task.sleep(for: .seconds(1))
                try await greedy.resumeReading()
                // What the gateway wrote for the replaced subscriptions comes before the last
                // SUBSCRIBED: what it wrote while nobody read, and what it held back.
                var early = 0
                while let frame = await greedy.next() {
                    if case .subscribed(let subscribed) = frame.payload, subscribed.id == 500 { break }
                    if case .publication = frame.payload { early += 1 }
                }
                #expect(early < 30_000, "\(early) publications of replaced subscriptions (a recovery is 1,000)")
                let offsets = await Self.publications(greedy, count: 1_000).map(\.position.offset)
                #expect(offsets == Array(1...1_000), "after the last SUBSCRIBED, its recovery whole and in order")
                greedy.close()
            }
        }

        @Test(
            "2,000 history requests of 64 KiB each from a client that reads nothing: once its connection is full they get unavailable, not 128 MB of pages"
        )
        func historyWaitsForTheReader() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway()
                let kilobyte = ByteBuffer(repeating: 0x61, count: 1_024)
                for _ in 1...1_000 { try await gateway.publish(kilobyte, toChannel: "room.lobby") }
                let greedy = try await Self.connect(endpoint)
                try await greedy.stopReading()
                let query = try ChannelHistoryQuery(channel: "room.lobby", after: nil, limit: 1_000).encoded()
                var burst = ByteBuffer()
                for id in 1...2_000 {
                    let request = Frame.Request(id: UInt64(id), method: ChannelHistoryQuery.method, body: query)
                    try FrameEncoder().encode(Frame(.request(request), flags: .checksum), into: &burst)
                }
                try await greedy.send(bytes: burst)
                try await Task.sleep(for: .seconds(1))
                try await greedy.resumeReading()
                var (pages, refused) = (0, 0)
                while pages + refused < 2_000,
                    case .response(let response)? = await greedy.next(where: { if case .response = $0 { true } else { false } })
                {
                    if response.status == .ok { pages += 1 } else if response.status == .unavailable { refused += 1 }
                }
                #expect(pages + refused == 2_000, "every request answered")
                #expect(pages < 450, "\(pages) pages of 64 KiB written for a reader that read nothing (\(refused) refused)")
                greedy.close()
            }
        }

        @Test("the occupancy hook hears each channel's first subscriber and its last one leaving, once each, in order")
        func occupancy() async throws {
            let changes = NIOLockedValueBox<[String]>([])
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.onChannelOccupancy { channel, occupied in
                        changes.withLockedValue { $0.append("\(channel) \(occupied ? "occupied" : "vacated")") }
                    }
                })
                let bob = try await Self.connect(endpoint, clientID: "bob")
                let alice = try await Self.connect(endpoint, clientID: "alice")
                _ = try await Self.subscribe(bob, "a", id: 1)
                _ = try await Self.subscribe(alice, "a", id: 1)
                _ = try await Self.subscribe(alice, "b", id: 2)
                #expect(changes.withLockedValue { $0 } == ["a occupied", "b occupied"], "alice's subscription to a changes nothing")
                try await bob.send(.unsubscribe(.init(channel: "a")))
                _ = try await Self.subscribe(bob, "c", id: 2)  // after the UNSUBSCRIBE, on the same connection
                #expect(changes.withLockedValue { $0 } == ["a occupied", "b occupied", "c occupied"], "alice is still in a")
                alice.close()
                try await eventually("alice's channels are vacated") { changes.withLockedValue { $0.count } == 5 }
                bob.close()
                try await eventually("bob's too") { changes.withLockedValue { $0.count } == 6 }
                #expect(
                    changes.withLockedValue { $0 } == ["a occupied", "b occupied", "c occupied", "a vacated", "b vacated", "c vacated"]
                )
            }
        }

        @Test("a gateway without channels does not offer the feature, and publishing says so")
        func disabled() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(configure: { $0.channels = nil })
                let raw = try await RawConnection.connect(to: endpoint)
                let welcome = try await raw.handshake(features: [.checksum, .channels])
                #expect(welcome?.features == .checksum)
                await #expect {
                    try await gateway.publish(ByteBuffer(), toChannel: "news")
                } throws: { ($0 as? GatewayError)?.code == .disabled }
                raw.close()
            }
        }
    }
}
