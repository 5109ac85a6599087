import NIOConcurrencyHelpers
import NIOCore
import Testing
import TetherCore
import TetherTestSupport

@testable import TetherGateway

extension IntegrationTests {
    /// The gateway's side of reliable delivery, driven by hand over TCP.
    @Suite("Gateway reliable delivery", .timeLimit(.minutes(2)))
    struct GatewayReliableTests {
        static let reliable: Features = [.checksum, .reliableDelivery]

        /// A gateway with a message store and a `chat.send` handler that records what it sees and
        /// delivers each message's body to the client id named by the conversation.
        func gateway(
            _ harness: Harness,
            store: any MessageStore = InMemoryMessageStore(),
            gate: Turnstile = Turnstile(),
            configure: @escaping (inout GatewayConfiguration) -> Void = { _ in }
        ) async throws -> (Gateway, Endpoint, NIOLockedValueBox<[String]>) {
            let seen = NIOLockedValueBox<[String]>([])
            var configuration = GatewayConfiguration.defaults
            configuration.listen = .init(host: "127.0.0.1", port: 0)
            configure(&configuration)
            let gateway = try Gateway(configuration: configuration, messageStore: store, logger: testLogger("gateway"))
            gateway.onMessage("chat.send") { message, context in
                let text = message.body.string
                seen.withLockedValue { $0.append("\(message.conversation):\(message.sequence):\(text)") }
                switch text {
                case "refuse": throw RequestError(.invalidRequest, "refused")
                case "flaky": throw SomeInternalError()
                case let slow where slow.hasPrefix("slow"): try await Task.sleep(for: .milliseconds(100))
                case let gated where gated.hasPrefix("gated"): await gate.pass()
                case "hang": try await Task.sleep(for: .seconds(60))
                default: break
                }
                try context.deliver(to: message.conversation, topic: "chat.message", body: message.body)
            }
            harness.spawn { try? await gateway.run() }
            harness.onExit { gateway.shutdown() }
            let port = try await gateway.listeningAddress.port!
            return (gateway, Endpoint(host: "127.0.0.1", port: port), seen)
        }

        func message(_ id: UInt64, _ sequence: UInt64, _ text: String, conversation: String = "bob", ttl: Duration? = nil) -> Frame.Payload
        {
            .message(
                .init(id: id, topic: "chat.send", conversation: conversation, sequence: sequence, ttl: ttl, body: ByteBuffer(string: text))
            )
        }

        @Test("the feature and the delivery epoch are offered only with a message store")
        func negotiation() async throws {
            try await withHarness { harness in
                let store = InMemoryMessageStore()
                let (_, endpoint, _) = try await self.gateway(harness, store: store)
                let connection = try await RawConnection.connect(to: endpoint)
                let welcome = try await connection.handshake(features: Self.reliable, outboxEpoch: 1)
                #expect(welcome?.features == Self.reliable)
                #expect(welcome?.deliveryEpoch == store.epoch)
                connection.close()

                let (_, plainEndpoint) = try await harness.gateway()
                let plain = try await RawConnection.connect(to: plainEndpoint)
                let plainWelcome = try await plain.handshake(features: Self.reliable)
                #expect(plainWelcome?.features == .checksum && plainWelcome?.deliveryEpoch == nil)
                plain.close()
            }
        }

        @Test("messages are processed once, in order; duplicates get the recorded outcome; gaps wait")
        func upstream() async throws {
            try await withHarness { harness in
                let (_, endpoint, seen) = try await self.gateway(harness)
                let alice = try await RawConnection.connect(to: endpoint)
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)

                try await alice.send(self.message(10, 1, "one"))
                try await alice.send(self.message(11, 2, "refuse"))
                #expect(await alice.nextMessageAcks(count: 2) == [.init(id: 10), .init(id: 11, status: .invalidRequest)])

                // Retransmissions: acknowledged again with the same outcomes, not processed again.
                try await alice.send(self.message(10, 1, "one"))
                #expect(await alice.nextMessageAck() == [.init(id: 10)])
                try await alice.send(self.message(11, 2, "refuse"))
                #expect(await alice.nextMessageAck() == [.init(id: 11, status: .invalidRequest)])

                // A gap: 4 waits for 3.
                try await alice.send(self.message(13, 4, "four"))
                try await alice.send(self.message(12, 3, "three"))
                #expect(await alice.nextMessageAck() == [.init(id: 12)])
                try await alice.send(self.message(13, 4, "four"))
                #expect(await alice.nextMessageAck() == [.init(id: 13)])

                #expect(seen.withLockedValue { $0 } == ["bob:1:one", "bob:2:refuse", "bob:3:three", "bob:4:four"])
                alice.close()
            }
        }

