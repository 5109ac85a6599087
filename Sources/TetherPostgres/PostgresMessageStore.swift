public import Foundation
public import Logging
import NIOCore
public import PostgresNIO
public import TetherCore
public import TetherGateway
import TetherNIO

/// A ``MessageStore`` in PostgreSQL, which several gateways (the nodes of a cluster) can share.
///
/// It passes the same contract as the SQLite store (`MessageStoreContract`). A group of writes
/// (``MessageStore/apply(_:)``) is one transaction of a few statements whatever its size:
/// rows go in as arrays (`unnest`), the conversations a group advances are locked
/// (`FOR UPDATE`), and each write's conflict is decided from them, so that one write's
/// conflict leaves the others alone. A write with a ``StoreWrite/fence`` is applied only while
/// its claim is its lane's current one (``MessageStoreError/Code/fenced`` otherwise): what
/// keeps a message processed once when a client moves between nodes (see ``PostgresCluster``).
///
/// ```swift
/// let postgres = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: url))
/// group.addTask { await postgres.run() }
/// let store = try await PostgresMessageStore(client: postgres)
/// let gateway = try Gateway(configuration: .defaults, messageStore: store)
/// ```
public final class PostgresMessageStore: MessageStore {
    public let epoch: UInt64
    let client: PostgresClient
    let logger: Logger
    /// How long one operation may take.
    let operationTimeout: Duration
    /// How many groups of writes may commit at once (``concurrentApplies``).
    let concurrentGroups: Int
    /// The node this store's gateway is, once its ``PostgresCluster`` registered it: deliveries
    /// for recipients connected to other nodes then wake those nodes.
    let node = TetherLock<Int64?>(nil)
    /// The group commit's statements, prepared on each connection at its first group.
    let prepared = PreparedStatements()

    /// Opens the store: migrates the schema and reads (or creates) the store's epoch.
    /// - Parameters:
    ///   - client: A client whose `run()` is running.
    ///   - operationTimeout: How long one operation (a read, a group's transaction) may take
    ///     before it fails with ``MessageStoreError/Code/storage``; see ``withDeadline(_:)``.
    ///   - concurrentGroups: How many groups of writes may commit at once, each a transaction
    ///     on a connection of its own (at most the client's connections are useful).
    ///   - logger: Where the store logs.
    /// - Throws: ``MessageStoreError`` if the database is unreachable or its schema is newer.
    public init(
        client: PostgresClient,
        operationTimeout: Duration = .seconds(10),
        concurrentGroups: Int = 4,
        logger: Logger = Logger(label: "tether.postgres")
    ) async throws {
        self.client = client
        self.logger = logger
        self.operationTimeout = operationTimeout
        self.concurrentGroups = max(1, concurrentGroups)
        do {
            try await PostgresSchema.migrate(client, logger: logger)
            let candidate = Int64(bitPattern: UInt64.random(in: 1...UInt64.max))
            _ = try await client.rows(
                "INSERT INTO tether_meta (key, value) VALUES ('epoch', \(candidate)) ON CONFLICT (key) DO NOTHING",
                logger: logger
            )
            var epoch: Int64 = 0
            for row in try await client.rows("SELECT value FROM tether_meta WHERE key = 'epoch'", logger: logger) {
                epoch = try row.decode(Int64.self)
            }
            self.epoch = UInt64(bitPattern: epoch)
        } catch {
            throw MessageStoreError(code: .storage, message: "cannot prepare the PostgreSQL message store: \(Self.describe(error))")
        }
    }

    /// The configuration of a `PostgresClient` for a `postgres://user:password@host:port/database`
    /// URL (`?sslmode=disable|prefer|require`, `prefer` by default).
    /// - Throws: ``MessageStoreError`` with ``MessageStoreError/Code/invalidArgument`` for a
    ///   URL that is not one.
    public static func clientConfiguration(url: String) throws(MessageStoreError) -> PostgresClient.Configuration {
        try PostgresURL(url).clientConfiguration
    }

    // MARK: Reads

    /// Runs `SELECT 1` (under the operation timeout).
    public func checkReachable() async throws {
        try await self.storage {
            _ = try await self.client.rows("SELECT 1", logger: self.logger)
        }
    }

