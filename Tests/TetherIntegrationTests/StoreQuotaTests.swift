import Foundation
import NIOCore
import Testing
import Tether
import TetherCompression
import TetherCore
import TetherGateway
import TetherTestSupport

extension IntegrationTests {
    /// What reliable deliveries may take of the store: stored compressed where the payload is
    /// worth it, under a store-wide quota and a per-sender one, each refused clearly.
    @Suite("The store: compressed deliveries, store-wide and per-sender quotas", .timeLimit(.minutes(2)))
    struct StoreQuotaTests {
        static let reliable: Features = [.checksum, .reliableDelivery]

        /// A gateway whose `chat.send` handler delivers each message's body to the client its
        /// conversation names.
        func gateway(
            _ harness: Harness,
            store: any MessageStore = InMemoryMessageStore(),
            configure: (inout GatewayConfiguration) -> Void = { _ in }
        ) async throws -> (Gateway, Endpoint) {
            try await harness.gateway(
                messageStore: store,
                configure: configure,
                routes: { gateway in
                    gateway.onMessage("chat.send") { message, context in
                        try context.deliver(to: message.conversation, topic: "chat.message", body: message.body)
                    }
                }
            )
        }

        func message(_ sequence: UInt64, to recipient: String, _ body: ByteBuffer) -> Frame.Payload {
            .message(.init(id: sequence, topic: "chat.send", conversation: recipient, sequence: 1, body: body))
        }

        @Test("the store-wide quota: deliveries beyond it are refused for good, saying the store is full; Gateway.deliver too")
        func storeWide() async throws {
            try await withHarness { harness in
                let store = InMemoryMessageStore()
                let (gateway, endpoint) = try await self.gateway(harness, store: store) { $0.limits.maxStoredDeliveries = 5 }
                let alice = try await RawConnection.connect(to: endpoint)
                defer { alice.close() }
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                for index in UInt64(1)...7 { try await alice.send(self.message(index, to: "r\(index)", ByteBuffer(string: "hi"))) }
                let acks = await alice.nextMessageAcks(count: 7)
                #expect(acks.map(\.status) == Array(repeating: .ok, count: 5) + [.resourceExhausted, .resourceExhausted], "\(acks)")
                #expect(try await store.totalUsage() == StreamUsage(deliveries: 5, bytes: 10))
                do {
                    try await gateway.deliver(to: "someone", topic: "t", body: ByteBuffer(string: "direct"))
                    Issue.record("expected quotaExceeded")
                } catch let error as GatewayError {
                    #expect(error.code == .quotaExceeded && error.message.contains("the store holds its maximum"), "\(error)")
                }
                // Acknowledged deliveries make room once the gateway has read the store again.
                for index in 1...5 { try await store.acknowledge(recipient: "r\(index)", upTo: 1) }
                try await Task.sleep(for: .milliseconds(1500))
                try await alice.send(self.message(8, to: "r8", ByteBuffer(string: "room again")))
                #expect(await alice.nextMessageAck() == [.init(id: 8)])
            }
        }

        @Test("the per-sender quota: a sender's messages beyond its deliveries per minute are refused for good; another sender goes on")
        func perSender() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await self.gateway(harness) { $0.limits.maxDeliveriesPerSenderPerMinute = 3 }
                let alice = try await RawConnection.connect(to: endpoint)
                defer { alice.close() }
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable, outboxEpoch: 1)
                for index in UInt64(1)...4 { try await alice.send(self.message(index, to: "r\(index)", ByteBuffer(string: "hi"))) }
                let acks = await alice.nextMessageAcks(count: 4)
                #expect(acks.map(\.status) == [.ok, .ok, .ok, .resourceExhausted], "\(acks)")
                let carol = try await RawConnection.connect(to: endpoint)
                defer { carol.close() }
                _ = try await carol.handshake(clientID: "carol", features: Self.reliable, outboxEpoch: 1)
                try await carol.send(self.message(1, to: "r1", ByteBuffer(string: "from carol")))
                #expect(await carol.nextMessageAck() == [.init(id: 1)], "another sender has a quota of its own")
            }
        }

        /// About 64 KiB of JSON-like text that DEFLATE shrinks several times.
        static let document: ByteBuffer = {
            var generator = SplitMix64(seed: 3)
            var text = "["
            while text.utf8.count < 64 * 1024 {
                text += #"{"id":\#(generator.next() % 100_000),"user":"user-\#(generator.next() % 50)","text":"hello there"},"#
            }
            return ByteBuffer(string: text + "{}]")
        }()

        @Test(
            "300 compressed messages to 300 recipients grow an SQLite store by about their size on the wire, not inflated; each recipient gets the payload, compressed or not as it negotiated"
        )
        func compressedDeliveries() async throws {
            try await withHarness { harness in
                let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-compressed-\(UUID().uuidString).sqlite")
                    .path
                harness.onExit {
                    for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) }
                }
                let store = try SQLiteMessageStore(path: path)
                let (_, endpoint) = try await self.gateway(harness, store: store)
                func size() -> Int {
                    ["", "-wal"].reduce(0) { total, suffix in
                        total + ((try? FileManager.default.attributesOfItem(atPath: path + suffix)[.size] as? Int) ?? 0)
                    }
                }

                let alice = try await RawConnection.connect(to: endpoint)
                defer { alice.close() }
                _ = try await alice.handshake(clientID: "alice", features: Self.reliable.union(.compression), outboxEpoch: 1)
                try await alice.send(self.message(1000, to: "warm-up", ByteBuffer(string: "hi")))
                _ = await alice.nextMessageAck()
                let before = size()
                let deflater = try PayloadDeflater(threshold: 512)
                var wire = 0
                for index in UInt64(1)...300 {
                    var frame = ByteBuffer()
                    try FrameEncoder().encode(
                        Frame(self.message(index, to: "r\(index)", Self.document), flags: .checksum),
                        into: &frame,
                        deflater: deflater
                    )
                    wire += frame.readableBytes
                    try await alice.send(bytes: frame)
                }
                let acks = await alice.nextMessageAcks(count: 300)
                #expect(acks.count == 300 && acks.allSatisfy { $0.status == .ok })
                let growth = size() - before
                let inflated = 300 * Self.document.readableBytes
                print(
                    "compressed deliveries: 300 messages, \(wire) bytes on the wire (\(inflated) inflated); the store grew by \(growth) bytes"
                )
                // The file and its write-ahead log, which holds each commit's pages until a checkpoint.
                #expect(growth <= 4 * wire, "the store grew by \(growth) bytes for \(wire) on the wire")
                #expect(growth < inflated / 2, "not stored inflated: \(growth) bytes for \(inflated) inflated")
                #expect(try await store.totalUsage()?.bytes ?? .max < wire, "counted as stored")

                // r1 without compression gets the payload inflated; r2 with it, as stored.
                let plain = try await RawConnection.connect(to: endpoint)
                defer { plain.close() }
                _ = try await plain.handshake(
                    clientID: "r1",
                    features: Self.reliable,
                    resume: .init(epoch: store.epoch, lastSequence: 0),
                    outboxEpoch: 1
                )
                let delivery = await plain.nextDelivery()
                #expect(delivery?.body == Self.document, "inflated for a client that did not negotiate compression")
                let r2 = try harness.client([endpoint], clientID: "r2") { $0.reliability = try! .init(outbox: InMemoryOutboxStore()) }
                let inbox = DeliveryCollector(r2, in: harness)
                try await eventually("r2 gets its delivery") { inbox.count == 1 }
                #expect(inbox.bodies.first == Self.document.string, "sent compressed to a client that negotiated it, inflated there")
            }
        }
    }
}
