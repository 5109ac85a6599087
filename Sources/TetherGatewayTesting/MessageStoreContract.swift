import Foundation
import NIOCore
public import TetherGateway

/// The contract every ``MessageStore`` meets (see the protocol's documentation), as checks to
/// run against a store: the in-memory and SQLite stores pass them in Tether's own tests; a
/// store of your own (a server database) should pass them too.
///
/// Each check takes a fresh, empty store and throws ``Violation`` where the store breaks the
/// contract.
///
/// ```swift
/// @Test(arguments: MessageStoreContract.checks)
/// func contract(_ check: MessageStoreContract.Check) async throws {
///     try await check.run(on: try MyPostgresStore(url: testDatabase))
/// }
/// ```
public enum MessageStoreContract {
    /// One rule of the contract.
    public struct Check: Sendable, CustomStringConvertible {
        /// What it checks.
        public let name: String
        private let body: @Sendable (any MessageStore) async throws -> Void

        init(_ name: String, _ body: @escaping @Sendable (any MessageStore) async throws -> Void) {
            self.name = name
            self.body = body
        }

        /// Runs the check on a fresh, empty store.
        /// - Throws: ``Violation``, or the store's own error.
        public func run(on store: any MessageStore) async throws {
            try await self.body(store)
        }

        public var description: String { self.name }
    }

    /// Where a store breaks the contract.
    public struct Violation: Error, CustomStringConvertible {
        public var description: String
    }

    /// Every check.
    public static let checks: [Check] = [
        Check("conversations advance one sequence at a time; a gap or a replay is a conflict that writes nothing", ordering),
        Check("several writes in one apply: each atomic, in order; a conflicting one is left out alone", groupCommit),
        Check("outcomes and message ids are recorded, for the last 10,000 sequences of a conversation", outcomes),
        Check("dedupState answers what was asked: last processed (0 if none) and the outcomes still known", dedupState),
        Check("deliveries are numbered per recipient from 1, kept until acknowledged, never renumbered", deliveries),
        Check("usage: the deliveries each recipient has waiting and their bytes, less what it acknowledged", usage),
        Check("total usage: every recipient's waiting deliveries and bytes together, less what they acknowledged", totalUsage),
        Check("a compressed delivery's payload and flag are kept as they were written", compressedDeliveries),
        Check("each outbox of a client id has conversations of its own", outboxesOfOneClient),
        Check("outboxes not seen since a time are forgotten with their state; the others are kept", forgetting),
    ]

    // MARK: The checks

    static let a = OutboxID(client: "a", epoch: 1)

    static func expect(_ condition: Bool, _ message: @autoclosure () -> String) throws {
        if !condition { throw Violation(description: message()) }
    }

    static func expectConflict(_ write: StoreWrite, on store: any MessageStore, _ what: String) async throws {
        let results = try await store.apply([write])
        guard case .failure(let error) = results.first, error.code == .conflict else {
            throw Violation(description: "\(what): expected a conflict, got \(results)")
        }
    }

    static func body(_ text: String) -> ByteBuffer { ByteBuffer(string: text) }

    static func processed(_ sequences: ClosedRange<UInt64>, outbox: OutboxID = a, conversation: String = "c") -> [ProcessedMessage] {
        sequences.map { ProcessedMessage(outbox: outbox, conversation: conversation, sequence: $0, messageID: 1000 + $0) }
    }

    @Sendable static func ordering(_ store: any MessageStore) async throws {
        try expect(try await store.lastProcessed(a, conversation: "c") == 0, "a new conversation has processed nothing")
        let receipts = try await store.commit(
            StoreWrite(processed: processed(1...2), deliveries: [NewDelivery(recipient: "b", topic: "t", body: body("one"))])
        )
        try expect(receipts == [DeliveryReceipt(recipient: "b", sequence: 1)], "receipts: \(receipts)")
        try expect(try await store.lastProcessed(a, conversation: "c") == 2, "last processed after 1 and 2")
        try expect(try await store.lastProcessed(a, conversation: "other") == 0, "another conversation is untouched")
        for bad in [UInt64(2), 4] {
            try await expectConflict(
                StoreWrite(processed: processed(bad...bad), deliveries: [NewDelivery(recipient: "b", topic: "t", body: body("no"))]),
                on: store,
                "sequence \(bad) after 2"
            )
        }
        try await expectConflict(StoreWrite(processed: processed(3...3) + processed(5...5)), on: store, "a write valid up to a gap")
        try expect(try await store.lastProcessed(a, conversation: "c") == 2, "a conflict writes nothing")
        let stored = try await store.deliveries(for: "b", after: 0, limit: 10)
        try expect(stored.map(\.body) == [body("one")], "a conflict's deliveries are not stored: \(stored)")
    }