    public func dedupState(of outbox: OutboxID, conversations: Set<String>, outcomes: [ConversationSequence]) async throws -> DedupState {
        try await self.storage {
            var state = DedupState()
            let epoch = Int64(bitPattern: outbox.epoch)
            if !conversations.isEmpty {
                for conversation in conversations { state.lastProcessed[conversation] = 0 }
                let names = Array(conversations)
                let rows = try await self.client.rows(
                    """
                    SELECT conversation, last_sequence FROM tether_conversations
                    WHERE client = \(outbox.client) AND epoch = \(epoch) AND conversation = ANY(\(names))
                    """,
                    logger: self.logger
                )
                for (conversation, last) in try rows.decode((String, Int64).self) {
                    state.lastProcessed[conversation] = UInt64(bitPattern: last)
                }
            }
            if !outcomes.isEmpty {
                let rows = try await self.client.rows(
                    """
                    SELECT o.conversation, o.sequence, o.status, o.message_id FROM tether_outcomes o
                    JOIN unnest(\(outcomes.map(\.conversation)), \(outcomes.map { Int64(bitPattern: $0.sequence) })) AS w(conversation, sequence)
                    ON o.conversation = w.conversation AND o.sequence = w.sequence
                    WHERE o.client = \(outbox.client) AND o.epoch = \(epoch)
                    """,
                    logger: self.logger
                )
                for (conversation, sequence, status, messageID) in try rows.decode((String, Int64, Int32, Int64?).self) {
                    state.outcomes[ConversationSequence(conversation: conversation, sequence: UInt64(bitPattern: sequence))] =
                        RecordedOutcome(
                            status: StatusCode(rawValue: UInt16(truncatingIfNeeded: status)),
                            messageID: messageID.map { UInt64(bitPattern: $0) }
                        )
                }
            }
            return state
        }
    }

    public func deliveries(for recipient: String, after sequence: UInt64, limit: Int) async throws -> [StoredDelivery] {
        try await self.storage {
            let rows = try await self.client.rows(
                """
                SELECT sequence, topic, body, compressed FROM tether_deliveries
                WHERE recipient = \(recipient) AND sequence > \(Int64(bitPattern: sequence))
                ORDER BY sequence LIMIT \(max(0, limit))
                """,
                logger: self.logger
            )
            var deliveries: [StoredDelivery] = []
            for (sequence, topic, body, compressed) in try rows.decode((Int64, String, ByteBuffer, Bool).self) {
                deliveries.append(StoredDelivery(sequence: UInt64(bitPattern: sequence), topic: topic, body: body, compressed: compressed))
            }
            return deliveries
        }
    }

    public func totalUsage() async throws -> StreamUsage? {
        try await self.storage {
            // The stream rows keep their counts: a row per recipient, not per delivery.
            let rows = try await self.client.rows(
                "SELECT coalesce(sum(waiting), 0)::int8, coalesce(sum(waiting_bytes), 0)::int8 FROM tether_streams",
                logger: self.logger
            )
            var total = StreamUsage(deliveries: 0, bytes: 0)
            for (count, bytes) in try rows.decode((Int64, Int64).self) {
                total = StreamUsage(deliveries: Int(count), bytes: Int(bytes))
            }
            return total
        }
    }

    public func usage(of recipients: [String]) async throws -> [String: StreamUsage] {
        try await self.storage {
            var usage: [String: StreamUsage] = [:]
            for recipient in recipients { usage[recipient] = StreamUsage(deliveries: 0, bytes: 0) }
            guard !recipients.isEmpty else { return usage }
            // The stream row keeps the counts, updated by every append and acknowledgement: no
            // scan of the waiting deliveries.
            let rows = try await self.client.rows(
                "SELECT recipient, waiting, waiting_bytes FROM tether_streams WHERE recipient = ANY(\(recipients))",
                logger: self.logger
            )
            for (recipient, count, bytes) in try rows.decode((String, Int64, Int64).self) {
                usage[recipient] = StreamUsage(deliveries: Int(count), bytes: Int(bytes))
            }
            return usage
        }
    }

    // MARK: Outboxes

    public func touchOutboxes(_ outboxes: [OutboxID], at time: Date) async throws {
        let unique = Array(Set(outboxes))
        guard !unique.isEmpty else { return }
        let seen = Int64(time.timeIntervalSince1970.rounded(.down))
        _ = try await self.storage {
            try await self.client.rows(
                """
                INSERT INTO tether_outboxes (client, epoch, last_seen)
                SELECT client, epoch, \(seen) FROM unnest(\(unique.map(\.client)), \(unique.map { Int64(bitPattern: $0.epoch) })) AS o(client, epoch)
                ON CONFLICT (client, epoch) DO UPDATE SET last_seen = greatest(tether_outboxes.last_seen, excluded.last_seen)
                """,
                logger: self.logger
            )
        }
    }

