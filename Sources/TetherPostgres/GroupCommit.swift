import Logging
import NIOCore
import PostgresNIO
import TetherCore
import TetherGateway

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
