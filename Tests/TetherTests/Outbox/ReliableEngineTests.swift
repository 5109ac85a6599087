import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import TetherCore
import TetherTestSupport

@testable import Tether

@Suite("Reliable engine")
struct ReliableEngineTests {
    final class Sink: ReliableSink {
        let acknowledgedUpTo = NIOLockedValueBox<UInt64>(0)
        func enqueue(_ records: [OutboxRecord]) {}
        func replace(with tombstone: OutboxRecord) {}
        func acknowledgeDeliveries(upTo sequence: UInt64) { self.acknowledgedUpTo.withLockedValue { $0 = sequence } }
    }

    func engine(
        outbox: InMemoryOutboxStore = InMemoryOutboxStore(),
        capacity: Int = 10_000,
        whenFull: ClientConfiguration.Reliability.WhenFull = .wait
    ) throws -> ReliableEngine {
        ReliableEngine(
            configuration: try .init(outbox: outbox, capacity: capacity, whenFull: whenFull),
            eventLoop: self.loop,
            clock: SystemClock(),
            logger: Logger(label: "test")
        )
    }

    /// The client's event loop: the connection-side calls run there, as in the client.
    let loop = MultiThreadedEventLoopGroup.singleton.next()

    func onLoop<Value: Sendable>(_ body: @escaping @Sendable () -> Value) async throws -> Value {
        try await self.loop.submit(body).get()
    }

    func receive(_ engine: ReliableEngine, _ sequence: UInt64, epoch: UInt64 = 7) async throws -> DeliveryVerdict {
        let delivery = self.delivery(sequence)
        return try await self.onLoop { engine.receive(delivery, epoch: epoch) }
    }

    func delivery(_ sequence: UInt64) -> Frame.Delivery {
        Frame.Delivery(sequence: sequence, topic: "t", body: ByteBuffer(string: "\(sequence)"))
    }

    @Test("deliveries that arrive before their connection is attached are kept, not taken for a gap")
    func deliveriesBeforeAttach() async throws {
        let engine = try self.engine()
        _ = try await engine.helloFields()  // loads the outbox, as connecting does
        #expect(try await self.receive(engine, 1, epoch: 7) == .accepted)
        #expect(try await self.receive(engine, 2, epoch: 7) == .accepted)
        engine.attach(Sink(), deliveryEpoch: 7, resume: nil)
        #expect(try await self.receive(engine, 2, epoch: 7) == .duplicate)
        #expect(try await self.receive(engine, 4, epoch: 7) == .gap(expected: 3))
        #expect(try await engine.nextDelivery()?.sequence == 1)
        #expect(try await engine.nextDelivery()?.sequence == 2)
    }

