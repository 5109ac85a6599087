import NIOCore
import Testing

@testable import TetherCore

@Suite("Reliable lane machine")
struct ReliableLaneMachineTests {
    static let outbox = OutboxID(client: "alice", epoch: 7)
    static let now = TetherInstant(nanoseconds: 10_000_000_000)

    static func message(
        _ id: UInt64,
        _ sequence: UInt64,
        in conversation: String = "c",
        ttl: Duration? = nil,
        expired: Bool = false
    ) -> ReliableLaneMachine.Received {
        ReliableLaneMachine.Received(
            Frame.Message(id: id, topic: "dm", conversation: conversation, sequence: sequence, ttl: ttl, expired: expired),
            receivedAt: Self.now
        )
    }

    static func lane(maxDeliveries: Int = .max) -> ReliableLaneMachine {
        ReliableLaneMachine(configuration: .init(outbox: Self.outbox, maxDeliveriesPerRecipient: maxDeliveries))
    }

    static func processed(_ sequence: UInt64, id: UInt64, status: StatusCode = .ok, in conversation: String = "c") -> ProcessedMessage {
        ProcessedMessage(outbox: Self.outbox, conversation: conversation, sequence: sequence, status: status, messageID: id)
    }

    /// Runs `batch` on `lane`: loads answer `store`, every handler answers `outcome`, the commit
    /// succeeds with receipts numbered from 1. Returns the handlers run, the write and the end.
    static func run(
        _ batch: [ReliableLaneMachine.Received],
        on lane: inout ReliableLaneMachine,
        answers: Bool = true,
        allowances: [ReliableLaneMachine.Allowance] = [],
        store: DedupState = DedupState(),
        outcome: (Frame.Message) -> ReliableLaneMachine.HandlerOutcome = { _ in .processed(.ok, deliveries: []) },
        commitFails: Bool = false
    ) -> (ran: [UInt64], loads: [ReliableLaneMachine.Query], write: StoreWrite?, done: ReliableLaneMachine.Done) {
        var ran: [UInt64] = []
        var loads: [ReliableLaneMachine.Query] = []
        var write: StoreWrite?
        var step = lane.begin(batch, answers: answers, now: Self.now, allowances: allowances)
        while true {
            switch step {
            case .load(let query):
                loads.append(query)
                step = lane.loaded(store)
            case .run(let message):
                ran.append(message.id)
                step = lane.handled(outcome(message))
            case .loadUsage:
                step = lane.usageLoaded([:])
            case .commit(let pending):
                write = pending
                if commitFails { return (ran, loads, write, lane.commitFailed()) }
                let receipts = pending.deliveries.enumerated().map { DeliveryReceipt(recipient: $1.recipient, sequence: UInt64($0 + 1)) }
                return (ran, loads, write, lane.committed(receipts))
            case .done(let done):
                return (ran, loads, write, done)
            }
        }
    }

    @Test("new messages: the store is asked once per unknown conversation, handlers run in order, one write, answers after it")
    func newMessages() {
        var lane = Self.lane()
        let result = Self.run([Self.message(1, 1), Self.message(2, 2), Self.message(3, 1, in: "d")], on: &lane)
        #expect(result.loads.count == 1 && result.loads[0].conversations == ["c", "d"])
        #expect(result.ran == [1, 2, 3])
        #expect(result.write?.processed == [Self.processed(1, id: 1), Self.processed(2, id: 2), Self.processed(1, id: 3, in: "d")])
        #expect(Set(result.done.acks.map(\.id)) == [1, 2, 3] && result.done.acks.allSatisfy { $0.status == .ok })
        #expect(!lane.isBusy)

        let next = Self.run([Self.message(4, 3)], on: &lane)
        #expect(next.loads.isEmpty, "the lane knows the conversation now")
        #expect(next.ran == [4])
    }

    @Test("a retransmission of a committed message is answered with its outcome from memory: no store read, no handler, no write")
    func retransmissionFromMemory() {
        var lane = Self.lane()
        _ = Self.run([Self.message(1, 1)], on: &lane, outcome: { _ in .processed(.permissionDenied, deliveries: []) })
        let again = Self.run([Self.message(1, 1)], on: &lane)
        #expect(again.loads.isEmpty && again.ran.isEmpty && again.write == nil)
        #expect(again.done.acks == [.init(id: 1, status: .permissionDenied)], "the outcome it had, final")
    }

