import Foundation
import NIOCore
import Testing
import Tether
import TetherCore
import TetherFaultProxy
import TetherGateway
import TetherGatewayTesting
import TetherTestSupport

extension IntegrationTests {
    /// Channels whose history is in the gateway's store (`storage: .store`): recovery from the
    /// store, across a restart of the gateway, while others publish; gaps; history pages.
    @Suite("Channels kept in the store", .timeLimit(.minutes(2)))
    struct StoredChannelTests {
        typealias Reader = ClientChannelTests.Reader
        typealias AwayClient = ClientChannelTests.AwayClient

        static func temporaryPath() -> String {
            FileManager.default.temporaryDirectory.appendingPathComponent("tether-channels-\(UUID().uuidString).sqlite").path
        }

        /// Every channel keeps its last `maxCount` publications in the store.
        static func stored(maxCount: Int = 1_000, pageSize: Int = 256) -> (inout GatewayConfiguration) -> Void {
            { configuration in
                configuration.channels = try! .init(
                    rules: [
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: maxCount, maxAge: .seconds(600)), storage: .store)
                    ],
                    recoveryPageSize: pageSize
                )
            }
        }

        static func publish(_ gateway: Gateway, _ range: ClosedRange<Int>, to channel: String = "room.lobby") async throws {
            for index in range { try await gateway.publish(ByteBuffer(string: "msg-\(index)"), toChannel: channel, publisher: "alice") }
        }

        @Test("the gateway restarts on its store file while bob is away: he recovers what he missed from the store, then the live ones")
        func survivesRestart() async throws {
            try await withHarness { harness in
                let path = Self.temporaryPath()
                let (first, endpoint) = try await harness.gateway(
                    messageStore: try SQLiteMessageStore(path: path),
                    configure: Self.stored()
                )
                let away = try await AwayClient.start(harness, endpoint: endpoint)
                let (bob, reader) = (away.bob, away.reader)
                try await Self.publish(first, 1...20)
                try await eventually("bob has the first 20") { reader.bodies.count == 20 }

                try await away.leave()
                try await Self.publish(first, 21...40)  // while bob is away
                first.shutdown()
                // The same file, the same port: a new process would find nothing else.
                var restarted: Gateway?
                for _ in 0..<100 where restarted == nil {
                    restarted = try? await harness.gateway(
                        port: endpoint.port,
                        messageStore: try SQLiteMessageStore(path: path),
                        configure: Self.stored()
                    ).0
                    if restarted == nil { try await Task.sleep(for: .milliseconds(100)) }
                }
                let second = try #require(restarted, "the gateway is back on its port")
                away.comeBack()
                try await eventually("bob subscribed again", timeout: .seconds(10)) { reader.subscriptions == [true, true] }
                try await Self.publish(second, 41...45)
                try await eventually("bob has all 45", timeout: .seconds(20)) { reader.bodies.count >= 45 }
                #expect(reader.bodies == (1...45).map { "msg-\($0)" })
                #expect(reader.gaps.isEmpty)
                #expect(Set(reader.publications.map(\.position.epoch)).count == 1, "one epoch across the restart")
                let page = try await bob.history(of: "room.lobby", after: reader.publications[9].position, limit: 5)
                #expect(page.publications.map { String(buffer: $0.body) } == (11...15).map { "msg-\($0)" })
                await away.proxy.stop()
            }
        }

        @Test("a recovery read from the store in pages of 7 while another task publishes: each publication once, in order")
        func recoversWhilePublishing() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    messageStore: try SQLiteMessageStore.inMemory(),
                    configure: Self.stored(pageSize: 7)
                )
                let away = try await AwayClient.start(harness, endpoint: endpoint)
                let reader = away.reader
                try await Self.publish(gateway, 1...10)
                try await eventually("bob has the first 10") { reader.bodies.count == 10 }
                try await away.leave()
                try await Self.publish(gateway, 11...300)
                away.comeBack()
                try await Self.publish(gateway, 301...600)  // while bob subscribes again and recovers
                try await eventually("bob has all 600", timeout: .seconds(30)) { reader.bodies.count >= 600 }
                #expect(reader.bodies == (1...600).map { "msg-\($0)" })
                #expect(reader.gaps.isEmpty)
                await away.proxy.stop()
            }
        }

        @Test("when the store keeps only the last 10, bob is told how many he missed, then gets those 10")
        func reportsGap() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    messageStore: try SQLiteMessageStore.inMemory(),
                    configure: Self.stored(maxCount: 10)
                )
                let away = try await AwayClient.start(harness, endpoint: endpoint)
                let reader = away.reader
                try await Self.publish(gateway, 1...5)
                try await eventually("bob has 5") { reader.bodies.count == 5 }
                try await away.leave()
                try await Self.publish(gateway, 6...40)
                away.comeBack()
                try await eventually("bob has what is kept", timeout: .seconds(20)) { reader.bodies.count >= 15 }
                #expect(reader.gaps.map(\.missed) == [25], "6...30 are no longer in the store")
                #expect(reader.bodies == (1...5).map { "msg-\($0)" } + (31...40).map { "msg-\($0)" })
                let page = try await gateway.history(of: "room.lobby", after: reader.publications[0].position, limit: 3)
                #expect(page.gap?.missed == 29)
                #expect(page.publications.map { String(buffer: $0.body) } == ["msg-31", "msg-32", "msg-33"])
                await away.proxy.stop()
            }
        }

        @Test("a burst of SUBSCRIBEs to stored channels starts no more store reads than the subscriptions a connection may hold")
        func subscribeBurst() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    messageStore: try SQLiteMessageStore.inMemory(),
                    configure: { configuration in
                        Self.stored()(&configuration)
                        configuration.channels?.maxSubscriptionsPerConnection = 4
                    }
                )
                let greedy = try await IntegrationTests.ChannelTests.connect(endpoint, clientID: "greedy")
                var burst = ByteBuffer()
                for id in 1...200 {
                    let subscribe = Frame.Subscribe(id: UInt64(id), channel: "room.\(id)")
                    try FrameEncoder().encode(Frame(.subscribe(subscribe), flags: .checksum), into: &burst)
                }
                try await greedy.send(bytes: burst)
                var answers: [Frame.Subscribed] = []
                while answers.count < 200,
                    case .subscribed(let subscribed)? = await greedy.next(where: { if case .subscribed = $0 { true } else { false } })
                {
                    answers.append(subscribed)
                }
                #expect(answers.count == 200)
                #expect(answers.filter { $0.status == .ok }.count == 4)
                let waiting = answers.filter { $0.message.contains("waiting for the channel store") }.count
                #expect(waiting >= 150, "refused before any store read: \(waiting) of 196")
                greedy.close()
            }
        }

        @Test("a rule that keeps history in the store needs a gateway whose store keeps channels")
        func needsAStore() throws {
            var configuration = GatewayConfiguration.defaults
            Self.stored()(&configuration)
            #expect {
                try Gateway(configuration: configuration, messageStore: nil)
            } throws: { ($0 as? GatewayError)?.code == .invalidConfiguration }
            #expect {
                try Gateway(configuration: configuration, messageStore: InMemoryMessageStore())
            } throws: { ($0 as? GatewayError)?.message.contains("ChannelHistoryStore") == true }
        }
    }
}
