import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Testing
import TetherTestSupport

@testable import TetherCore
@testable import TetherGateway

/// A store whose `apply` records each call and waits until the test opens it; everything
/// else goes to an in-memory store.
private final class GatedStore: MessageStore {
    private struct State {
        var calls: [[StoreWrite]] = []
        var open = 0
        var waiting: [CheckedContinuation<Void, Never>] = []
        var failure: (any Error)?
        var failing: Set<Int> = []
    }

    private let inner = InMemoryMessageStore()
    private let state = NIOLockedValueBox(State())
    let concurrentApplies: Int

    init(concurrentApplies: Int = 1) {
        self.concurrentApplies = concurrentApplies
    }

    var epoch: UInt64 { self.inner.epoch }
    var calls: [[StoreWrite]] { self.state.withLockedValue { $0.calls } }
    var callsWaiting: Int { self.state.withLockedValue { $0.waiting.count } }

    /// Lets one waiting (or future) call of `apply` go on.
    func openOnce() {
        let waiter = self.state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
            guard !state.waiting.isEmpty else {
                state.open += 1
                return nil
            }
            return state.waiting.removeFirst()
        }
        waiter?.resume()
    }

    /// The next calls fail as a whole with `error`, or only the writes at `positions`.
    func fail(with error: (any Error)?, positions: Set<Int> = []) {
        self.state.withLockedValue {
            $0.failure = error
            $0.failing = positions
        }
    }

    func apply(_ writes: [StoreWrite]) async throws -> [Result<[DeliveryReceipt], MessageStoreError>] {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let go = self.state.withLockedValue { state -> Bool in
                state.calls.append(writes)
                if state.open > 0 {
                    state.open -= 1
                    return true
                }
                state.waiting.append(continuation)
                return false
            }
            if go { continuation.resume() }
        }
        let (failure, failing) = self.state.withLockedValue { ($0.failure, $0.failing) }
        if let failure { throw failure }
        // A failing write is not applied, as a store's would not be.
        let applied = try await self.inner.apply(writes.indices.filter { !failing.contains($0) }.map { writes[$0] })
        var results = applied.makeIterator()
        return writes.indices.map { position in
            failing.contains(position)
                ? .failure(MessageStoreError(code: .conflict, message: "write \(position) conflicts")) : results.next()!
        }
    }

    func dedupState(of outbox: OutboxID, conversations: Set<String>, outcomes: [ConversationSequence]) async throws -> DedupState {
        try await self.inner.dedupState(of: outbox, conversations: conversations, outcomes: outcomes)
    }

    func deliveries(for recipient: String, after sequence: UInt64, limit: Int) async throws -> [StoredDelivery] {
        try await self.inner.deliveries(for: recipient, after: sequence, limit: limit)
    }

    func usage(of recipients: [String]) async throws -> [String: StreamUsage] {
        try await self.inner.usage(of: recipients)
    }

    func touchOutboxes(_ outboxes: [OutboxID], at time: Date) async throws {
        try await self.inner.touchOutboxes(outboxes, at: time)
    }

    func forgetOutboxes(notSeenSince time: Date) async throws -> Int {
        try await self.inner.forgetOutboxes(notSeenSince: time)
    }
}

@Suite("Store writer (group commit)")
struct StoreWriterTests {
    static func write(_ sequence: UInt64, to recipient: String = "bob", from client: String = "alice") -> StoreWrite {
        StoreWrite(
            processed: [
                ProcessedMessage(outbox: OutboxID(client: client, epoch: 1), conversation: "c", sequence: sequence, messageID: sequence)
            ],
            deliveries: [NewDelivery(recipient: recipient, topic: "dm", body: ByteBuffer(string: "\(sequence)"))]
        )
    }

    @Test("writes that arrive while one is applied go together in the next call to the store, each with its own receipts")
    func groupCommit() async throws {
        let store = GatedStore()
        let writer = StoreWriter(store: store)
        let first = Task { try await writer.commit(Self.write(1)) }
        try await eventually("the first write is being applied") { store.callsWaiting == 1 }
        // One after another: the writes of a conversation wait in the order they arrive.
        var others: [Task<[DeliveryReceipt], any Error>] = []
        for sequence in 2...4 {
            others.append(Task { try await writer.commit(Self.write(UInt64(sequence))) })
            try await eventually("write \(sequence) waits for the next round") { writer.writesWaiting == sequence - 1 }
        }
        #expect(store.calls.count == 1)
        store.openOnce()
        let firstReceipts = try await first.value
        #expect(firstReceipts == [DeliveryReceipt(recipient: "bob", sequence: 1)])
        try await eventually("the second round is applied") { store.calls.count >= 2 }
        store.openOnce()
        var sequences: [UInt64] = []
        for task in others { sequences += try await task.value.map(\.sequence) }
        #expect(store.calls.map(\.count) == [1, 3], "one call for the first, one for the three that waited")
        #expect(sequences.sorted() == [2, 3, 4], "each write gets the receipts of its own deliveries")
    }

    @Test("a failed write fails only its caller; a failed call fails every write in it")
    func failures() async throws {
        let store = GatedStore()
        let writer = StoreWriter(store: store)
        store.fail(with: nil, positions: [0])
        store.openOnce()
        await #expect(throws: MessageStoreError.self) { try await writer.commit(Self.write(1)) }
        #expect(writer.failing == nil, "one write's conflict is not the store failing")
        store.fail(with: nil)
        store.openOnce()
        #expect(try await writer.commit(Self.write(1)).count == 1, "the writer goes on after a failed write")
        store.fail(with: MessageStoreError(code: .storage, message: "database or disk is full"))
        store.openOnce()
        let error = await #expect(throws: MessageStoreError.self) { try await writer.commit(Self.write(2)) }
        #expect(error?.code == .storage)
        #expect(writer.failing == "database or disk is full", "/ready says why until a round succeeds")
        store.fail(with: nil)
        store.openOnce()
        #expect(try await writer.commit(Self.write(2)).count == 1)
        #expect(writer.failing == nil)
    }

    @Test("a store that takes several rounds at once gets them at once; writes wait, and go together, only when every slot is busy")
    func concurrentRounds() async throws {
        let store = GatedStore(concurrentApplies: 2)
        let writer = StoreWriter(store: store)
        let first = Task { try await writer.commit(Self.write(1, from: "alice")) }
        let second = Task { try await writer.commit(Self.write(1, from: "carol")) }
        try await eventually("two rounds are under way at once") { store.callsWaiting == 2 }
        #expect(writer.writesWaiting == 0)
        let later = ["dave", "erin"].map { client in Task { try await writer.commit(Self.write(1, from: client)) } }
        try await eventually("both slots busy: two writes wait") { writer.writesWaiting == 2 }
        store.openOnce()
        try await eventually("a finished round hands its slot to the writes waiting, together") { store.calls.count == 3 }
        store.openOnce()
        store.openOnce()
        _ = try await first.value
        _ = try await second.value
        for task in later { _ = try await task.value }
        #expect(store.calls.map(\.count) == [1, 1, 2])
        #expect(writer.writesWaiting == 0)
        // Every slot free again: the next write leads a round of its own at once.
        store.openOnce()
        #expect(try await writer.commit(Self.write(2, from: "alice")).count == 1)
    }
}