        @Test(
            "a conflicting duplicate (another message id with a processed sequence) is refused invalid request; the retransmission still gets ok",
            arguments: [false, true]
        )
        func conflictingDuplicate(sqlite: Bool) async throws {
            try await withHarness { harness in
                let store: any MessageStore =
                    sqlite ? try SQLiteMessageStore(path: temporaryFile("conflict", in: harness)) : InMemoryMessageStore()
                let (_, endpoint, seen) = try await self.gateway(harness, store: store)
                let alice = try await RawConnection.connect(to: endpoint)
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                try await alice.send(self.message(1, 1, "first"))
                #expect(await alice.nextMessageAck() == [.init(id: 1)])
                // Committed earlier: another id for sequence 1 is refused, the same id is a retransmission.
                try await alice.send(self.message(2, 1, "impostor"))
                #expect(await alice.nextMessageAck() == [.init(id: 2, status: .invalidRequest)])
                try await alice.send(self.message(1, 1, "first"))
                #expect(await alice.nextMessageAck() == [.init(id: 1)])
                // In one batch: sequence 2 twice with different ids, and a true duplicate of it.
                var frames = ByteBuffer()
                for payload in [self.message(3, 2, "second"), self.message(4, 2, "other second"), self.message(3, 2, "second")] {
                    try FrameEncoder().encode(Frame(payload, flags: .checksum), into: &frames)
                }
                try await alice.send(bytes: frames)
                let answers = await alice.nextMessageAcks(count: 3)
                #expect(answers.filter { $0.id == 4 } == [.init(id: 4, status: .invalidRequest)], "\(answers)")
                #expect(answers.filter { $0.id == 3 } == [.init(id: 3), .init(id: 3)], "\(answers)")
                #expect(seen.withLockedValue { $0 } == ["bob:1:first", "bob:2:second"], "each sequence's handler ran once")
                alice.close()
            }
        }