    public func forgetOutboxes(notSeenSince time: Date) async throws -> Int {
        let before = Int64(time.timeIntervalSince1970.rounded(.down))
        return try await self.storage {
            try await self.client.withTransaction(logger: self.logger) { connection in
                let stale = "SELECT client, epoch FROM tether_outboxes WHERE last_seen < $1"
                var bindings = PostgresBindings()
                bindings.append(before)
                for table in ["tether_conversations", "tether_outcomes"] {
                    try await connection.rows(
                        PostgresQuery(unsafeSQL: "DELETE FROM \(table) WHERE (client, epoch) IN (\(stale))", binds: bindings),
                        logger: self.logger
                    )
                }
                return try await connection.rows(
                    "DELETE FROM tether_outboxes WHERE last_seen < \(before) RETURNING 1",
                    logger: self.logger
                ).count
            }
        }
    }

    // MARK: Writes

    /// Groups of writes may commit concurrently, each in its own transaction on its own
    /// connection: the rows they lock (conversations, lanes, streams) order the ones that
    /// touch the same state, and each reads what the ones before it committed.
    public var concurrentApplies: Int { self.concurrentGroups }

    public func apply(_ writes: [StoreWrite]) async throws -> [Result<[DeliveryReceipt], MessageStoreError>] {
        guard !writes.isEmpty else { return [] }
        let node = self.node.withLockedValue { $0 }
        // A string PostgreSQL cannot hold would fail the whole group's transaction: such a
        // write is refused alone, before the group is sent.
        let refusals = writes.map(Self.unstorable)
        let storable = zip(writes, refusals).filter { $0.1 == nil }.map(\.0)
        var applied: [Result<[DeliveryReceipt], MessageStoreError>] = []
        if !storable.isEmpty {
            applied = try await self.storage {
                try await self.client.withTransaction(logger: self.logger) { connection in
                    try await GroupCommit(writes: storable, node: node, prepared: self.prepared, logger: self.logger).run(on: connection)
                }
            }
        }
        var next = applied.makeIterator()
        return refusals.map { refusal in refusal.map { .failure($0) } ?? next.next()! }
    }

    // MARK: Internals

    /// Why PostgreSQL cannot store `write` (a NUL character in one of its strings, which
    /// `text` cannot hold), or `nil`.
    static func unstorable(_ write: StoreWrite) -> MessageStoreError? {
        func hasNUL(_ string: String) -> Bool { string.utf8.contains(0) }
        let strings =
            write.processed.lazy.flatMap { [$0.outbox.client, $0.conversation] }
            + write.deliveries.lazy.flatMap { [$0.recipient, $0.topic] } + write.acknowledgements.keys
        guard let bad = strings.first(where: hasNUL) else { return nil }
        return MessageStoreError(
            code: .invalidArgument,
            message: "'\(bad.replacingOccurrences(of: "\u{0}", with: "\\0"))' contains a NUL character, which PostgreSQL text cannot hold"
        )
    }

    /// Runs `body` under the operation timeout, turning any failure of PostgreSQL into a
    /// ``MessageStoreError``.
    func storage<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws(MessageStoreError) -> T {
        do {
            return try await self.withDeadline(body)
        } catch {
            throw Self.storageError(error)
        }
    }

    /// `error` as a ``MessageStoreError``: itself if it is one, else a
    /// ``MessageStoreError/Code/storage`` in PostgreSQL's words (see ``describe(_:)``).
    static func storageError(_ error: any Error) -> MessageStoreError {
        error as? MessageStoreError ?? MessageStoreError(code: .storage, message: "PostgreSQL: \(Self.describe(error))")
    }

    /// Runs `body`, or fails with ``MessageStoreError/Code/storage`` once the operation timeout
    /// has passed.
    ///
    /// A query that PostgresNIO has sent does not end when its task is cancelled, and one on a
    /// connection the server dropped mid-way (a restart under load) was seen never to end: the
    /// lane that awaited it stalled, and the gateway could not shut down. So the wait is given
    /// up here instead: `body` runs in a task of its own, which is cancelled and left to end by
    /// itself if it overruns (it holds its pooled connection until then).
    func withDeadline<T: Sendable>(_ body: @escaping @Sendable () async throws -> T) async throws -> T {
        let timeout = self.operationTimeout
        return try await abandonable(
            timeout: timeout,
            timedOut: { MessageStoreError(code: .storage, message: "PostgreSQL did not answer within \(timeout)") },
            body
        )
    }

    /// What went wrong, in words: PostgreSQL's own message where there is one.
    static func describe(_ error: any Error) -> String {
        if let transaction = error as? PostgresTransactionError {
            for inner in [transaction.beginError, transaction.closureError, transaction.commitError].compactMap({ $0 }) {
                return Self.describe(inner)
            }
        }
        if let error = error as? PSQLError {
            if let message = error.serverInfo?[.message] { return message }
            return "\(error.code)"
        }
        // The group commit's prepared statements fail with PostgresNIO's older error type.
        if case .server(let server) = error as? PostgresError, let message = server.fields[.message] { return message }
        if let error = error as? MessageStoreError { return error.message }
        return "\(error)"
    }
}
