import Foundation
import GRDB
import NIOCore
import Testing
import TetherGateway
import TetherGatewayTesting

/// The contract of ``MessageStore`` (TetherTesting's `MessageStoreContract`), checked against
/// every implementation; then what only the SQLite store does.
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

    @Test("the store contract", arguments: Kind.allCases, MessageStoreContract.checks)
    func contract(_ kind: Kind, _ check: MessageStoreContract.Check) async throws {
        try await check.run(on: try self.make(kind))
    }

    @Test("the channel history contract", arguments: [Kind.sqliteInMemory, .sqliteFile], ChannelHistoryStoreContract.checks)
    func channelContract(_ kind: Kind, _ check: ChannelHistoryStoreContract.Check) async throws {
        try await check.run(on: try self.make(kind) as! SQLiteMessageStore)
    }

    @Test("fullSync flushes every commit (synchronous = FULL on the writing connection); the default is NORMAL")
    func fullSync() throws {
        // GRDB's pool sets NORMAL when it turns the write-ahead log on: a setting made in
        // prepareDatabase was lost, and with it acknowledged commits on a disk that stopped
        // (the nemesis's read-only disk, seed 18332).
        #expect(try SQLiteMessageStore(path: Self.temporaryPath(), fullSync: true).synchronousSetting() == 2)
        #expect(try SQLiteMessageStore(path: Self.temporaryPath()).synchronousSetting() == 1)
    }

    @Test("a SQLite store keeps channels' streams and publications across a close and reopen")
    func channelPersistence() async throws {
        let path = Self.temporaryPath()
        let positions: [ChannelPosition]
        do {
            let store = try SQLiteMessageStore(path: path)
            positions = try await store.appendPublications(
                (1...3).map { ChannelAppend(channel: "room", publisher: "a", body: self.body("m\($0)"), time: Date(), maxCount: 10) }
            )
        }
        let reopened = try SQLiteMessageStore(path: path)
        let head = try await reopened.head(of: "room", notBefore: Date() - 60)
        #expect(head == ChannelStreamHead(epoch: positions[0].epoch, top: 3, oldest: 1))
        let read = try await reopened.publications(of: "room", epoch: head.epoch, after: 1, limit: 10, notBefore: Date() - 60)
        #expect(read?.map(\.body) == [self.body("m2"), self.body("m3")])
    }

    @Test("reading a channel's head writes nothing: subscribing to a thousand empty channels leaves the file as it was")
    func headsWriteNothing() async throws {
        let path = Self.temporaryPath()
        let store = try SQLiteMessageStore(path: path)
        var epochs: Set<UInt64> = []
        for index in 1...1_000 { epochs.insert(try await store.head(of: "empty.\(index)", notBefore: Date()).epoch) }
        #expect(epochs.count == 1_000)
        let rows = try await DatabaseQueue(path: path).read { try Int.fetchOne($0, sql: "SELECT count(*) FROM channel_streams") }
        #expect(rows == 0)
        let first = try await store.appendPublications([
            ChannelAppend(channel: "empty.7", publisher: "", body: self.body("x"), time: Date(), maxCount: 10)
        ])
        #expect(first == [ChannelPosition(epoch: try await store.head(of: "empty.7", notBefore: Date() - 60).epoch, offset: 1)])
        let other = try SQLiteMessageStore(path: Self.temporaryPath())
        #expect(try await other.head(of: "empty.7", notBefore: Date()).epoch != first[0].epoch, "another store, another epoch")
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
        #expect(try await store.recordedOutcome(outbox, conversation: "c", sequence: 4)?.status == StatusCode(rawValue: 7))
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
