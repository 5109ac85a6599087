import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
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

    func engine(outbox: InMemoryOutboxStore = InMemoryOutboxStore()) throws -> ReliableEngine {
        ReliableEngine(
            configuration: try .init(outbox: outbox),
            eventLoop: EmbeddedEventLoop(),
            clock: SystemClock(),
            logger: Logger(label: "test")
        )
    }

    func delivery(_ sequence: UInt64) -> Frame.Delivery {
        Frame.Delivery(sequence: sequence, topic: "t", body: ByteBuffer(string: "\(sequence)"))
    }

    @Test("deliveries that arrive before their connection is attached are kept, not taken for a gap")
    func deliveriesBeforeAttach() async throws {
        let engine = try self.engine()
        _ = try await engine.helloFields()  // loads the outbox, as connecting does
        #expect(engine.receive(self.delivery(1), epoch: 7) == .accepted)
        #expect(engine.receive(self.delivery(2), epoch: 7) == .accepted)
        _ = engine.attach(Sink(), deliveryEpoch: 7, resume: nil)
        #expect(engine.receive(self.delivery(2), epoch: 7) == .duplicate)
        #expect(engine.receive(self.delivery(4), epoch: 7) == .gap(expected: 3))
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
        for sequence: UInt64 in 1...3 { #expect(engine.receive(self.delivery(sequence), epoch: 7) == .accepted) }
        for sequence: UInt64 in 1...3 { #expect(try await engine.nextDelivery()?.sequence == sequence) }
        try engine.acknowledgeDelivery(3)  // the app is done with all three; the checkpoint is saved, with no one to tell
        engine.consumerEnded()
        try await eventually("the checkpoint is saved") { (try? await outbox.load().checkpoint?.lastSequence) == 3 }
        #expect(sink.acknowledgedUpTo.withLockedValue { $0 } == 0)

        _ = engine.attach(sink, deliveryEpoch: 7, resume: nil)
        try await eventually("the gateway is told") { sink.acknowledgedUpTo.withLockedValue { $0 } == 3 }
        engine.finish()
        await maintenance.value
    }

    @Test("a connection to another gateway store starts the inbox again")
    func newEpoch() async throws {
        let engine = try self.engine()
        _ = try await engine.helloFields()
        _ = engine.attach(Sink(), deliveryEpoch: 7, resume: nil)
        #expect(engine.receive(self.delivery(1), epoch: 7) == .accepted)
        #expect(engine.receive(self.delivery(1), epoch: 8) == .accepted, "sequence numbers of store 8 start at 1")
        let resume = try await engine.helloFields().resume
        #expect(resume?.epoch == 8 && resume?.lastSequence == 0, "received, not processed: the gateway must keep it")
    }
}