    @Test("a retransmission the lane does not remember is answered with the store's recorded outcome, or ok if the store forgot it")
    func retransmissionFromStore() {
        var lane = Self.lane()
        let store = DedupState(
            lastProcessed: ["c": 10],
            outcomes: [ConversationSequence(conversation: "c", sequence: 9): RecordedOutcome(status: .resourceExhausted, messageID: 9)]
        )
        let result = Self.run([Self.message(9, 9), Self.message(5, 5)], on: &lane, store: store)
        #expect(result.ran.isEmpty && result.write == nil)
        #expect(result.done.acks == [.init(id: 9, status: .resourceExhausted), .init(id: 5, status: .ok)])
    }

    @Test("another message claiming a processed sequence is a conflicting duplicate: invalid request, nothing recorded")
    func conflictingDuplicate() {
        var lane = Self.lane()
        _ = Self.run([Self.message(1, 1)], on: &lane)
        let result = Self.run([Self.message(99, 1)], on: &lane)
        #expect(result.ran.isEmpty && result.write == nil)
        #expect(result.done.acks == [.init(id: 99, status: .invalidRequest)])
        #expect(result.done.notes == [.conflict(conversation: "c", sequence: 1, message: 99, earlier: 1)])
        // The same, inside one batch.
        var fresh = Self.lane()
        let inBatch = Self.run([Self.message(1, 1), Self.message(2, 1), Self.message(1, 1)], on: &fresh)
        #expect(inBatch.ran == [1])
        #expect(Set(inBatch.done.acks) == [.init(id: 2, status: .invalidRequest), .init(id: 1, status: .ok)])
        #expect(inBatch.done.acks.filter { $0.id == 1 }.count == 2, "the copy is answered with the first, after the commit")
    }

    @Test("a message past a gap is not taken: unavailable with message answers, no answer without; it runs once the gap is filled")
    func gap() {
        var lane = Self.lane()
        let withAnswers = Self.run([Self.message(3, 3)], on: &lane)
        #expect(withAnswers.ran.isEmpty && withAnswers.write == nil)
        #expect(withAnswers.done.acks == [.init(id: 3, status: .unavailable)])
        let without = Self.run([Self.message(3, 3)], on: &lane, answers: false)
        #expect(without.done.acks.isEmpty)
        let filled = Self.run([Self.message(1, 1), Self.message(2, 2), Self.message(3, 3)], on: &lane)
        #expect(filled.ran == [1, 2, 3])
    }

    @Test("an expired message, or one whose time to live ran out before processing, is recorded deadline exceeded without its handler")
    func expired() {
        var lane = Self.lane()
        var late = Self.message(2, 2, ttl: .seconds(1))
        late.receivedAt = Self.now - .seconds(2)
        let result = Self.run([Self.message(1, 1, expired: true), late, Self.message(3, 3, ttl: .seconds(60))], on: &lane)
        #expect(result.ran == [3])
        #expect(result.write?.processed.map(\.status) == [.deadlineExceeded, .deadlineExceeded, .ok])
    }