        @Test("a transient handler failure is not acknowledged; the retransmission is processed")
        func transientFailure() async throws {
            try await withHarness { harness in
                let (_, endpoint, seen) = try await self.gateway(harness)
                let alice = try await RawConnection.connect(to: endpoint)
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                try await alice.send(self.message(1, 1, "flaky"))
                try await alice.send(self.message(2, 2, "blocked behind it"))
                try await alice.send(self.message(3, 1, "fine", conversation: "carol"))
                #expect(await alice.nextMessageAck() == [.init(id: 3)], "other conversations carry on")
                try await alice.send(self.message(1, 1, "ok now"))
                try await alice.send(self.message(2, 2, "blocked behind it"))
                #expect(await alice.nextMessageAcks(count: 2).map(\.id) == [1, 2])
                #expect(
                    seen.withLockedValue { $0 }.filter { $0.hasPrefix("bob") } == [
                        "bob:1:flaky", "bob:1:ok now", "bob:2:blocked behind it",
                    ]
                )
                alice.close()
            }
        }

        @Test(
            "reliable messages waiting in memory are bounded in bytes: past the bound the gateway stops reading, and every message is processed once, without a resend"
        )
        func inboundByteBudget() async throws {
            try await withHarness { harness in
                let gate = Turnstile()
                let (gateway, endpoint, seen) = try await self.gateway(harness, gate: gate) {
                    $0.limits.maxBodySize = 4096
                    $0.limits.maxBufferedInboundBytes = 16_384  // 12 KiB for messages: four of 3 KiB
                }
                let alice = try await RawConnection.connect(to: endpoint)
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                let padding = String(repeating: ".", count: 3000)
                // Each handler waits at the turnstile: all eight are sent while the first runs.
                for sequence in UInt64(1)...8 { try await alice.send(self.message(sequence, sequence, "gated \(sequence) \(padding)")) }
                try await eventually("the first handler runs") { seen.withLockedValue { $0.count } == 1 }
                let connection = try #require(gateway.connections.first?.id)
                let handler = try #require(gateway.registry.handler(of: connection))
                try await eventually("the gateway stops reading, the inbox at its bound") {
                    (try? await handler.eventLoop.submit { handler.value.machine.holdsReads }.get()) ?? false
                }
                let waiting = try await handler.eventLoop.submit { handler.value.machine.reliableMessagesWaiting }.get()
                #expect((3...4).contains(waiting), "three or four of 3 KiB wait beside the one processed: \(waiting)")
                gate.open(8)
                let acks = await alice.nextMessageAcks(count: 8).map(\.id)
                #expect(acks == Array(1...8), "each acknowledged once, in order, none sent twice")
                let handled = seen.withLockedValue { $0 }.map { $0.split(separator: " ").prefix(2).joined(separator: " ") }
                #expect(handled == (1...8).map { "bob:\($0):gated \($0)" }, "each processed once, in order")
                alice.close()
            }
        }

        @Test("a recipient's store quota: a message whose delivery would pass it is refused for good with resource exhausted")
        func recipientQuota() async throws {
            try await withHarness { harness in
                let store = InMemoryMessageStore()
                let (gateway, endpoint, seen) = try await self.gateway(harness, store: store) {
                    $0.limits.maxDeliveriesPerRecipient = 2
                    $0.limits.maxDeliveryBytesPerRecipient = 100
                }
                let alice = try await RawConnection.connect(to: endpoint)
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                for sequence in UInt64(1)...3 { try await alice.send(self.message(sequence, sequence, "hi \(sequence)")) }
                #expect(await alice.nextMessageAcks(count: 3) == [.init(id: 1), .init(id: 2), .init(id: 3, status: .resourceExhausted)])
                #expect(seen.withLockedValue { $0.count } == 3, "the handler ran; its delivery was not stored")
                #expect(try await store.usage(of: "bob").deliveries == 2)
                // A retransmission gets the same answer.
                try await alice.send(self.message(3, 3, "hi 3"))
                #expect(await alice.nextMessageAck() == [.init(id: 3, status: .resourceExhausted)])
                do {
                    try await gateway.deliver(to: "bob", topic: "t", body: ByteBuffer(string: "direct"))
                    Issue.record("expected quotaExceeded")
                } catch let error as GatewayError {
                    #expect(error.code == .quotaExceeded && error.message.contains("'bob'"))
                }

                // Once bob acknowledges, there is room again; the bytes count too.
                try await store.acknowledge(recipient: "bob", upTo: 2)
                try await alice.send(self.message(4, 4, "fits"))
                try await alice.send(self.message(5, 5, String(repeating: "x", count: 101)))
                #expect(await alice.nextMessageAcks(count: 2) == [.init(id: 4), .init(id: 5, status: .resourceExhausted)])
                alice.close()
            }
        }

        @Test("with the answers feature: a gap and a transient failure are answered unavailable; a full inbox is paced, not refused")
        func answers() async throws {
            try await withHarness { harness in
                let (_, endpoint, seen) = try await self.gateway(harness) {
                    $0.limits.maxBodySize = 4096
                    $0.limits.maxBufferedInboundBytes = 8192  // 4 KiB for messages
                }
                let alice = try await RawConnection.connect(to: endpoint)
                let welcome = try await alice.handshake(clientID: "alice", features: Self.reliable.union(.messageAnswers), outboxEpoch: 1)
                #expect(welcome?.features.contains(.messageAnswers) == true)
                try await alice.send(self.message(2, 2, "early"))
                #expect(await alice.nextMessageAck() == [.init(id: 2, status: .unavailable)], "1 is missing")
                try await alice.send(self.message(1, 1, "flaky"))
                #expect(await alice.nextMessageAck() == [.init(id: 1, status: .unavailable)], "the handler failed")
                try await alice.send(self.message(1, 1, "one"))
                try await alice.send(self.message(2, 2, "two"))
                #expect(await alice.nextMessageAcks(count: 2).map(\.id) == [1, 2])
                // Three 3 KiB messages at once: past the 4 KiB the gateway stops reading until the
                // first is processed; none is refused.
                let padding = String(repeating: ".", count: 3000)
                for sequence in UInt64(3)...5 { try await alice.send(self.message(sequence, sequence, "slow \(padding)")) }
                let entries = await alice.nextMessageAcks(count: 3)
                #expect(entries == [.init(id: 3), .init(id: 4), .init(id: 5)], "\(entries)")
                #expect(seen.withLockedValue { $0 }.prefix(3).map { $0.prefix(9) } == ["bob:1:fla", "bob:1:one", "bob:2:two"])
                alice.close()
            }
        }

        @Test("a handler past the handler time limit is cancelled and not acknowledged; the retransmission is processed")
        func handlerTimeLimit() async throws {
            try await withHarness { harness in
                let (_, endpoint, seen) = try await self.gateway(harness) { $0.timeouts.handler = .milliseconds(300) }
                let alice = try await RawConnection.connect(to: endpoint)
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                let clock = ContinuousClock()
                let sent = clock.now
                try await alice.send(self.message(1, 1, "hang"))
                try await alice.send(self.message(2, 1, "fine", conversation: "carol"))
                #expect(await alice.nextMessageAck() == [.init(id: 2)], "the processor moved on")
                let waited = clock.now - sent
                #expect(waited >= .milliseconds(300) && waited < .seconds(20), "\(waited)")
                // Each handler has the whole limit: three of 100 ms in a row (300 ms) all pass.
                try await alice.send(self.message(3, 1, "slow 1", conversation: "dave"))
                try await alice.send(self.message(4, 2, "slow 2", conversation: "dave"))
                try await alice.send(self.message(5, 3, "slow 3", conversation: "dave"))
                try await alice.send(self.message(1, 1, "ok now"))
                #expect(await alice.nextMessageAcks(count: 4).map(\.id).sorted() == [1, 3, 4, 5])
                #expect(seen.withLockedValue { $0 }.filter { $0.hasPrefix("bob") } == ["bob:1:hang", "bob:1:ok now"])
                alice.close()
            }
        }

        @Test("a message whose time to live ran out before processing is refused as deadline exceeded")
        func expiredMessage() async throws {
            try await withHarness { harness in
                let (_, endpoint, seen) = try await self.gateway(harness)
                let alice = try await RawConnection.connect(to: endpoint)
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                // The first message keeps the processor busy for 100 ms; the second expires meanwhile.
                try await alice.send(self.message(1, 1, "slow"))
                try await alice.send(self.message(2, 2, "stale", ttl: .milliseconds(10)))
                #expect(await alice.nextMessageAcks(count: 2) == [.init(id: 1), .init(id: 2, status: .deadlineExceeded)])
                #expect(!seen.withLockedValue { $0 }.contains("bob:2:stale"))
                alice.close()
            }
        }

        @Test("an EXPIRED message is recorded without running the handler, and the conversation moves on")
        func tombstone() async throws {
            try await withHarness { harness in
                let (_, endpoint, seen) = try await self.gateway(harness)
                let alice = try await RawConnection.connect(to: endpoint)
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                try await alice.send(.message(.init(id: 1, topic: "chat.send", conversation: "bob", sequence: 1, expired: true)))
                try await alice.send(self.message(2, 2, "after it"))
                #expect(await alice.nextMessageAcks(count: 2) == [.init(id: 1, status: .deadlineExceeded), .init(id: 2)])
                #expect(seen.withLockedValue { $0 } == ["bob:2:after it"])
                alice.close()
            }
        }

        @Test("a new outbox epoch numbers its conversations from 1; the old outbox's retransmissions stay duplicates")
        func outboxReset() async throws {
            try await withHarness { harness in
                let (_, endpoint, seen) = try await self.gateway(harness)
                let before = try await RawConnection.connect(to: endpoint)
                _ = try await before.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                try await before.send(self.message(1, 1, "old"))
                #expect(await before.nextMessageAck() == [.init(id: 1)])
                before.close()

                let reinstalled = try await RawConnection.connect(to: endpoint)
                _ = try await reinstalled.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 2)
                try await reinstalled.send(self.message(1, 1, "new"))
                #expect(await reinstalled.nextMessageAck() == [.init(id: 1)])
                reinstalled.close()

                let again = try await RawConnection.connect(to: endpoint)
                _ = try await again.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                try await again.send(self.message(1, 1, "old"))
                #expect(await again.nextMessageAck() == [.init(id: 1)], "acknowledged as the duplicate it is")
                #expect(seen.withLockedValue { $0 } == ["bob:1:old", "bob:1:new"])
                again.close()
            }
        }

        @Test("two devices of one client id, connected at once, each with its own outbox: each message processed once")
        func twoDevicesOfOneClient() async throws {
            try await withHarness { harness in
                let (_, endpoint, seen) = try await self.gateway(harness)
                let phone = try await RawConnection.connect(to: endpoint)
                _ = try await phone.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 0xA)
                let tablet = try await RawConnection.connect(to: endpoint)
                _ = try await tablet.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 0xB)
                for sequence in UInt64(1)...3 {
                    try await phone.send(self.message(sequence, sequence, "phone \(sequence)"))
                    try await tablet.send(self.message(100 + sequence, sequence, "tablet \(sequence)"))
                }
                #expect(await phone.nextMessageAcks(count: 3).map(\.id) == [1, 2, 3])
                #expect(await tablet.nextMessageAcks(count: 3).map(\.id) == [101, 102, 103])

                // Both send everything again, as after lost ACKs, and a fourth message each.
                for sequence in UInt64(1)...4 {
                    try await phone.send(self.message(sequence, sequence, "phone \(sequence)"))
                    try await tablet.send(self.message(100 + sequence, sequence, "tablet \(sequence)"))
                }
                #expect(await phone.nextMessageAcks(count: 4).map(\.id).sorted() == [1, 2, 3, 4])
                #expect(await tablet.nextMessageAcks(count: 4).map(\.id).sorted() == [101, 102, 103, 104])
                let handled = seen.withLockedValue { $0 }
                #expect(handled.filter { $0.contains("phone") } == (1...4).map { "bob:\($0):phone \($0)" })
                #expect(handled.filter { $0.contains("tablet") } == (1...4).map { "bob:\($0):tablet \($0)" })
                #expect(handled.count == 8)
                phone.close()
                tablet.close()
            }
        }

        @Test("an outbox away for longer than the retention is forgotten; a connected one is kept", .timeLimit(.minutes(1)))
        func outboxRetention() async throws {
            try await withHarness { harness in
                let (_, endpoint, seen) = try await self.gateway(harness) { $0.timeouts.outboxRetention = .seconds(1) }
                let away = try await RawConnection.connect(to: endpoint)
                _ = try await away.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                try await away.send(self.message(1, 1, "away"))
                #expect(await away.nextMessageAck() == [.init(id: 1)])
                away.close()
                let connected = try await RawConnection.connect(to: endpoint)
                _ = try await connected.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 2)
                try await connected.send(self.message(1, 1, "connected"))
                #expect(await connected.nextMessageAck() == [.init(id: 1)])

                // Past the retention (the gateway looks every half retention, to the second).
                try await Task.sleep(for: .seconds(3))
                try await connected.send(self.message(1, 1, "connected"))
                #expect(await connected.nextMessageAck() == [.init(id: 1)])
                let back = try await RawConnection.connect(to: endpoint)
                _ = try await back.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                try await back.send(self.message(1, 1, "away"))
                #expect(await back.nextMessageAck() == [.init(id: 1)])
                #expect(
                    seen.withLockedValue { $0 } == ["bob:1:away", "bob:1:connected", "bob:1:away"],
                    "the connected outbox's retransmission is still a duplicate; the forgotten one's is new"
                )
                connected.close()
                back.close()
            }
        }

        @Test("deliveries reach a recipient in order, are kept while it is offline, and resume after its last one")
        func downstream() async throws {
            try await withHarness { harness in
                let store = InMemoryMessageStore()
                let (gateway, endpoint, _) = try await self.gateway(harness, store: store)
                let alice = try await RawConnection.connect(to: endpoint)
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                for sequence in UInt64(1)...5 {
                    try await alice.send(self.message(sequence, sequence, "m\(sequence)"))
                }
                #expect(await alice.nextMessageAcks(count: 5).count == 5)
                #expect(try await gateway.deliver(to: "bob", topic: "chat.message", body: ByteBuffer(string: "m6")) == 6)
                alice.close()

                // Bob was offline: everything waits for him.
                let bob = try await RawConnection.connect(to: endpoint)
                _ = try await bob.handshake(clientID: "bob", features: Self.reliable, outboxEpoch: 1)
                var received: [String] = []
                for _ in 1...3 {
                    let delivery = await bob.nextDelivery()
                    received.append("\(delivery?.sequence ?? 0):\(delivery?.body.string ?? "")")
                }
                #expect(received == ["1:m1", "2:m2", "3:m3"])
                try await bob.send(.deliveryAck(.init(sequence: 2)))
                bob.close()

                // He comes back having processed 1 and 2: the rest follows, in order.
                let again = try await RawConnection.connect(to: endpoint)
                _ = try await again.handshake(
                    clientID: "bob",
                    features: Self.reliable,
                    resume: .init(epoch: store.epoch, lastSequence: 2),
                    outboxEpoch: 1
                )
                var rest: [UInt64] = []
                for _ in 3...6 { rest.append(await again.nextDelivery()?.sequence ?? 0) }
                #expect(rest == [3, 4, 5, 6])
                try await again.send(.deliveryAck(.init(sequence: 6)))
                try await eventually("the store forgets what was acknowledged") {
                    (try? await store.deliveries(for: "bob", after: 0, limit: 10).isEmpty) == true
                }
                again.close()
            }
        }

        @Test("a resume point from another epoch (another store) gets everything kept")
        func otherEpoch() async throws {
            try await withHarness { harness in
                let store = InMemoryMessageStore()
                let (gateway, endpoint, _) = try await self.gateway(harness, store: store)
                try await gateway.deliver(to: "bob", topic: "t", body: ByteBuffer(string: "a"))
                try await gateway.deliver(to: "bob", topic: "t", body: ByteBuffer(string: "b"))
                let bob = try await RawConnection.connect(to: endpoint)
                _ = try await bob.handshake(
                    clientID: "bob",
                    features: Self.reliable,
                    resume: .init(epoch: store.epoch &+ 1, lastSequence: 1),
                    outboxEpoch: 1
                )
                #expect(await bob.nextDelivery()?.sequence == 1)
                #expect(await bob.nextDelivery()?.sequence == 2)
                bob.close()
            }
        }

        @Test("at most the delivery window is unacknowledged; acknowledgements open it again")
        func window() async throws {
            try await withHarness { harness in
                let (gateway, endpoint, _) = try await self.gateway(harness) { $0.limits.deliveryWindow = 4 }
                for index in 1...10 {
                    try await gateway.deliver(to: "bob", topic: "t", body: ByteBuffer(string: "\(index)"))
                }
                let bob = try await RawConnection.connect(to: endpoint)
                _ = try await bob.handshake(clientID: "bob", features: Self.reliable, outboxEpoch: 1)
                for expected in UInt64(1)...4 { #expect(await bob.nextDelivery()?.sequence == expected) }
                try await bob.send(.ping(.init(id: 99)))
                #expect(
                    await bob.next(where: { if case .delivery = $0 { true } else if case .pong = $0 { true } else { false } })
                        == .pong(.init(id: 99)),
                    "nothing beyond the window"
                )
                try await bob.send(.deliveryAck(.init(sequence: 3)))
                for expected in UInt64(5)...7 { #expect(await bob.nextDelivery()?.sequence == expected) }
                bob.close()
            }
        }

        @Test("without the feature, reliable frames are protocol violations")
        func notNegotiated() async throws {
            try await withHarness { harness in
                let (_, endpoint, _) = try await self.gateway(harness)
                let plain = try await RawConnection.connect(to: endpoint)
                _ = try await plain.handshake(features: .checksum)
                try await plain.send(self.message(1, 1, "x"))
                guard case .error(let report)? = await plain.next()?.payload else {
                    Issue.record("expected ERROR")
                    return
                }
                #expect(report.code == .unexpectedFrame)
            }
        }
    }
}

/// Lets handlers through one at a time, as the test opens it.
final class Turnstile: Sendable {
    private let state = NIOLockedValueBox<(permits: Int, waiting: [CheckedContinuation<Void, Never>])>((0, []))

    /// Waits for a permit.
    func pass() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let go = self.state.withLockedValue { state -> Bool in
                guard state.permits > 0 else {
                    state.waiting.append(continuation)
                    return false
                }
                state.permits -= 1
                return true
            }
            if go { continuation.resume() }
        }
    }

    /// Lets `count` more through.
    func open(_ count: Int) {
        let released = self.state.withLockedValue { state -> [CheckedContinuation<Void, Never>] in
            state.permits += count
            let released = Array(state.waiting.prefix(state.permits))
            state.waiting.removeFirst(released.count)
            state.permits -= released.count
            return released
        }
        for continuation in released { continuation.resume() }
    }
}