    @Sendable static func groupCommit(_ store: any MessageStore) async throws {
        let results = try await store.apply([
            StoreWrite(processed: processed(1...1), deliveries: [NewDelivery(recipient: "b", topic: "t", body: body("1"))]),
            StoreWrite(processed: processed(3...3), deliveries: [NewDelivery(recipient: "b", topic: "t", body: body("conflict"))]),
            StoreWrite(processed: processed(2...2), deliveries: [NewDelivery(recipient: "b", topic: "t", body: body("2"))]),
            StoreWrite(deliveries: [NewDelivery(recipient: "b", topic: "t", body: body("3"))], acknowledgements: ["b": 1]),
        ])
        try expect(results.count == 4, "one result per write")
        try expect((try? results[0].get()) == [DeliveryReceipt(recipient: "b", sequence: 1)], "the first write: \(results[0])")
        guard case .failure(let error) = results[1], error.code == .conflict else {
            throw Violation(description: "the second write skips 2: a conflict, got \(results[1])")
        }
        try expect((try? results[2].get()) == [DeliveryReceipt(recipient: "b", sequence: 2)], "the third follows the first: \(results[2])")
        try expect((try? results[3].get()) == [DeliveryReceipt(recipient: "b", sequence: 3)], "the fourth: \(results[3])")
        try expect(try await store.lastProcessed(a, conversation: "c") == 2, "writes apply in order")
        let waiting = try await store.deliveries(for: "b", after: 0, limit: 10).map(\.sequence)
        try expect(waiting == [2, 3], "1 acknowledged in the same apply, the conflict's not stored: \(waiting)")
    }

    @Sendable static func outcomes(_ store: any MessageStore) async throws {
        let processed = (1...10_002 as ClosedRange<UInt64>).map { sequence in
            ProcessedMessage(
                outbox: a,
                conversation: "c",
                sequence: sequence,
                status: sequence == 3 ? .invalidRequest : .ok,
                messageID: 1000 + sequence
            )
        }
        for start in stride(from: 0, to: processed.count, by: 500) {
            _ = try await store.commit(StoreWrite(processed: Array(processed[start..<min(start + 500, processed.count)])))
        }
        let last = try await store.recordedOutcome(a, conversation: "c", sequence: 10_002)
        try expect(last == RecordedOutcome(status: .ok, messageID: 11_002), "the last outcome: \(String(describing: last))")
        let refused = try await store.recordedOutcome(a, conversation: "c", sequence: 3)
        try expect(
            refused == RecordedOutcome(status: .invalidRequest, messageID: 1003),
            "a refusal is kept with its id: \(String(describing: refused))"
        )
        try expect(try await store.recordedOutcome(a, conversation: "c", sequence: 2) == nil, "2 is beyond the window of 10,000")
        try expect(try await store.recordedOutcome(a, conversation: "d", sequence: 1) == nil, "nothing for another conversation")
    }

    @Sendable static func dedupState(_ store: any MessageStore) async throws {
        _ = try await store.commit(StoreWrite(processed: processed(1...3)))
        let asked = [ConversationSequence(conversation: "c", sequence: 2), ConversationSequence(conversation: "c", sequence: 9)]
        let state = try await store.dedupState(of: a, conversations: ["c", "new"], outcomes: asked)
        try expect(state.lastProcessed == ["c": 3, "new": 0], "last processed of each conversation asked: \(state.lastProcessed)")
        try expect(
            state.outcomes == [asked[0]: RecordedOutcome(status: .ok, messageID: 1002)],
            "only the outcomes it has, of the positions asked: \(state.outcomes)"
        )
        let other = try await store.dedupState(of: OutboxID(client: "a", epoch: 2), conversations: ["c"], outcomes: asked)
        try expect(other.lastProcessed == ["c": 0] && other.outcomes.isEmpty, "another outbox of the client knows nothing of it")
    }