    @Test("a transient handler failure records nothing: the message and the later ones of its conversation are not taken; others go on")
    func transient() {
        var lane = Self.lane()
        let result = Self.run(
            [Self.message(1, 1), Self.message(2, 2), Self.message(3, 1, in: "d")],
            on: &lane,
            outcome: { $0.id == 1 ? .transient : .processed(.ok, deliveries: []) }
        )
        #expect(result.ran == [1, 3], "2 waits behind 1")
        #expect(result.write?.processed == [Self.processed(1, id: 3, in: "d")])
        #expect(
            Set(result.done.acks) == [.init(id: 1, status: .unavailable), .init(id: 2, status: .unavailable), .init(id: 3, status: .ok)]
        )
        let retry = Self.run([Self.message(1, 1), Self.message(2, 2)], on: &lane)
        #expect(retry.ran == [1, 2])
    }

    @Test("the store unreadable: what needed it is not taken; a failed commit answers unavailable and makes the lane read the store again")
    func storeFailures() {
        var lane = Self.lane()
        var step = lane.begin([Self.message(1, 1)], answers: true, now: Self.now)
        guard case .load = step else {
            Issue.record("expected a load, got \(step)")
            return
        }
        step = lane.loadFailed()
        #expect(step == .done(.init(acks: [.init(id: 1, status: .unavailable)], notes: [.storeUnavailable])))

        let failed = Self.run([Self.message(1, 1)], on: &lane, commitFails: true)
        #expect(failed.ran == [1])
        #expect(failed.done.acks == [.init(id: 1, status: .unavailable)], "not processed: it is sent again")
        let again = Self.run([Self.message(1, 1)], on: &lane)
        #expect(again.loads.count == 1, "what the lane believed of the store is read again")
        #expect(again.ran == [1])
    }

    @Test("deliveries that would pass the recipient's quota are dropped and the message refused resource exhausted, for good")
    func quota() {
        var lane = Self.lane(maxDeliveries: 1)
        let delivery = NewDelivery(recipient: "bob", topic: "dm", body: ByteBuffer(string: "x"))
        let result = Self.run(
            [Self.message(1, 1), Self.message(2, 2)],
            on: &lane,
            outcome: { _ in .processed(.ok, deliveries: [delivery]) }
        )
        #expect(result.write?.deliveries == [delivery], "the first fits")
        #expect(result.write?.processed.map(\.status) == [.ok, .resourceExhausted])
        #expect(result.done.stored["bob"]?.map(\.sequence) == [1])
        #expect(result.done.notes.count == 1)
    }

    @Test(
        "a batch's allowances (the store's room, its sender's): the deliveries of a message that would pass one are dropped and it is refused, saying which; the others go on"
    )
    func allowances() {
        var lane = Self.lane()
        let small = NewDelivery(recipient: "bob", topic: "dm", body: ByteBuffer(string: "xx"))
        let large = NewDelivery(recipient: "carol", topic: "dm", body: ByteBuffer(repeating: 0x61, count: 10))
        let store = ReliableLaneMachine.Allowance(deliveries: 3, bytes: 100) { $0 ? "store: deliveries" : "store: bytes" }
        let sender = ReliableLaneMachine.Allowance(deliveries: 100, bytes: 13) { $0 ? "sender: deliveries" : "sender: bytes" }
        let result = Self.run(
            [Self.message(1, 1), Self.message(2, 2), Self.message(3, 3), Self.message(4, 4)],
            on: &lane,
            allowances: [store, sender],
            outcome: { message in
                switch message.id {
                case 1: .processed(.ok, deliveries: [small, small])  // 2 deliveries, 4 bytes
                case 2: .processed(.ok, deliveries: [large])  // 14 bytes: past the sender's 13
                case 3: .processed(.ok, deliveries: [small])  // the store's third
                default: .processed(.ok, deliveries: [small])  // past the store's 3
                }
            }
        )
        #expect(result.write?.processed.map(\.status) == [.ok, .resourceExhausted, .ok, .resourceExhausted])
        #expect(result.write?.deliveries == [small, small, small])
        #expect(result.done.notes == [.quotaExceeded("sender: bytes"), .quotaExceeded("store: deliveries")])
    }

    @Test("remembered outcomes are bounded: past the limit, the oldest are asked of the store")
    func rememberedBound() {
        var lane = ReliableLaneMachine(configuration: .init(outbox: Self.outbox, rememberedOutcomes: 2))
        _ = Self.run([Self.message(1, 1), Self.message(2, 2), Self.message(3, 3)], on: &lane)
        let recent = Self.run([Self.message(3, 3)], on: &lane)
        #expect(recent.loads.isEmpty)
        let old = Self.run([Self.message(1, 1)], on: &lane)
        #expect(old.loads == [.init(conversations: [], outcomes: [ConversationSequence(conversation: "c", sequence: 1)])])
        #expect(old.done.acks == [.init(id: 1, status: .ok)])
    }
}
