public import Foundation
import GRDB
import NIOCore
public import TetherCore

/// A ``MessageStore`` in a SQLite file: the gateway's default embedded store.
///
/// The file uses SQLite's write-ahead log with `synchronous = NORMAL`: a commit survives the
/// gateway process being killed; after a power loss the last commits may be lost (set
/// `fullSync` to survive that too, at the cost of an fsync per commit).
///
/// ```swift
/// let store = try SQLiteMessageStore(path: "/var/lib/tether/messages.sqlite")
/// let gateway = try Gateway(configuration: .defaults, messageStore: store)
/// ```
public final class SQLiteMessageStore: MessageStore {
    public let epoch: UInt64
    private let writer: any DatabaseWriter

    /// Opens (or creates) a store file.
    /// - Parameters:
    ///   - path: The SQLite file.
    ///   - fullSync: Whether every commit is flushed to disk (`synchronous = FULL`).
    /// - Throws: ``MessageStoreError`` if the file cannot be opened or migrated.
    public convenience init(path: String, fullSync: Bool = false) throws {
        let pool: DatabasePool
        do {
            pool = try DatabasePool(path: path, configuration: Configuration())
            // On the connection that writes, once the pool is open: GRDB sets `synchronous =
            // NORMAL` when it turns the write-ahead log on, after `prepareDatabase` has run, so a
            // setting made there does not last. (It did not: `fullSync` was lost that way until
            // the nemesis's read-only disk lost acknowledged commits with it set.)
            try pool.writeWithoutTransaction { db in
                try db.execute(sql: fullSync ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL")
            }
        } catch {
            throw MessageStoreError(code: .storage, message: "cannot open the message store at \(path): \(error)")
        }
        try self.init(writer: pool)
    }

    /// The writing connection's `synchronous` setting (1: NORMAL, 2: FULL), for tests.
    package func synchronousSetting() throws -> Int {
        try self.writer.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") ?? -1 }
    }

    /// A store in a private in-memory SQLite database, for tests of the SQL code.
    public static func inMemory() throws -> SQLiteMessageStore {
        do {
            return try SQLiteMessageStore(writer: DatabaseQueue())
        } catch let error as MessageStoreError {
            throw error
        } catch {
            throw MessageStoreError(code: .storage, message: "cannot create an in-memory database: \(error)")
        }
    }

    private init(writer: any DatabaseWriter) throws {
        self.writer = writer
        do {
            try Self.migrator.migrate(writer)
            self.epoch = try writer.write { db in
                try db.execute(
                    sql: "INSERT OR IGNORE INTO meta (key, value) VALUES ('epoch', ?)",
                    arguments: [Int64(bitPattern: UInt64.random(in: 1...UInt64.max))]
                )
                let value = try Int64.fetchOne(db, sql: "SELECT value FROM meta WHERE key = 'epoch'") ?? 0
                return UInt64(bitPattern: value)
            }
        } catch {
            throw MessageStoreError(code: .storage, message: "cannot prepare the message store: \(error)")
        }
    }

    private static var migrator: DatabaseMigrator {
        var migrator = DatabaseMigrator()
        migrator.registerMigration("v1") { db in
            try db.execute(
                sql: """
                    CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
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
                    """
            )
        }
        // Conversation state per outbox (client id and outbox epoch), not per client id: the
        // outboxes of several devices of one client number their conversations independently.
        // A v1 store kept one outbox per client; its conversations belong to that outbox.
        migrator.registerMigration("v2: conversations per outbox") { db in
            try db.execute(
                sql: """
                    CREATE TABLE outboxes_v2 (
                        client TEXT NOT NULL, epoch INTEGER NOT NULL, last_seen INTEGER NOT NULL,
                        PRIMARY KEY (client, epoch)) WITHOUT ROWID;
                    INSERT INTO outboxes_v2 (client, epoch, last_seen) SELECT client, epoch, ? FROM outboxes;
                    CREATE TABLE conversations_v2 (
                        client TEXT NOT NULL, epoch INTEGER NOT NULL, conversation TEXT NOT NULL, last_sequence INTEGER NOT NULL,
                        PRIMARY KEY (client, epoch, conversation)) WITHOUT ROWID;
                    INSERT INTO conversations_v2 (client, epoch, conversation, last_sequence)
                        SELECT c.client, o.epoch, c.conversation, c.last_sequence FROM conversations c JOIN outboxes o USING (client);
                    CREATE TABLE refusals_v2 (
                        client TEXT NOT NULL, epoch INTEGER NOT NULL, conversation TEXT NOT NULL, sequence INTEGER NOT NULL,
                        status INTEGER NOT NULL,
                        PRIMARY KEY (client, epoch, conversation, sequence)) WITHOUT ROWID;
                    INSERT INTO refusals_v2 (client, epoch, conversation, sequence, status)
                        SELECT r.client, o.epoch, r.conversation, r.sequence, r.status FROM refusals r JOIN outboxes o USING (client);
                    DROP TABLE outboxes;
                    DROP TABLE conversations;
                    DROP TABLE refusals;
                    ALTER TABLE outboxes_v2 RENAME TO outboxes;
                    ALTER TABLE conversations_v2 RENAME TO conversations;
                    ALTER TABLE refusals_v2 RENAME TO refusals;
                    CREATE INDEX outboxes_last_seen ON outboxes (last_seen);
                    """,
                arguments: [Int64(Date().timeIntervalSince1970)]
            )
        }
        // Every processed message's outcome and id, not only the refusals: a retransmission
        // (same id) is told from a conflicting duplicate (another id, same sequence).
        migrator.registerMigration("v3: outcomes with message ids") { db in
            try db.execute(
                sql: """
                    ALTER TABLE refusals RENAME TO outcomes;
                    ALTER TABLE outcomes ADD COLUMN message_id INTEGER;
                    """
            )
        }
        // Payloads worth it are stored compressed (raw DEFLATE), and sent so.
        migrator.registerMigration("v4: compressed deliveries") { db in
            try db.execute(sql: "ALTER TABLE deliveries ADD COLUMN compressed INTEGER NOT NULL DEFAULT 0")
        }
        // Channels' history (``ChannelHistoryStore``): a stream per channel, its publications
        // by offset, their time (milliseconds since 1970) for the retention by age.
        migrator.registerMigration("v5: channel history") { db in
            try db.execute(
                sql: """
                    CREATE TABLE channel_streams (
                        channel TEXT PRIMARY KEY NOT NULL, epoch INTEGER NOT NULL, top INTEGER NOT NULL) WITHOUT ROWID;
                    CREATE TABLE channel_publications (
                        channel TEXT NOT NULL, position INTEGER NOT NULL, time INTEGER NOT NULL, publisher TEXT NOT NULL,
                        body BLOB NOT NULL,
                        PRIMARY KEY (channel, position)) WITHOUT ROWID;
                    CREATE INDEX channel_publications_time ON channel_publications (time);
                    """
            )
        }
        return migrator
    }

    public func touchOutboxes(_ outboxes: [OutboxID], at time: Date) async throws {
        guard !outboxes.isEmpty else { return }
        let seen = Self.seconds(time)
        try await self.write { db in
            let statement = try db.cachedStatement(
                sql: """
                    INSERT INTO outboxes (client, epoch, last_seen) VALUES (?, ?, ?)
                    ON CONFLICT (client, epoch) DO UPDATE SET last_seen = max(last_seen, excluded.last_seen)
                    """
            )
            for outbox in outboxes {
                try statement.execute(arguments: [outbox.client, Int64(bitPattern: outbox.epoch), seen])
            }
        }
    }

    public func forgetOutboxes(notSeenSince time: Date) async throws -> Int {
        let before = Self.seconds(time)
        return try await self.write { db in
            let stale = "SELECT client, epoch FROM outboxes WHERE last_seen < ?"
            try db.execute(sql: "DELETE FROM conversations WHERE (client, epoch) IN (\(stale))", arguments: [before])
            try db.execute(sql: "DELETE FROM outcomes WHERE (client, epoch) IN (\(stale))", arguments: [before])
            try db.execute(sql: "DELETE FROM outboxes WHERE last_seen < ?", arguments: [before])
            return db.changesCount
        }
    }

    public func dedupState(of outbox: OutboxID, conversations: Set<String>, outcomes: [ConversationSequence]) async throws -> DedupState {
        try await self.read { db in
            var state = DedupState()
            for conversation in conversations {
                state.lastProcessed[conversation] = try Self.lastProcessed(db, outbox: outbox, conversation: conversation)
            }
            let statement = try db.cachedStatement(
                sql: "SELECT status, message_id FROM outcomes WHERE client = ? AND epoch = ? AND conversation = ? AND sequence = ?"
            )
            for position in outcomes {
                let row = try Row.fetchOne(
                    statement,
                    arguments: [
                        outbox.client, Int64(bitPattern: outbox.epoch), position.conversation, Int64(bitPattern: position.sequence),
                    ]
                )
                guard let row else { continue }
                state.outcomes[position] = RecordedOutcome(
                    status: StatusCode(rawValue: UInt16(truncatingIfNeeded: row["status"] as Int)),
                    messageID: (row["message_id"] as Int64?).map { UInt64(bitPattern: $0) }
                )
            }
            return state
        }
    }

    public func apply(_ writes: [StoreWrite]) async throws -> [Result<[DeliveryReceipt], MessageStoreError>] {
        try await self.write { db in
            try writes.map { write in
                do {
                    var receipts: [DeliveryReceipt] = []
                    // Each write in a savepoint of its own: a conflict rolls back that write alone.
                    try db.inSavepoint {
                        receipts = try Self.apply(write, db)
                        return .commit
                    }
                    return .success(receipts)
                } catch let error as MessageStoreError where error.code == .conflict {
                    return .failure(error)
                }
            }
        }
    }

    private static func apply(_ write: StoreWrite, _ db: Database) throws -> [DeliveryReceipt] {
        var last: [ConversationKey: UInt64] = [:]
        for message in write.processed {
            let key = ConversationKey(outbox: message.outbox, conversation: message.conversation)
            let current = try last[key] ?? Self.lastProcessed(db, outbox: message.outbox, conversation: message.conversation)
            guard message.sequence == current + 1 else {
                throw MessageStoreError(
                    code: .conflict,
                    message: "message \(message.sequence) of '\(message.conversation)' does not follow \(current)"
                )
            }
            last[key] = message.sequence
            try db.cachedStatement(
                sql: "INSERT INTO outcomes (client, epoch, conversation, sequence, status, message_id) VALUES (?, ?, ?, ?, ?, ?)"
            )
            .execute(arguments: [
                message.outbox.client, Int64(bitPattern: message.outbox.epoch), message.conversation,
                Int64(bitPattern: message.sequence), Int(message.status.rawValue),
                message.messageID.map { Int64(bitPattern: $0) },
            ])
        }
        for (key, sequence) in last {
            try db.cachedStatement(
                sql: """
                    INSERT INTO conversations (client, epoch, conversation, last_sequence) VALUES (?, ?, ?, ?)
                    ON CONFLICT (client, epoch, conversation) DO UPDATE SET last_sequence = excluded.last_sequence
                    """
            ).execute(arguments: [
                key.outbox.client, Int64(bitPattern: key.outbox.epoch), key.conversation, Int64(bitPattern: sequence),
            ])
            if sequence > messageStoreOutcomeWindow {
                try db.cachedStatement(
                    sql: "DELETE FROM outcomes WHERE client = ? AND epoch = ? AND conversation = ? AND sequence <= ?"
                )
                .execute(arguments: [
                    key.outbox.client, Int64(bitPattern: key.outbox.epoch), key.conversation,
                    Int64(bitPattern: sequence - messageStoreOutcomeWindow),
                ])
            }
        }
        let receipts = try Self.append(write.deliveries, db)
        for (recipient, sequence) in write.acknowledgements {
            try db.cachedStatement(sql: "DELETE FROM deliveries WHERE recipient = ? AND sequence <= ?")
                .execute(arguments: [recipient, Int64(bitPattern: sequence)])
        }
        return receipts
    }

    public func deliveries(for recipient: String, after sequence: UInt64, limit: Int) async throws -> [StoredDelivery] {
        try await self.read { db in
            try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT sequence, topic, body, compressed FROM deliveries
                        WHERE recipient = ? AND sequence > ? ORDER BY sequence LIMIT ?
                        """
                ),
                arguments: [recipient, Int64(bitPattern: sequence), max(0, limit)]
            ).map { row in
                let body: Data = row["body"]
                return StoredDelivery(
                    sequence: UInt64(bitPattern: row["sequence"] as Int64),
                    topic: row["topic"],
                    body: ByteBuffer(bytes: body),
                    compressed: row["compressed"]
                )
            }
        }
    }

    public func totalUsage() async throws -> StreamUsage? {
        try await self.read { db in
            let row = try Row.fetchOne(db, sql: "SELECT count(*) AS n, coalesce(sum(length(body)), 0) AS bytes FROM deliveries")
            return StreamUsage(deliveries: row?["n"] ?? 0, bytes: row?["bytes"] ?? 0)
        }
    }

    public func usage(of recipients: [String]) async throws -> [String: StreamUsage] {
        try await self.read { db in
            let statement = try db.cachedStatement(
                sql: "SELECT count(*) AS n, coalesce(sum(length(body)), 0) AS bytes FROM deliveries WHERE recipient = ?"
            )
            var usage: [String: StreamUsage] = [:]
            for recipient in recipients {
                let row = try Row.fetchOne(statement, arguments: [recipient])
                usage[recipient] = StreamUsage(deliveries: row?["n"] ?? 0, bytes: row?["bytes"] ?? 0)
            }
            return usage
        }
    }

    // MARK: Internals

    private struct ConversationKey: Hashable {
        var outbox: OutboxID
        var conversation: String
    }

    /// A time as whole seconds since 1970, as the outboxes table keeps it.
    private static func seconds(_ time: Date) -> Int64 { Int64(time.timeIntervalSince1970.rounded(.down)) }

    private static func lastProcessed(_ db: Database, outbox: OutboxID, conversation: String) throws -> UInt64 {
        let value = try Int64.fetchOne(
            db.cachedStatement(sql: "SELECT last_sequence FROM conversations WHERE client = ? AND epoch = ? AND conversation = ?"),
            arguments: [outbox.client, Int64(bitPattern: outbox.epoch), conversation]
        )
        return value.map { UInt64(bitPattern: $0) } ?? 0
    }

    private static func append(_ deliveries: [NewDelivery], _ db: Database) throws -> [DeliveryReceipt] {
        var next: [String: UInt64] = [:]
        var receipts: [DeliveryReceipt] = []
        receipts.reserveCapacity(deliveries.count)
        for delivery in deliveries {
            let sequence: UInt64
            if let known = next[delivery.recipient] {
                sequence = known
            } else {
                let stored = try Int64.fetchOne(
                    db.cachedStatement(sql: "SELECT next_sequence FROM streams WHERE recipient = ?"),
                    arguments: [delivery.recipient]
                )
                sequence = stored.map { UInt64(bitPattern: $0) } ?? 1
            }
            try db.cachedStatement(sql: "INSERT INTO deliveries (recipient, sequence, topic, body, compressed) VALUES (?, ?, ?, ?, ?)")
                .execute(arguments: [
                    delivery.recipient, Int64(bitPattern: sequence), delivery.topic, Data(delivery.body.readableBytesView),
                    delivery.compressed,
                ])
            next[delivery.recipient] = sequence + 1
            receipts.append(DeliveryReceipt(recipient: delivery.recipient, sequence: sequence))
        }
        for (recipient, sequence) in next {
            try db.cachedStatement(
                sql: """
                    INSERT INTO streams (recipient, next_sequence) VALUES (?, ?)
                    ON CONFLICT (recipient) DO UPDATE SET next_sequence = excluded.next_sequence
                    """
            ).execute(arguments: [recipient, Int64(bitPattern: sequence)])
        }
        return receipts
    }

    func write<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        do {
            return try await self.writer.write(body)
        } catch let error as MessageStoreError {
            throw error
        } catch {
            throw MessageStoreError(code: .storage, message: "\(error)")
        }
    }

    func read<T: Sendable>(_ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        do {
            return try await self.writer.read(body)
        } catch let error as MessageStoreError {
            throw error
        } catch {
            throw MessageStoreError(code: .storage, message: "\(error)")
        }
    }
}
