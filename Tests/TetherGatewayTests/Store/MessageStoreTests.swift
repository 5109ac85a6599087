import Foundation
import GRDB
import NIOCore
import Testing
import TetherGateway

/// The contract of ``MessageStore``, checked against every implementation.
@Suite("Message stores")
struct MessageStoreTests {
    enum Kind: String, CaseIterable, CustomStringConvertible {
        case inMemory, sqliteInMemory, sqliteFile
        var description: String { self.rawValue }
    }

    static func temporaryPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("tether-store-\(UUID().uuidString).sqlite").path
    }

    func make(_ kind: Kind) throws -> any MessageStore {
        switch kind {
        case .inMemory: InMemoryMessageStore()
        case .sqliteInMemory: try SQLiteMessageStore.inMemory()
        case .sqliteFile: try SQLiteMessageStore(path: Self.temporaryPath())
        }
    }

    func body(_ text: String) -> ByteBuffer { ByteBuffer(string: text) }

    let a = OutboxID(client: "a", epoch: 1)

    @Test("conversations advance one sequence at a time; a gap or a replay is a conflict that writes nothing", arguments: Kind.allCases)
    func ordering(_ kind: Kind) async throws {
        let store = try self.make(kind)
        #expect(try await store.lastProcessed(self.a, conversation: "c") == 0)
        let receipts = try await store.commit(
            processed: [.init(outbox: self.a, conversation: "c", sequence: 1), .init(outbox: self.a, conversation: "c", sequence: 2)],
            deliveries: [.init(recipient: "b", topic: "t", body: self.body("one"))]
        )
        #expect(receipts == [.init(recipient: "b", sequence: 1)])
        #expect(try await store.lastProcessed(self.a, conversation: "c") == 2)
        #expect(try await store.lastProcessed(self.a, conversation: "other") == 0)

        for bad in [UInt64(2), 4] {
            await #expect(throws: MessageStoreError.self) {
                _ = try await store.commit(
                    processed: [.init(outbox: self.a, conversation: "c", sequence: bad)],
                    deliveries: [.init(recipient: "b", topic: "t", body: self.body("must not be stored"))]
                )
            }
        }
        // A batch that is valid up to a conflicting message writes nothing either.
        await #expect(throws: MessageStoreError.self) {
            _ = try await store.commit(
                processed: [.init(outbox: self.a, conversation: "c", sequence: 3), .init(outbox: self.a, conversation: "c", sequence: 5)],
                deliveries: []
            )
        }
        #expect(try await store.lastProcessed(self.a, conversation: "c") == 2)
        #expect(try await store.deliveries(for: "b", after: 0, limit: 10).map(\.body) == [self.body("one")])
    }

    @Test("refusals are remembered so a retransmission gets the same status", arguments: Kind.allCases)
    func refusals(_ kind: Kind) async throws {
        let store = try self.make(kind)
        _ = try await store.commit(
            processed: [
                .init(outbox: self.a, conversation: "c", sequence: 1),
                .init(outbox: self.a, conversation: "c", sequence: 2, status: .invalidRequest),
            ],
            deliveries: []
        )
        #expect(try await store.outcome(self.a, conversation: "c", sequence: 1) == .ok)
        #expect(try await store.outcome(self.a, conversation: "c", sequence: 2) == .invalidRequest)
        #expect(try await store.outcome(OutboxID(client: "x", epoch: 1), conversation: "c", sequence: 2) == .ok)
    }

    @Test("outcomes and message ids are recorded for the last 10,000 sequences of a conversation", arguments: Kind.allCases)
    func recordedOutcomes(_ kind: Kind) async throws {
        let store = try self.make(kind)
        let processed = (1...10_002 as ClosedRange<UInt64>).map { sequence in
            ProcessedMessage(
                outbox: self.a,
                conversation: "c",
                sequence: sequence,
                status: sequence == 3 ? .invalidRequest : .ok,
                messageID: 1000 + sequence
            )
        }
        for batch in stride(from: 0, to: processed.count, by: 500) {
            _ = try await store.commit(processed: Array(processed[batch..<min(batch + 500, processed.count)]), deliveries: [])
        }
        #expect(try await store.recordedOutcome(self.a, conversation: "c", sequence: 10_002) == .init(status: .ok, messageID: 11_002))
        #expect(try await store.recordedOutcome(self.a, conversation: "c", sequence: 3) == .init(status: .invalidRequest, messageID: 1003))
        #expect(try await store.recordedOutcome(self.a, conversation: "c", sequence: 2) == nil, "beyond the window")
        #expect(try await store.outcome(self.a, conversation: "c", sequence: 2) == .ok, "processed, outcome no longer known")
        #expect(try await store.recordedOutcome(self.a, conversation: "d", sequence: 1) == nil)
    }

    @Test("deliveries are numbered per recipient from 1, kept until acknowledged, never renumbered", arguments: Kind.allCases)
    func deliveries(_ kind: Kind) async throws {
        let store = try self.make(kind)
        let first = try await store.commit(
            processed: [],
            deliveries: [
                .init(recipient: "b", topic: "t", body: self.body("b1")),
                .init(recipient: "c", topic: "t", body: self.body("c1")),
                .init(recipient: "b", topic: "u", body: self.body("b2")),
            ]
        )
        #expect(first == [.init(recipient: "b", sequence: 1), .init(recipient: "c", sequence: 1), .init(recipient: "b", sequence: 2)])
        let more = try await store.commit(
            processed: [],
            deliveries: (3...10).map { .init(recipient: "b", topic: "t", body: self.body("b\($0)")) }
        )
        #expect(more.map(\.sequence) == Array(3...10))

        #expect(try await store.deliveries(for: "b", after: 0, limit: 3).map(\.sequence) == [1, 2, 3])
        #expect(try await store.deliveries(for: "b", after: 8, limit: 10).map(\.sequence) == [9, 10])
        #expect(
            try await store.deliveries(for: "b", after: 1, limit: 1).first == StoredDelivery(sequence: 2, topic: "u", body: self.body("b2"))
        )

        try await store.acknowledge(recipient: "b", upTo: 9)
        #expect(try await store.deliveries(for: "b", after: 0, limit: 100).map(\.sequence) == [10])
        #expect(try await store.deliveries(for: "c", after: 0, limit: 100).map(\.sequence) == [1])
        let next = try await store.commit(processed: [], deliveries: [.init(recipient: "b", topic: "t", body: self.body("b11"))])
        #expect(next.map(\.sequence) == [11], "acknowledged numbers are never reused")
    }

    @Test("usage: the deliveries a recipient has waiting and their bytes, less what it acknowledged", arguments: Kind.allCases)
    func usage(_ kind: Kind) async throws {
        let store = try self.make(kind)
        #expect(try await store.usage(of: "b") == StreamUsage(deliveries: 0, bytes: 0))
        _ = try await store.commit(
            processed: [],
            deliveries: [
                .init(recipient: "b", topic: "t", body: self.body("12345")), .init(recipient: "b", topic: "t", body: self.body("123")),
                .init(recipient: "c", topic: "t", body: self.body("1")),
            ]
        )
        #expect(try await store.usage(of: "b") == StreamUsage(deliveries: 2, bytes: 8))
        try await store.acknowledge(recipient: "b", upTo: 1)
        #expect(try await store.usage(of: "b") == StreamUsage(deliveries: 1, bytes: 3))
        #expect(try await store.usage(of: "c") == StreamUsage(deliveries: 1, bytes: 1))
    }

    @Test("each outbox of a client id has conversations of its own", arguments: Kind.allCases)
    func outboxesOfOneClient(_ kind: Kind) async throws {
        let store = try self.make(kind)
        let phone = OutboxID(client: "a", epoch: 7)
        let tablet = OutboxID(client: "a", epoch: 8)
        try await store.touchOutboxes([phone, tablet], at: Date())
        _ = try await store.commit(
            processed: [.init(outbox: phone, conversation: "c", sequence: 1, status: .invalidRequest)],
            deliveries: []
        )
        _ = try await store.commit(processed: [.init(outbox: tablet, conversation: "c", sequence: 1)], deliveries: [])
        _ = try await store.commit(processed: [.init(outbox: tablet, conversation: "c", sequence: 2)], deliveries: [])
        #expect(try await store.lastProcessed(phone, conversation: "c") == 1)
        #expect(try await store.lastProcessed(tablet, conversation: "c") == 2)
        #expect(try await store.outcome(phone, conversation: "c", sequence: 1) == .invalidRequest)
        #expect(try await store.outcome(tablet, conversation: "c", sequence: 1) == .ok)
        await #expect(throws: MessageStoreError.self, "the phone's conversation is at 1: its 3 does not follow") {
            _ = try await store.commit(processed: [.init(outbox: phone, conversation: "c", sequence: 3)], deliveries: [])
        }
        // A new outbox (the app reinstalled) starts at 1 and leaves the others alone.
        let reinstalled = OutboxID(client: "a", epoch: 9)
        try await store.touchOutboxes([reinstalled], at: Date())
        #expect(try await store.lastProcessed(reinstalled, conversation: "c") == 0)
        #expect(try await store.lastProcessed(phone, conversation: "c") == 1)
    }

    @Test("outboxes not seen since a time are forgotten with their state; the others are kept", arguments: Kind.allCases)
    func forgetting(_ kind: Kind) async throws {
        let store = try self.make(kind)
        let start = Date(timeIntervalSince1970: 1_800_000_000)
        let old = OutboxID(client: "a", epoch: 1)
        let recent = OutboxID(client: "a", epoch: 2)
        let other = OutboxID(client: "b", epoch: 1)
        try await store.touchOutboxes([old, recent, other], at: start)
        for outbox in [old, recent, other] {
            _ = try await store.commit(
                processed: [.init(outbox: outbox, conversation: "c", sequence: 1, status: .permissionDenied)],
                deliveries: []
            )
        }
        try await store.touchOutboxes([recent], at: start + 100)
        try await store.touchOutboxes([other], at: start + 200)
        try await store.touchOutboxes([other], at: start + 10)  // an earlier time does not move it back

        #expect(try await store.forgetOutboxes(notSeenSince: start) == 0, "seen at that time: kept")
        #expect(try await store.forgetOutboxes(notSeenSince: start + 50) == 1)
        #expect(try await store.lastProcessed(old, conversation: "c") == 0)
        #expect(try await store.outcome(old, conversation: "c", sequence: 1) == .ok, "its refusals are gone too")
        #expect(try await store.lastProcessed(recent, conversation: "c") == 1)
        #expect(try await store.outcome(recent, conversation: "c", sequence: 1) == .permissionDenied)
        #expect(try await store.forgetOutboxes(notSeenSince: start + 150) == 1)
        #expect(try await store.lastProcessed(recent, conversation: "c") == 0)
        #expect(try await store.lastProcessed(other, conversation: "c") == 1)
    }

    @Test("a SQLite store keeps everything, and its epoch, across a close and reopen")
    func persistence() async throws {
        let path = Self.temporaryPath()
        let epoch: UInt64
        do {
            let store = try SQLiteMessageStore(path: path)
            epoch = store.epoch
            try await store.touchOutboxes([self.a], at: Date())
            _ = try await store.commit(
                processed: [.init(outbox: self.a, conversation: "c", sequence: 1)],
                deliveries: [.init(recipient: "b", topic: "t", body: self.body("kept"))]
            )
        }
        let reopened = try SQLiteMessageStore(path: path)
        #expect(reopened.epoch == epoch)
        #expect(try await reopened.lastProcessed(self.a, conversation: "c") == 1)
        #expect(try await reopened.deliveries(for: "b", after: 0, limit: 10).map(\.body) == [self.body("kept")])
        #expect(try await reopened.forgetOutboxes(notSeenSince: Date() - 3600) == 0)
        #expect(try await reopened.lastProcessed(self.a, conversation: "c") == 1)
        #expect(try SQLiteMessageStore(path: Self.temporaryPath()).epoch != epoch, "another store has another epoch")
    }

    @Test("a store of the first schema (one outbox per client id) keeps its conversations, now its outbox's")
    func migrationFromOneOutboxPerClient() async throws {
        let path = Self.temporaryPath()
        let queue = try DatabaseQueue(path: path)
        try await queue.write { db in
            try db.execute(
                sql: """
                    CREATE TABLE grdb_migrations (identifier TEXT NOT NULL PRIMARY KEY);
                    INSERT INTO grdb_migrations VALUES ('v1');
                    CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
                    INSERT INTO meta VALUES ('epoch', 4242);
                    CREATE TABLE outboxes (client TEXT PRIMARY KEY NOT NULL, epoch INTEGER NOT NULL) WITHOUT ROWID;
                    CREATE TABLE conversations (
                        client TEXT NOT NULL, conversation TEXT NOT NULL, last_sequence INTEGER NOT NULL,
                        PRIMARY KEY (client, conversation)) WITHOUT ROWID;
                    CREATE TABLE refusals (
                        client TEXT NOT NULL, conversation TEXT NOT NULL, sequence INTEGER NOT NULL, status INTEGER NOT NULL,
                        PRIMARY KEY (client, conversation, sequence)) WITHOUT ROWID;
                    CREATE TABLE streams (recipient TEXT PRIMARY KEY NOT NULL, next_sequence INTEGER NOT NULL) WITHOUT ROWID;
                    CREATE TABLE deliveries (
                        recipient TEXT NOT NULL, sequence INTEGER NOT NULL, topic TEXT NOT NULL, body BLOB NOT NULL,
                        PRIMARY KEY (recipient, sequence)) WITHOUT ROWID;
                    INSERT INTO outboxes VALUES ('a', 7);
                    INSERT INTO conversations VALUES ('a', 'c', 5), ('a', 'd', 2);
                    INSERT INTO refusals VALUES ('a', 'c', 4, 7);
                    INSERT INTO streams VALUES ('b', 3);
                    INSERT INTO deliveries VALUES ('b', 2, 't', x'6869');
                    """
            )
        }
        try queue.close()

        let store = try SQLiteMessageStore(path: path)
        let outbox = OutboxID(client: "a", epoch: 7)
        #expect(store.epoch == 4242)
        #expect(try await store.lastProcessed(outbox, conversation: "c") == 5)
        #expect(try await store.lastProcessed(outbox, conversation: "d") == 2)
        #expect(try await store.outcome(outbox, conversation: "c", sequence: 4) == StatusCode(rawValue: 7))
        #expect(try await store.lastProcessed(OutboxID(client: "a", epoch: 8), conversation: "c") == 0)
        #expect(try await store.deliveries(for: "b", after: 0, limit: 10).map(\.body) == [self.body("hi")])
        #expect(
            try await store.commit(processed: [], deliveries: [.init(recipient: "b", topic: "t", body: self.body("x"))]).map(\.sequence)
                == [3]
        )
        #expect(try await store.forgetOutboxes(notSeenSince: Date() - 3600) == 0, "a migrated outbox counts as seen when migrated")
    }

    @Test("an unusable path is a clear error")
    func badPath() {
        #expect(throws: MessageStoreError.self) { try SQLiteMessageStore(path: "/nonexistent-directory/x/store.sqlite") }
    }
}
