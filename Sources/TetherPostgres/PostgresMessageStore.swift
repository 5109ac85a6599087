public import Foundation
public import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOSSL
public import PostgresNIO
public import TetherCore
public import TetherGateway

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
    /// The node this store's gateway is, once its ``PostgresCluster`` registered it: deliveries
    /// for recipients connected to other nodes then wake those nodes.
    let node = NIOLockedValueBox<Int64?>(nil)

    /// Opens the store: migrates the schema and reads (or creates) the store's epoch.
    /// - Parameters:
    ///   - client: A client whose `run()` is running.
    ///   - logger: Where the store logs.
    /// - Throws: ``MessageStoreError`` if the database is unreachable or its schema is newer.
    ///   - operationTimeout: How long one operation (a read, a group's transaction) may take
    ///     before it fails with ``MessageStoreError/Code/storage``; see ``withDeadline(_:)``.
    public init(
        client: PostgresClient,
        operationTimeout: Duration = .seconds(10),
        logger: Logger = Logger(label: "tether.postgres")
    ) async throws {
        self.client = client
        self.logger = logger
        self.operationTimeout = operationTimeout
        do {
            try await PostgresSchema.migrate(client, logger: logger)
            let candidate = Int64(bitPattern: UInt64.random(in: 1...UInt64.max))
            try await client.query(
                "INSERT INTO tether_meta (key, value) VALUES ('epoch', \(candidate)) ON CONFLICT (key) DO NOTHING",
                logger: logger
            )
            var epoch: Int64 = 0
            for try await value in try await client.query("SELECT value FROM tether_meta WHERE key = 'epoch'", logger: logger)
                .decode(Int64.self)
            {
                epoch = value
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

    public func dedupState(of outbox: OutboxID, conversations: Set<String>, outcomes: [ConversationSequence]) async throws -> DedupState {
        try await self.storage {
            var state = DedupState()
            let epoch = Int64(bitPattern: outbox.epoch)
            if !conversations.isEmpty {
                for conversation in conversations { state.lastProcessed[conversation] = 0 }
                let names = Array(conversations)
                let rows = try await self.client.query(
                    """
                    SELECT conversation, last_sequence FROM tether_conversations
                    WHERE client = \(outbox.client) AND epoch = \(epoch) AND conversation = ANY(\(names))
                    """,
                    logger: self.logger
                )
                for try await (conversation, last) in rows.decode((String, Int64).self) {
                    state.lastProcessed[conversation] = UInt64(bitPattern: last)
                }
            }
            if !outcomes.isEmpty {
                let rows = try await self.client.query(
                    """
                    SELECT o.conversation, o.sequence, o.status, o.message_id FROM tether_outcomes o
                    JOIN unnest(\(outcomes.map(\.conversation)), \(outcomes.map { Int64(bitPattern: $0.sequence) })) AS w(conversation, sequence)
                    ON o.conversation = w.conversation AND o.sequence = w.sequence
                    WHERE o.client = \(outbox.client) AND o.epoch = \(epoch)
                    """,
                    logger: self.logger
                )
                for try await (conversation, sequence, status, messageID) in rows.decode((String, Int64, Int32, Int64?).self) {
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
            let rows = try await self.client.query(
                """
                SELECT sequence, topic, body FROM tether_deliveries
                WHERE recipient = \(recipient) AND sequence > \(Int64(bitPattern: sequence))
                ORDER BY sequence LIMIT \(max(0, limit))
                """,
                logger: self.logger
            )
            var deliveries: [StoredDelivery] = []
            for try await (sequence, topic, body) in rows.decode((Int64, String, ByteBuffer).self) {
                deliveries.append(StoredDelivery(sequence: UInt64(bitPattern: sequence), topic: topic, body: body))
            }
            return deliveries
        }
    }

    public func usage(of recipients: [String]) async throws -> [String: StreamUsage] {
        try await self.storage {
            var usage: [String: StreamUsage] = [:]
            for recipient in recipients { usage[recipient] = StreamUsage(deliveries: 0, bytes: 0) }
            guard !recipients.isEmpty else { return usage }
            // The stream row keeps the counts, updated by every append and acknowledgement: no
            // scan of the waiting deliveries.
            let rows = try await self.client.query(
                "SELECT recipient, waiting, waiting_bytes FROM tether_streams WHERE recipient = ANY(\(recipients))",
                logger: self.logger
            )
            for try await (recipient, count, bytes) in rows.decode((String, Int64, Int64).self) {
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
        try await self.storage {
            try await self.client.query(
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
                    try await connection.query(
                        PostgresQuery(unsafeSQL: "DELETE FROM \(table) WHERE (client, epoch) IN (\(stale))", binds: bindings),
                        logger: self.logger
                    )
                }
                var forgotten = 0
                for try await _ in try await connection.query(
                    "DELETE FROM tether_outboxes WHERE last_seen < \(before) RETURNING 1",
                    logger: self.logger
                ) {
                    forgotten += 1
                }
                return forgotten
            }
        }
    }

    // MARK: Writes

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
                    try await GroupCommit(writes: storable, node: node, logger: self.logger).run(on: connection)
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
        } catch let error as MessageStoreError {
            throw error
        } catch {
            throw MessageStoreError(code: .storage, message: "PostgreSQL: \(Self.describe(error))")
        }
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
        let settle = NIOLockedValueBox<CheckedContinuation<T, any Error>?>(nil)
        let tasks = NIOLockedValueBox<(work: Task<Void, Never>?, timer: Task<Void, Never>?)>((nil, nil))
        return try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
                settle.withLockedValue { $0 = continuation }
                let work = Task {
                    let result = await Result { try await body() }
                    guard let continuation = settle.withLockedValue({ $0.take() }) else { return }
                    tasks.withLockedValue { $0.timer }?.cancel()
                    continuation.resume(with: result)
                }
                let timer = Task {
                    guard (try? await Task.sleep(for: timeout)) != nil, let continuation = settle.withLockedValue({ $0.take() }) else {
                        return
                    }
                    tasks.withLockedValue { $0.work }?.cancel()
                    continuation.resume(
                        throwing: MessageStoreError(code: .storage, message: "PostgreSQL did not answer within \(timeout)")
                    )
                }
                tasks.withLockedValue { $0 = (work, timer) }
            }
        } onCancel: {
            let (work, timer) = tasks.withLockedValue { $0 }
            work?.cancel()
            timer?.cancel()
            settle.withLockedValue { $0.take() }?.resume(throwing: CancellationError())
        }
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
        if let error = error as? MessageStoreError { return error.message }
        return "\(error)"
    }
}

/// One group of writes applied in one transaction: the conversations and lanes they touch are
/// read and locked, each write's conflict is decided in order, then what was accepted is
/// written with one statement per table.
struct GroupCommit {
    let writes: [StoreWrite]
    let node: Int64?
    let logger: Logger

    private struct ConversationKey: Hashable {
        var client: String
        var epoch: Int64
        var conversation: String
    }

    private struct OutboxKey: Hashable {
        var client: String
        var epoch: Int64
    }

    func run(on connection: PostgresConnection) async throws -> [Result<[DeliveryReceipt], MessageStoreError>] {
        // 1. The state the writes depend on, locked until the transaction ends.
        var conversationKeys: Set<ConversationKey> = []
        var fencedOutboxes: Set<OutboxKey> = []
        for write in self.writes {
            for message in write.processed {
                conversationKeys.insert(
                    ConversationKey(
                        client: message.outbox.client,
                        epoch: Int64(bitPattern: message.outbox.epoch),
                        conversation: message.conversation
                    )
                )
            }
            if let fence = write.fence, !write.processed.isEmpty {
                fencedOutboxes.insert(OutboxKey(client: fence.outbox.client, epoch: Int64(bitPattern: fence.outbox.epoch)))
            }
        }
        var last: [ConversationKey: UInt64] = [:]
        var existing: Set<ConversationKey> = []
        if !conversationKeys.isEmpty {
            let keys = Array(conversationKeys)
            let rows = try await connection.query(
                """
                SELECT c.client, c.epoch, c.conversation, c.last_sequence FROM tether_conversations c
                JOIN unnest(\(keys.map(\.client)), \(keys.map(\.epoch)), \(keys.map(\.conversation))) AS k(client, epoch, conversation)
                ON c.client = k.client AND c.epoch = k.epoch AND c.conversation = k.conversation
                ORDER BY c.client, c.epoch, c.conversation
                FOR UPDATE OF c
                """,
                logger: self.logger
            )
            for try await (client, epoch, conversation, sequence) in rows.decode((String, Int64, String, Int64).self) {
                let key = ConversationKey(client: client, epoch: epoch, conversation: conversation)
                last[key] = UInt64(bitPattern: sequence)
                existing.insert(key)
            }
        }
        var fences: [OutboxKey: UInt64] = [:]
        if !fencedOutboxes.isEmpty {
            let keys = Array(fencedOutboxes)
            let rows = try await connection.query(
                """
                SELECT l.client, l.epoch, l.fence FROM tether_lanes l
                JOIN unnest(\(keys.map(\.client)), \(keys.map(\.epoch))) AS k(client, epoch)
                ON l.client = k.client AND l.epoch = k.epoch
                FOR SHARE OF l
                """,
                logger: self.logger
            )
            for try await (client, epoch, fence) in rows.decode((String, Int64, Int64).self) {
                fences[OutboxKey(client: client, epoch: epoch)] = UInt64(bitPattern: fence)
            }
        }

        // 2. Each write in order: applied on top of the ones before, or left out alone.
        var results: [Result<[DeliveryReceipt], MessageStoreError>?] = Array(repeating: nil, count: self.writes.count)
        var outcomes: [ProcessedMessage] = []
        var deliveries: [(write: Int, delivery: NewDelivery)] = []
        var acknowledgements: [String: UInt64] = [:]
        var advanced: Set<ConversationKey> = []
        for (index, write) in self.writes.enumerated() {
            if let fence = write.fence, !write.processed.isEmpty {
                let current = fences[OutboxKey(client: fence.outbox.client, epoch: Int64(bitPattern: fence.outbox.epoch))]
                guard current == fence.token else {
                    results[index] = .failure(
                        MessageStoreError(
                            code: .fenced,
                            message: "the lane of \(fence.outbox) was claimed again (fence \(current.map(String.init) ?? "none"), "
                                + "this write's \(fence.token)): another gateway processes its messages now"
                        )
                    )
                    continue
                }
            }
            var proposed = last
            var conflict: MessageStoreError?
            for message in write.processed {
                let key = ConversationKey(
                    client: message.outbox.client,
                    epoch: Int64(bitPattern: message.outbox.epoch),
                    conversation: message.conversation
                )
                let current = proposed[key] ?? 0
                guard message.sequence == current + 1 else {
                    conflict = MessageStoreError(
                        code: .conflict,
                        message: "message \(message.sequence) of '\(message.conversation)' does not follow \(current)"
                    )
                    break
                }
                proposed[key] = message.sequence
            }
            if let conflict {
                results[index] = .failure(conflict)
                continue
            }
            last = proposed
            for message in write.processed {
                advanced.insert(
                    ConversationKey(
                        client: message.outbox.client,
                        epoch: Int64(bitPattern: message.outbox.epoch),
                        conversation: message.conversation
                    )
                )
            }
            outcomes += write.processed
            deliveries += write.deliveries.map { (index, $0) }
            for (recipient, sequence) in write.acknowledgements {
                acknowledgements[recipient] = max(acknowledgements[recipient] ?? 0, sequence)
            }
        }

        // 3. What was accepted, one statement per kind.
        if !outcomes.isEmpty {
            try await self.record(outcomes, advanced: advanced, last: last, existing: existing, on: connection)
        }
        var receipts: [[DeliveryReceipt]] = Array(repeating: [], count: self.writes.count)
        if !deliveries.isEmpty {
            let firsts = try await self.append(deliveries.map(\.delivery), on: connection)
            var next = firsts
            for (write, delivery) in deliveries {
                let sequence = next[delivery.recipient]!
                next[delivery.recipient] = sequence + 1
                receipts[write].append(DeliveryReceipt(recipient: delivery.recipient, sequence: sequence))
            }
            if let node {
                try await self.wake(recipients: Array(firsts.keys), from: node, on: connection)
            }
        }
        if !acknowledgements.isEmpty {
            let recipients = Array(acknowledgements.keys)
            try await connection.query(
                """
                WITH d AS (
                    DELETE FROM tether_deliveries d
                    USING unnest(\(recipients), \(recipients.map { Int64(bitPattern: acknowledgements[$0]!) })) AS a(recipient, up_to)
                    WHERE d.recipient = a.recipient AND d.sequence <= a.up_to
                    RETURNING d.recipient, length(d.body) AS bytes
                )
                UPDATE tether_streams s SET waiting = s.waiting - x.n, waiting_bytes = s.waiting_bytes - x.bytes
                FROM (SELECT recipient, count(*) AS n, sum(bytes) AS bytes FROM d GROUP BY recipient) AS x
                WHERE s.recipient = x.recipient
                """,
                logger: self.logger
            )
        }
        return results.enumerated().map { index, result in result ?? .success(receipts[index]) }
    }

    /// Records outcomes, advances their conversations, and forgets outcomes past the window.
    private func record(
        _ outcomes: [ProcessedMessage],
        advanced: Set<ConversationKey>,
        last: [ConversationKey: UInt64],
        existing: Set<ConversationKey>,
        on connection: PostgresConnection
    ) async throws {
        let advancedKeys = Array(advanced)
        let isNew = advancedKeys.map { !existing.contains($0) }
        let trimmed = advancedKeys.map { key -> Int64 in
            let sequence = last[key] ?? 0
            return sequence > messageStoreOutcomeWindow ? Int64(bitPattern: sequence - messageStoreOutcomeWindow) : 0
        }
        // New conversations are inserted (a concurrent insert of the same one fails the whole
        // transaction: safe); existing ones, locked above, are updated.
        try await connection.query(
            """
            WITH o AS (
                INSERT INTO tether_outcomes (client, epoch, conversation, sequence, status, message_id)
                SELECT client, epoch, conversation, sequence, status, CASE WHEN has_id THEN message_id END
                FROM unnest(\(outcomes.map(\.outbox.client)), \(outcomes.map { Int64(bitPattern: $0.outbox.epoch) }),
                    \(outcomes.map(\.conversation)), \(outcomes.map { Int64(bitPattern: $0.sequence) }),
                    \(outcomes.map { Int32($0.status.rawValue) }), \(outcomes.map { Int64(bitPattern: $0.messageID ?? 0) }),
                    \(outcomes.map { $0.messageID != nil }))
                    AS v(client, epoch, conversation, sequence, status, message_id, has_id)
            ),
            k AS (
                SELECT * FROM unnest(\(advancedKeys.map(\.client)), \(advancedKeys.map(\.epoch)), \(advancedKeys.map(\.conversation)),
                    \(advancedKeys.map { Int64(bitPattern: last[$0] ?? 0) }), \(isNew), \(trimmed))
                    AS k(client, epoch, conversation, last_sequence, is_new, trimmed)
            ),
            i AS (
                INSERT INTO tether_conversations (client, epoch, conversation, last_sequence)
                SELECT client, epoch, conversation, last_sequence FROM k WHERE is_new
            ),
            u AS (
                UPDATE tether_conversations c SET last_sequence = k.last_sequence FROM k
                WHERE NOT k.is_new AND c.client = k.client AND c.epoch = k.epoch AND c.conversation = k.conversation
            )
            DELETE FROM tether_outcomes t USING k
            WHERE k.trimmed > 0 AND t.client = k.client AND t.epoch = k.epoch AND t.conversation = k.conversation
                AND t.sequence <= k.trimmed
            """,
            logger: self.logger
        )
    }

    /// Appends deliveries to their recipients' streams.
    /// - Returns: The first sequence given to each recipient's deliveries (the rest follow in order).
    private func append(_ deliveries: [NewDelivery], on connection: PostgresConnection) async throws -> [String: UInt64] {
        var ordinal: [String: Int64] = [:]
        let ordinals = deliveries.map { delivery -> Int64 in
            let next = (ordinal[delivery.recipient] ?? 0) + 1
            ordinal[delivery.recipient] = next
            return next
        }
        let rows = try await connection.query(
            """
            WITH d AS (
                SELECT * FROM unnest(\(deliveries.map(\.recipient)), \(ordinals), \(deliveries.map(\.topic)), \(deliveries.map(\.body)))
                    AS d(recipient, k, topic, body)
            ),
            counts AS (SELECT recipient, count(*)::bigint AS n, sum(length(body))::bigint AS bytes FROM d GROUP BY recipient),
            s AS (
                INSERT INTO tether_streams AS s (recipient, next_sequence, waiting, waiting_bytes)
                SELECT recipient, n + 1, n, bytes FROM counts ORDER BY recipient
                ON CONFLICT (recipient) DO UPDATE SET next_sequence = s.next_sequence + excluded.next_sequence - 1,
                    waiting = s.waiting + excluded.waiting, waiting_bytes = s.waiting_bytes + excluded.waiting_bytes
                RETURNING s.recipient, s.next_sequence
            ),
            firsts AS (SELECT s.recipient, s.next_sequence - counts.n AS first FROM s JOIN counts USING (recipient)),
            i AS (
                INSERT INTO tether_deliveries (recipient, sequence, topic, body)
                SELECT d.recipient, firsts.first + d.k - 1, d.topic, d.body FROM d JOIN firsts USING (recipient)
            )
            SELECT recipient, first FROM firsts
            """,
            logger: self.logger
        )
        var firsts: [String: UInt64] = [:]
        for try await (recipient, first) in rows.decode((String, Int64).self) {
            firsts[recipient] = UInt64(bitPattern: first)
        }
        guard firsts.count == ordinal.count else {
            throw PostgresStoreError("appending deliveries numbered \(firsts.count) of \(ordinal.count) recipients")
        }
        return firsts
    }

    /// Signals the other nodes where `recipients` are connected that their streams grew, and
    /// notifies each of those nodes once (on commit).
    private func wake(recipients: [String], from node: Int64, on connection: PostgresConnection) async throws {
        try await connection.query(
            """
            WITH w AS (
                INSERT INTO tether_signals (node, kind, key)
                SELECT p.node, \(ClusterSignal.Kind.deliveries.rawValue), p.client FROM tether_presence p
                WHERE p.client = ANY(\(recipients)) AND p.node <> \(node)
                RETURNING node
            )
            SELECT pg_notify('tether_node_' || n.node, '') FROM (SELECT DISTINCT node FROM w) AS n
            """,
            logger: self.logger
        )
    }
}

/// A `postgres://user[:password]@host[:port]/database[?sslmode=…]` URL, taken apart.
struct PostgresURL {
    var host: String
    var port: Int
    var username: String
    var password: String?
    var database: String?
    /// `disable`, `prefer` or `require`.
    var tls: String

    init(_ url: String) throws(MessageStoreError) {
        guard let components = URLComponents(string: url), ["postgres", "postgresql"].contains(components.scheme ?? ""),
            let host = components.host, !host.isEmpty
        else {
            throw MessageStoreError(
                code: .invalidArgument,
                message: "'\(url)' is not a PostgreSQL URL (postgres://user[:password]@host[:port]/database)"
            )
        }
        let database = components.path.hasPrefix("/") ? String(components.path.dropFirst()) : components.path
        let mode = components.queryItems?.first { $0.name == "sslmode" }?.value ?? "prefer"
        switch mode {
        case "disable": self.tls = "disable"
        case "prefer", "allow": self.tls = "prefer"
        case "require", "verify-ca", "verify-full": self.tls = "require"
        default:
            throw MessageStoreError(code: .invalidArgument, message: "unknown sslmode '\(mode)' in '\(url)' (disable, prefer, require)")
        }
        self.host = host
        self.port = components.port ?? 5432
        self.username = components.user.flatMap { $0.removingPercentEncoding } ?? "postgres"
        self.password = components.password.flatMap { $0.removingPercentEncoding }
        self.database = database.isEmpty ? nil : database
    }

    var clientConfiguration: PostgresClient.Configuration {
        let tls: PostgresClient.Configuration.TLS
        switch self.tls {
        case "disable": tls = .disable
        case "require": tls = .require(.makeClientConfiguration())
        default: tls = .prefer(.makeClientConfiguration())
        }
        var configuration = PostgresClient.Configuration(
            host: self.host,
            port: self.port,
            username: self.username,
            password: self.password,
            database: self.database,
            tls: tls
        )
        configuration.options.maximumConnections = 16
        return configuration
    }

    var connectionConfiguration: PostgresConnection.Configuration {
        get throws(MessageStoreError) {
            let tls: PostgresConnection.Configuration.TLS
            do {
                switch self.tls {
                case "disable": tls = .disable
                case "require": tls = .require(try NIOSSLContext(configuration: .makeClientConfiguration()))
                default: tls = .prefer(try NIOSSLContext(configuration: .makeClientConfiguration()))
                }
            } catch {
                throw MessageStoreError(code: .invalidArgument, message: "cannot make a TLS context for PostgreSQL: \(error)")
            }
            return PostgresConnection.Configuration(
                host: self.host,
                port: self.port,
                username: self.username,
                password: self.password,
                database: self.database,
                tls: tls
            )
        }
    }
}

extension Result where Failure == any Error {
    fileprivate init(catching body: () async throws -> Success) async {
        do {
            self = .success(try await body())
        } catch {
            self = .failure(error)
        }
    }
}