    @Sendable static func deliveries(_ store: any MessageStore) async throws {
        let first = try await store.commit(
            StoreWrite(deliveries: [
                NewDelivery(recipient: "b", topic: "t", body: body("b1")), NewDelivery(recipient: "c", topic: "t", body: body("c1")),
                NewDelivery(recipient: "b", topic: "u", body: body("b2")),
            ])
        )
        try expect(
            first == [
                DeliveryReceipt(recipient: "b", sequence: 1), DeliveryReceipt(recipient: "c", sequence: 1),
                DeliveryReceipt(recipient: "b", sequence: 2),
            ],
            "numbered per recipient: \(first)"
        )
        let more = try await store.commit(
            StoreWrite(deliveries: (3...10).map { NewDelivery(recipient: "b", topic: "t", body: body("b\($0)")) })
        )
        try expect(more.map(\.sequence) == Array(3...10), "then 3 to 10: \(more)")
        try expect(try await store.deliveries(for: "b", after: 0, limit: 3).map(\.sequence) == [1, 2, 3], "the first three, in order")
        try expect(try await store.deliveries(for: "b", after: 8, limit: 10).map(\.sequence) == [9, 10], "after 8")
        let second = try await store.deliveries(for: "b", after: 1, limit: 1).first
        try expect(
            second == StoredDelivery(sequence: 2, topic: "u", body: body("b2")),
            "topic and body kept: \(String(describing: second))"
        )
        try await store.acknowledge(recipient: "b", upTo: 9)
        try expect(try await store.deliveries(for: "b", after: 0, limit: 100).map(\.sequence) == [10], "acknowledged up to 9")
        try expect(try await store.deliveries(for: "c", after: 0, limit: 100).map(\.sequence) == [1], "another recipient is untouched")
        let next = try await store.commit(StoreWrite(deliveries: [NewDelivery(recipient: "b", topic: "t", body: body("b11"))]))
        try expect(next.map(\.sequence) == [11], "acknowledged numbers are never reused")
    }

    @Sendable static func usage(_ store: any MessageStore) async throws {
        try expect(try await store.usage(of: "b") == StreamUsage(deliveries: 0, bytes: 0), "nothing waits for a new recipient")
        _ = try await store.commit(
            StoreWrite(deliveries: [
                NewDelivery(recipient: "b", topic: "t", body: body("12345")), NewDelivery(recipient: "b", topic: "t", body: body("123")),
                NewDelivery(recipient: "c", topic: "t", body: body("1")),
            ])
        )
        let both = try await store.usage(of: ["b", "c", "d"])
        try expect(
            both == [
                "b": StreamUsage(deliveries: 2, bytes: 8), "c": StreamUsage(deliveries: 1, bytes: 1),
                "d": StreamUsage(deliveries: 0, bytes: 0),
            ],
            "each recipient asked: \(both)"
        )
        try await store.acknowledge(recipient: "b", upTo: 1)
        try expect(try await store.usage(of: "b") == StreamUsage(deliveries: 1, bytes: 3), "less what b acknowledged")
    }

    @Sendable static func totalUsage(_ store: any MessageStore) async throws {
        try expect(try await store.totalUsage() == StreamUsage(deliveries: 0, bytes: 0), "an empty store holds nothing")
        _ = try await store.commit(
            StoreWrite(deliveries: [
                NewDelivery(recipient: "b", topic: "t", body: body("12345")), NewDelivery(recipient: "b", topic: "t", body: body("123")),
                NewDelivery(recipient: "c", topic: "t", body: body("1")),
            ])
        )
        try expect(try await store.totalUsage() == StreamUsage(deliveries: 3, bytes: 9), "every recipient together")
        try await store.acknowledge(recipient: "b", upTo: 1)
        let total = try await store.totalUsage()
        try expect(total == StreamUsage(deliveries: 2, bytes: 4), "less what was acknowledged: \(String(describing: total))")
    }