    @Test("deliveries the app processed before their connection was attached are acknowledged once it is")
    func processedBeforeAttach() async throws {
        let outbox = InMemoryOutboxStore()
        let engine = try self.engine(outbox: outbox)
        _ = try await engine.helloFields()
        let maintenance = Task { await engine.runMaintenance() }
        let sink = Sink()
        for sequence: UInt64 in 1...3 { #expect(try await self.receive(engine, sequence, epoch: 7) == .accepted) }
        for sequence: UInt64 in 1...3 { #expect(try await engine.nextDelivery()?.sequence == sequence) }
        try engine.acknowledgeDelivery(3)  // the app is done with all three; the checkpoint is saved, with no one to tell
        engine.consumerEnded()
        try await eventually("the checkpoint is saved") { (try? await outbox.load().checkpoint?.lastSequence) == 3 }
        #expect(sink.acknowledgedUpTo.withLockedValue { $0 } == 0)

        engine.attach(sink, deliveryEpoch: 7, resume: nil)
        try await eventually("the gateway is told") { sink.acknowledgedUpTo.withLockedValue { $0 } == 3 }
        engine.finish()
        await maintenance.value
    }

    @Test("a connection to another gateway store starts the inbox again")
    func newEpoch() async throws {
        let engine = try self.engine()
        _ = try await engine.helloFields()
        engine.attach(Sink(), deliveryEpoch: 7, resume: nil)
        #expect(try await self.receive(engine, 1, epoch: 7) == .accepted)
        #expect(try await self.receive(engine, 1, epoch: 8) == .accepted, "sequence numbers of store 8 start at 1")
        let resume = try await engine.helloFields().resume
        #expect(resume?.epoch == 8 && resume?.lastSequence == 0, "received, not processed: the gateway must keep it")
    }

    @Test("200 tasks sending at once: every message stored once, numbered without a gap in each conversation")
    func concurrentSends() async throws {
        let outbox = InMemoryOutboxStore()
        let engine = try self.engine(outbox: outbox)
        let receipts = try await withThrowingTaskGroup(of: MessageReceipt.self) { group in
            for index in 0..<200 {
                group.addTask {
                    try await engine.send(
                        topic: "t",
                        body: ByteBuffer(string: "\(index)"),
                        conversation: "c\(index % 2)",
                        priority: .normal,
                        ttl: nil
                    )
                }
            }
            return try await group.reduce(into: []) { $0.append($1) }
        }
        #expect(Set(receipts.map(\.id)) == Set(1...200))
        for conversation in ["c0", "c1"] {
            let sequences = receipts.filter { $0.conversation == conversation }.map(\.sequence).sorted()
            #expect(sequences == Array(1...100), "\(conversation)")
        }
        let stored = try await outbox.load().records
        #expect(stored.count == 200 && Set(stored.map(\.id)) == Set(1...200))
        #expect(try await engine.pending().count == 200)
    }

    /// Records the order in which messages reach the connection.
    final class OrderSink: ReliableSink {
        /// Per conversation, the last sequence enqueued; and the sequences that came after a later one.
        let state = NIOLockedValueBox<(last: [String: UInt64], late: [String])>(([:], []))
        func enqueue(_ records: [OutboxRecord]) {
            self.state.withLockedValue { state in
                for record in records {
                    if let last = state.last[record.conversation], record.sequence < last {
                        state.late.append("\(record.conversation) #\(record.sequence) after #\(last)")
                    }
                    state.last[record.conversation] = max(state.last[record.conversation] ?? 0, record.sequence)
                }
            }
        }
        func replace(with tombstone: OutboxRecord) {}
        func acknowledgeDeliveries(upTo sequence: UInt64) {}
    }

    @Test(
        "messages reach the connection in the order they were committed, whichever sender commits",
        arguments: [false, true]
    )
    func committedOrder(yieldingStore: Bool) async throws {
        // Each sender awaits each send, so its next message joins the next group, which another
        // sender may commit: a group must reach the connection before the next one does, or
        // the connection sends a conversation's message before the one it follows, and the
        // gateway waits for that one's retransmission (a retransmission timeout per gap).
        let outbox: any OutboxStore = yieldingStore ? YieldingOutboxStore() : InMemoryOutboxStore()
        let engine = ReliableEngine(
            configuration: try .init(outbox: outbox, capacity: 10_000),
            eventLoop: self.loop,
            clock: SystemClock(),
            logger: Logger(label: "test")
        )
        _ = try await engine.helloFields()
        let sink = OrderSink()
        engine.attach(sink, deliveryEpoch: 7, resume: nil)
        try await withThrowingDiscardingTaskGroup { group in
            for sender in 0..<32 {
                group.addTask {
                    for index in 0..<150 {
                        _ = try await engine.send(
                            topic: "t",
                            body: ByteBuffer(string: "\(index)"),
                            conversation: "c\(sender)",
                            priority: .normal,
                            ttl: nil
                        )
                    }
                }
            }
        }
        let (last, late) = sink.state.withLockedValue { $0 }
        #expect(late.isEmpty, "\(late.count) messages reached the connection after a later one: \(late.prefix(5))")
        #expect(last.count == 32 && last.values.allSatisfy { $0 == 150 })
    }

    @Test("a full outbox: sends wait in order for room, a cancelled one fails with cancelled, an acknowledgement admits the next")
    func waitingForRoom() async throws {
        let engine = try self.engine(capacity: 2)
        let first = try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil)
        _ = try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil)
        let cancelled = Task { try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil) }
        try await Task.sleep(for: .milliseconds(50))
        let waiting = Task { try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil) }
        try await Task.sleep(for: .milliseconds(50))
        cancelled.cancel()
        await #expect(throws: TetherError.self) { try await cancelled.value }
        let outcome = Task { await engine.outcome(of: first.id) }
        try await self.onLoop { engine.acknowledged([Frame.MessageAck.Entry(id: first.id)]) }
        #expect(try await waiting.value.id == 3, "admitted once the first message was acknowledged")
        #expect(await outcome.value == .acknowledged)
    }

    @Test("a full outbox that fails: send throws outboxFull at once")
    func failWhenFull() async throws {
        let engine = try self.engine(capacity: 1, whenFull: .fail)
        _ = try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil)
        await #expect(throws: TetherError.self) {
            try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil)
        }
    }

    @Test("acknowledging a delivery the app does not hold is refused at once; the one it holds, or an older one, is accepted")
    func acknowledgeDelivery() async throws {
        let engine = try self.engine()
        _ = try await engine.helloFields()
        for sequence: UInt64 in 1...3 { #expect(try await self.receive(engine, sequence) == .accepted) }
        #expect(throws: TetherError.self) { try engine.acknowledgeDelivery(1) }
        #expect(try await engine.nextDelivery()?.sequence == 1)
        try engine.acknowledgeDelivery(1)
        #expect(throws: TetherError.self) { try engine.acknowledgeDelivery(2) }
        #expect(try await engine.nextDelivery()?.sequence == 2)
        try engine.acknowledgeDelivery(1)
        try engine.acknowledgeDelivery(2)
    }

    @Test("a cancelled consumer gets nil; the client's end ends a waiting one")
    func consumerEnds() async throws {
        let engine = try self.engine()
        _ = try await engine.helloFields()
        let cancelled = Task { try await engine.nextDelivery() }
        try await Task.sleep(for: .milliseconds(50))
        cancelled.cancel()
        #expect(try await cancelled.value == nil)
        let waiting = Task { try await engine.nextDelivery() }
        try await Task.sleep(for: .milliseconds(50))
        engine.finish()
        #expect(try await waiting.value == nil)
        await #expect(throws: TetherError.self) {
            try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil)
        }
    }

    @Test("a send whose task was cancelled before it asked, to a full outbox, fails with cancelled instead of waiting")
    func cancelledBeforeSending() async throws {
        let engine = try self.engine(capacity: 1)
        _ = try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil)
        let cancelled = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil)
        }
        await #expect(throws: TetherError.self) { try await cancelled.value }
    }

    /// An outbox store whose first removal waits until the test lets it go, counting removals.
    final class HeldRemovals: OutboxStore {
        let inner = InMemoryOutboxStore()
        let removals = NIOLockedValueBox(0)
        let held = NIOLockedValueBox(true)
        func load() async throws -> OutboxSnapshot { try await self.inner.load() }
        func append(_ records: [OutboxRecord], nextID: UInt64, conversations: [String: UInt64]) async throws {
            try await self.inner.append(records, nextID: nextID, conversations: conversations)
        }
        func markExpired(_ ids: [UInt64]) async throws { try await self.inner.markExpired(ids) }
        func remove(_ ids: [UInt64]) async throws {
            self.removals.withLockedValue { $0 += 1 }
            while self.held.withLockedValue({ $0 }) { try await Task.sleep(for: .milliseconds(1)) }
            try await self.inner.remove(ids)
        }
        func saveCheckpoint(_ checkpoint: DeliveryCheckpoint) async throws { try await self.inner.saveCheckpoint(checkpoint) }
    }

    @Test("acknowledgements that arrive while the maintenance is busy are removed together when it is done, none lost")
    func maintenanceBatchesWhileBusy() async throws {
        let outbox = HeldRemovals()
        let engine = ReliableEngine(
            configuration: try .init(outbox: outbox),
            eventLoop: self.loop,
            clock: SystemClock(),
            logger: Logger(label: "test")
        )
        let maintenance = Task { await engine.runMaintenance() }
        var ids: [UInt64] = []
        for _ in 0..<100 {
            ids.append(try await engine.send(topic: "t", body: ByteBuffer(), conversation: "", priority: .normal, ttl: nil).id)
        }
        // The first acknowledgement starts a removal, which the store holds: the maintenance is busy.
        let first = ids[0]
        try await self.onLoop { engine.acknowledged([Frame.MessageAck.Entry(id: first)]) }
        try await eventually("the first removal has started") { outbox.removals.withLockedValue { $0 } == 1 }
        for id in ids.dropFirst() {
            try await self.onLoop { engine.acknowledged([Frame.MessageAck.Entry(id: id)]) }
        }
        outbox.held.withLockedValue { $0 = false }
        try await eventually("every acknowledged message is removed from the store") {
            (try? await outbox.inner.load().records.isEmpty) == true
        }
        // One removal of the first, one of the 99 that came while it was held.
        #expect(outbox.removals.withLockedValue { $0 } == 2)
        engine.finish()
        await maintenance.value
    }
}

/// An in-memory outbox whose appends let other tasks run first, as a store on a queue of its own does.
final class YieldingOutboxStore: OutboxStore {
    private let store = InMemoryOutboxStore()
    func load() async throws -> OutboxSnapshot { try await self.store.load() }
    func append(_ records: [OutboxRecord], nextID: UInt64, conversations: [String: UInt64]) async throws {
        await Task.yield()
        try await self.store.append(records, nextID: nextID, conversations: conversations)
    }
    func markExpired(_ ids: [UInt64]) async throws { try await self.store.markExpired(ids) }
    func remove(_ ids: [UInt64]) async throws { try await self.store.remove(ids) }
    func saveCheckpoint(_ checkpoint: DeliveryCheckpoint) async throws { try await self.store.saveCheckpoint(checkpoint) }
}
