import Foundation
import GRDB
import NIOCore

/// An ``OutboxStore`` in a SQLite file in the app's storage: accepted messages survive the app
/// being killed and are sent after it restarts. It is a ``ChannelPositionStore`` too: channel
/// subscriptions keep their positions in the same file.
///
/// The file uses SQLite's write-ahead log with `synchronous = NORMAL`, which survives the
/// process being killed; set `fullSync` to also survive a power loss, at the cost of an fsync
/// per commit (the client commits messages in groups, so the cost is shared).
///
/// ```swift
/// let outbox = try SQLiteOutboxStore(path: documents.appendingPathComponent("tether-outbox.sqlite").path)
/// configuration.reliability = .init(outbox: outbox)
/// ```
public final class SQLiteOutboxStore: OutboxStore, ChannelPositionStore {
    private let writer: any DatabaseWriter
    private let lock: OutboxFileLock?

    /// Opens (or creates) an outbox file.
    ///
    /// Only one store may have a file open at a time: it holds a lock on `PATH.lock` until it is
    /// released (or the process ends), and a second one fails with a clear error.
    /// - Throws: ``OutboxStoreError`` if the file is in use, or cannot be opened or prepared.
    public convenience init(path: String, fullSync: Bool = false) throws {
        let lock = try OutboxFileLock(path: path)
        var configuration = Configuration()
        configuration.prepareDatabase { db in
            try db.execute(sql: fullSync ? "PRAGMA synchronous = FULL" : "PRAGMA synchronous = NORMAL")
        }
        let pool: DatabasePool
        do {
            pool = try DatabasePool(path: path, configuration: configuration)
        } catch {
            throw OutboxStoreError(message: "cannot open the outbox at \(path): \(error)")
        }
        try self.init(writer: pool, lock: lock)
    }

    /// An outbox in a private in-memory SQLite database, for tests of the SQL code.
    public static func inMemory() throws -> SQLiteOutboxStore {
        do {
            return try SQLiteOutboxStore(writer: DatabaseQueue(), lock: nil)
        } catch let error as OutboxStoreError {
            throw error
        } catch {
            throw OutboxStoreError(message: "cannot create an in-memory database: \(error)")
        }
    }

    private init(writer: any DatabaseWriter, lock: OutboxFileLock?) throws {
        self.writer = writer
        self.lock = lock
        do {
            var migrator = DatabaseMigrator()
            migrator.registerMigration("v1") { db in
                try db.execute(
                    sql: """
                        CREATE TABLE meta (key TEXT PRIMARY KEY NOT NULL, value INTEGER NOT NULL) WITHOUT ROWID;
                        CREATE TABLE conversations (conversation TEXT PRIMARY KEY NOT NULL, last_sequence INTEGER NOT NULL) WITHOUT ROWID;
                        CREATE TABLE messages (
                            id INTEGER PRIMARY KEY NOT NULL, topic TEXT NOT NULL, conversation TEXT NOT NULL,
                            sequence INTEGER NOT NULL, priority INTEGER NOT NULL, expires_at INTEGER,
                            expired INTEGER NOT NULL, body BLOB NOT NULL);
                        """
                )
            }
            // v2: how far each channel subscription got (ChannelPositionStore).
            migrator.registerMigration("v2") { db in
                try db.execute(
                    sql: """
                        CREATE TABLE channel_positions (
                            channel TEXT PRIMARY KEY NOT NULL, epoch INTEGER NOT NULL, offset INTEGER NOT NULL) WITHOUT ROWID;
                        """
                )
            }
            try migrator.migrate(writer)
            try writer.write { db in
                try db.execute(
                    sql: "INSERT OR IGNORE INTO meta (key, value) VALUES ('epoch', ?), ('next_id', 1)",
                    arguments: [Int64(bitPattern: UInt64.random(in: 1...UInt64.max))]
                )
            }
        } catch {
            throw OutboxStoreError(message: "cannot prepare the outbox: \(error)")
        }
    }