    @Sendable static func compressedDeliveries(_ store: any MessageStore) async throws {
        _ = try await store.commit(
            StoreWrite(deliveries: [
                NewDelivery(recipient: "b", topic: "t", body: body("deflated"), compressed: true),
                NewDelivery(recipient: "b", topic: "t", body: body("plain")),
            ])
        )
        let stored = try await store.deliveries(for: "b", after: 0, limit: 10)
        try expect(
            stored == [
                StoredDelivery(sequence: 1, topic: "t", body: body("deflated"), compressed: true),
                StoredDelivery(sequence: 2, topic: "t", body: body("plain"), compressed: false),
            ],
            "kept as written: \(stored)"
        )
        try expect(try await store.usage(of: "b") == StreamUsage(deliveries: 2, bytes: 13), "counted as stored")
    }

    @Sendable static func outboxesOfOneClient(_ store: any MessageStore) async throws {
        let phone = OutboxID(client: "a", epoch: 7)
        let tablet = OutboxID(client: "a", epoch: 8)
        try await store.touchOutboxes([phone, tablet], at: Date())
        _ = try await store.commit(
            StoreWrite(processed: [ProcessedMessage(outbox: phone, conversation: "c", sequence: 1, status: .invalidRequest)])
        )
        _ = try await store.commit(StoreWrite(processed: processed(1...2, outbox: tablet)))
        try expect(try await store.lastProcessed(phone, conversation: "c") == 1, "the phone's conversation")
        try expect(try await store.lastProcessed(tablet, conversation: "c") == 2, "the tablet's conversation")
        try expect(try await store.recordedOutcome(phone, conversation: "c", sequence: 1)?.status == .invalidRequest, "the phone's outcome")
        try expect(try await store.recordedOutcome(tablet, conversation: "c", sequence: 1)?.status == .ok, "the tablet's outcome")
        try await expectConflict(StoreWrite(processed: processed(3...3, outbox: phone)), on: store, "the phone's 3 after its 1")
        let reinstalled = OutboxID(client: "a", epoch: 9)
        try await store.touchOutboxes([reinstalled], at: Date())
        try expect(try await store.lastProcessed(reinstalled, conversation: "c") == 0, "a new outbox starts at 1")
        try expect(try await store.lastProcessed(phone, conversation: "c") == 1, "and leaves the others alone")
    }

    @Sendable static func forgetting(_ store: any MessageStore) async throws {
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        let old = OutboxID(client: "a", epoch: 1)
        let recent = OutboxID(client: "a", epoch: 2)
        let other = OutboxID(client: "b", epoch: 1)
        try await store.touchOutboxes([old, recent, other], at: start)
        for outbox in [old, recent, other] {
            _ = try await store.commit(
                StoreWrite(processed: [
                    ProcessedMessage(outbox: outbox, conversation: "c", sequence: 1, status: .permissionDenied, messageID: 1)
                ])
            )
        }
        try await store.touchOutboxes([recent], at: start + 100)
        try await store.touchOutboxes([other], at: start + 200)
        try await store.touchOutboxes([other], at: start + 10)  // an earlier time does not move it back
        try expect(try await store.forgetOutboxes(notSeenSince: start) == 0, "seen at that time: kept")
        try expect(try await store.forgetOutboxes(notSeenSince: start + 50) == 1, "one not seen since")
        try expect(try await store.lastProcessed(old, conversation: "c") == 0, "its conversations are gone")
        try expect(try await store.recordedOutcome(old, conversation: "c", sequence: 1) == nil, "its outcomes are gone too")
        try expect(try await store.lastProcessed(recent, conversation: "c") == 1, "the recent one is kept")
        try expect(
            try await store.recordedOutcome(recent, conversation: "c", sequence: 1)?.status == .permissionDenied,
            "with its outcomes"
        )
        try expect(try await store.forgetOutboxes(notSeenSince: start + 150) == 1, "then the recent one")
        try expect(try await store.lastProcessed(recent, conversation: "c") == 0, "forgotten")
        try expect(try await store.lastProcessed(other, conversation: "c") == 1, "the latest is kept")
    }
}