    public func load() async throws -> OutboxSnapshot {
        try await self.perform(write: false) { db in
            var meta: [String: Int64] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT key, value FROM meta") {
                meta[row["key"]] = row["value"]
            }
            var conversations: [String: UInt64] = [:]
            for row in try Row.fetchAll(db, sql: "SELECT conversation, last_sequence FROM conversations") {
                conversations[row["conversation"]] = UInt64(bitPattern: row["last_sequence"] as Int64)
            }
            let records = try Row.fetchAll(
                db,
                sql: "SELECT id, topic, conversation, sequence, priority, expires_at, expired, body FROM messages ORDER BY id"
            ).map { row in
                let body: Data = row["body"]
                return OutboxRecord(
                    id: UInt64(bitPattern: row["id"] as Int64),
                    topic: row["topic"],
                    conversation: row["conversation"],
                    sequence: UInt64(bitPattern: row["sequence"] as Int64),
                    priority: MessagePriority(rawValue: UInt8(clamping: row["priority"] as Int)) ?? .normal,
                    expiresAt: row["expires_at"],
                    expired: row["expired"] as Bool,
                    body: ByteBuffer(bytes: body)
                )
            }
            var checkpoint: DeliveryCheckpoint?
            if let epoch = meta["checkpoint_epoch"], let sequence = meta["checkpoint_sequence"] {
                checkpoint = DeliveryCheckpoint(epoch: UInt64(bitPattern: epoch), lastSequence: UInt64(bitPattern: sequence))
            }
            return OutboxSnapshot(
                epoch: UInt64(bitPattern: meta["epoch"] ?? 0),
                nextID: UInt64(bitPattern: meta["next_id"] ?? 1),
                conversations: conversations,
                records: records,
                checkpoint: checkpoint
            )
        }
    }

    public func append(_ records: [OutboxRecord], nextID: UInt64, conversations: [String: UInt64]) async throws {
        try await self.perform(write: true) { db in
            let insert = try db.cachedStatement(
                sql: """
                    INSERT INTO messages (id, topic, conversation, sequence, priority, expires_at, expired, body)
                    VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                    """
            )
            for record in records {
                try insert.execute(arguments: [
                    Int64(bitPattern: record.id), record.topic, record.conversation, Int64(bitPattern: record.sequence),
                    Int(record.priority.rawValue), record.expiresAt, record.expired, Data(record.body.readableBytesView),
                ])
            }
            let conversation = try db.cachedStatement(
                sql: """
                    INSERT INTO conversations (conversation, last_sequence) VALUES (?, ?)
                    ON CONFLICT (conversation) DO UPDATE SET last_sequence = max(last_sequence, excluded.last_sequence)
                    """
            )
            for (name, sequence) in conversations {
                try conversation.execute(arguments: [name, Int64(bitPattern: sequence)])
            }
            try db.cachedStatement(sql: "UPDATE meta SET value = max(value, ?) WHERE key = 'next_id'")
                .execute(arguments: [Int64(bitPattern: nextID)])
        }
    }

    public func markExpired(_ ids: [UInt64]) async throws {
        try await self.perform(write: true) { db in
            let update = try db.cachedStatement(sql: "UPDATE messages SET expired = 1, body = x'' WHERE id = ?")
            for id in ids { try update.execute(arguments: [Int64(bitPattern: id)]) }
        }
    }

    public func remove(_ ids: [UInt64]) async throws {
        try await self.perform(write: true) { db in
            let delete = try db.cachedStatement(sql: "DELETE FROM messages WHERE id = ?")
            for id in ids { try delete.execute(arguments: [Int64(bitPattern: id)]) }
        }
    }

    public func saveCheckpoint(_ checkpoint: DeliveryCheckpoint) async throws {
        try await self.perform(write: true) { db in
            try db.execute(
                sql: """
                    INSERT INTO meta (key, value) VALUES ('checkpoint_epoch', ?), ('checkpoint_sequence', ?)
                    ON CONFLICT (key) DO UPDATE SET value = excluded.value
                    """,
                arguments: [Int64(bitPattern: checkpoint.epoch), Int64(bitPattern: checkpoint.lastSequence)]
            )
        }
    }

    // MARK: ChannelPositionStore

    public func channelPosition(of channel: String) async throws -> ChannelPosition? {
        try await self.perform(write: false) { db in
            try Row.fetchOne(db, sql: "SELECT epoch, offset FROM channel_positions WHERE channel = ?", arguments: [channel]).map { row in
                ChannelPosition(epoch: UInt64(bitPattern: row[0] as Int64), offset: UInt64(bitPattern: row[1] as Int64))
            }
        }
    }

    public func saveChannelPositions(_ positions: [String: ChannelPosition]) async throws {
        try await self.perform(write: true) { db in
            let upsert = try db.cachedStatement(
                sql: """
                    INSERT INTO channel_positions (channel, epoch, offset) VALUES (?, ?, ?)
                    ON CONFLICT (channel) DO UPDATE SET epoch = excluded.epoch, offset = excluded.offset
                    """
            )
            for (channel, position) in positions {
                try upsert.execute(arguments: [channel, Int64(bitPattern: position.epoch), Int64(bitPattern: position.offset)])
            }
        }
    }

    private func perform<T: Sendable>(write: Bool, _ body: @escaping @Sendable (Database) throws -> T) async throws -> T {
        do {
            return write ? try await self.writer.write(body) : try await self.writer.read(body)
        } catch {
            throw OutboxStoreError(message: "\(error)")
        }
    }
}
