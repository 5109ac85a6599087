import Logging
import NIOCore
import PostgresNIO
import TetherCore
import TetherGateway

/// One group of writes applied in one transaction: the conversations and lanes they touch are
/// read and locked (one statement), each write's conflict is decided in order, then what was
/// accepted is written (one statement; see ``GroupReadStatement`` and ``GroupWriteStatement``).
struct GroupCommit {
    let writes: [StoreWrite]
    let node: Int64?
    /// The group statements prepared on the store's connections.
    let prepared: PreparedStatements
    let logger: Logger

    private struct ConversationKey: Hashable {
        var client: String
        var epoch: Int64
        var conversation: String

        init(client: String, epoch: Int64, conversation: String) {
            self.client = client
            self.epoch = epoch
            self.conversation = conversation
        }

        /// The conversation `message` advances.
        init(_ message: ProcessedMessage) {
            self.init(client: message.outbox.client, epoch: Int64(bitPattern: message.outbox.epoch), conversation: message.conversation)
        }
    }

    private struct OutboxKey: Hashable {
        var client: String
        var epoch: Int64

        init(client: String, epoch: Int64) {
            self.client = client
            self.epoch = epoch
        }

        init(_ outbox: OutboxID) {
            self.init(client: outbox.client, epoch: Int64(bitPattern: outbox.epoch))
        }
    }

    func run(on connection: PostgresConnection) async throws -> [Result<[DeliveryReceipt], MessageStoreError>] {
        // A group of acknowledgements only need not wait for its WAL flush: if a crash of the
        // server loses it, the deliveries it removed are handed out again and the client,
        // which numbers what it received, drops them. Processed messages and deliveries always
        // wait (the gateway answers MESSAGE_ACK only once they are durable).
        if self.writes.allSatisfy({ $0.processed.isEmpty && $0.deliveries.isEmpty }) {
            _ = try await connection.rows("SET LOCAL synchronous_commit TO off", logger: self.logger)
        }
        // 1. The state the writes depend on, locked until the transaction ends.
        var conversationKeys: Set<ConversationKey> = []
        var fencedOutboxes: Set<OutboxKey> = []
        for write in self.writes {
            conversationKeys.formUnion(write.processed.map(ConversationKey.init))
            if let fence = write.fence, !write.processed.isEmpty {
                fencedOutboxes.insert(OutboxKey(fence.outbox))
            }
        }
        var last: [ConversationKey: UInt64] = [:]
        var existing: Set<ConversationKey> = []
        var fences: [OutboxKey: UInt64] = [:]
        if !conversationKeys.isEmpty || !fencedOutboxes.isEmpty {
            // One round trip: the conversations locked for update, the lanes' fences for share
            // (so that a takeover waits for this commit).
            let keys = Array(conversationKeys)
            let lanes = Array(fencedOutboxes)
            let read = GroupReadStatement(
                conversationClients: keys.map(\.client),
                conversationEpochs: keys.map(\.epoch),
                conversations: keys.map(\.conversation),
                laneClients: lanes.map(\.client),
                laneEpochs: lanes.map(\.epoch)
            )
            for row in try await self.prepared.rows(read, on: connection) {
                if row.isLane {
                    fences[OutboxKey(client: row.client, epoch: row.epoch)] = UInt64(bitPattern: row.value)
                } else {
                    let key = ConversationKey(client: row.client, epoch: row.epoch, conversation: row.conversation)
                    last[key] = UInt64(bitPattern: row.value)
                    existing.insert(key)
                }
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
                let current = fences[OutboxKey(fence.outbox)]
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
                let key = ConversationKey(message)
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
            advanced.formUnion(write.processed.map(ConversationKey.init))
            outcomes += write.processed
            deliveries += write.deliveries.map { (index, $0) }
            for (recipient, sequence) in write.acknowledgements {
                acknowledgements[recipient] = max(acknowledgements[recipient] ?? 0, sequence)
            }
        }

        // 3. What was accepted, in one statement.
        var receipts: [[DeliveryReceipt]] = Array(repeating: [], count: self.writes.count)
        if !outcomes.isEmpty || !deliveries.isEmpty || !acknowledgements.isEmpty {
            let firsts = try await self.write(
                outcomes,
                advanced: advanced,
                last: last,
                existing: existing,
                deliveries: deliveries.map(\.delivery),
                acknowledgements: acknowledgements,
                on: connection
            )
            var next = firsts
            for (write, delivery) in deliveries {
                let sequence = next[delivery.recipient]!
                next[delivery.recipient] = sequence + 1
                receipts[write].append(DeliveryReceipt(recipient: delivery.recipient, sequence: sequence))
            }
        }
        return results.enumerated().map { index, result in result ?? .success(receipts[index]) }
    }

    /// Writes what a group accepted, in one statement (one round trip): see ``GroupWriteStatement``.
    /// - Returns: The first sequence given to each recipient's deliveries (the rest follow in order).
    private func write(
        _ outcomes: [ProcessedMessage],
        advanced: Set<ConversationKey>,
        last: [ConversationKey: UInt64],
        existing: Set<ConversationKey>,
        deliveries: [NewDelivery],
        acknowledgements: [String: UInt64],
        on connection: PostgresConnection
    ) async throws -> [String: UInt64] {
        let advancedKeys = Array(advanced)
        var ordinal: [String: Int64] = [:]
        let acknowledged = Array(acknowledgements.keys)
        var statement = GroupWriteStatement()
        statement.outcomeClients = outcomes.map(\.outbox.client)
        statement.outcomeEpochs = outcomes.map { Int64(bitPattern: $0.outbox.epoch) }
        statement.outcomeConversations = outcomes.map(\.conversation)
        statement.outcomeSequences = outcomes.map { Int64(bitPattern: $0.sequence) }
        statement.outcomeStatuses = outcomes.map { Int32($0.status.rawValue) }
        statement.outcomeMessageIDs = outcomes.map { Int64(bitPattern: $0.messageID ?? 0) }
        statement.outcomeHasID = outcomes.map { $0.messageID != nil }
        statement.conversationClients = advancedKeys.map(\.client)
        statement.conversationEpochs = advancedKeys.map(\.epoch)
        statement.conversations = advancedKeys.map(\.conversation)
        statement.lastSequences = advancedKeys.map { Int64(bitPattern: last[$0] ?? 0) }
        // New conversations are inserted (a concurrent insert of the same one fails the whole
        // transaction: safe); existing ones, locked above, are updated.
        statement.newConversations = advancedKeys.map { !existing.contains($0) }
        statement.trimmedUpTo = advancedKeys.map { key -> Int64 in
            let sequence = last[key] ?? 0
            return sequence > messageStoreOutcomeWindow ? Int64(bitPattern: sequence - messageStoreOutcomeWindow) : 0
        }
        statement.acknowledgedRecipients = acknowledged
        statement.acknowledgedUpTo = acknowledged.map { Int64(bitPattern: acknowledgements[$0]!) }
        statement.deliveryRecipients = deliveries.map(\.recipient)
        statement.deliveryOrdinals = deliveries.map { delivery -> Int64 in
            let next = (ordinal[delivery.recipient] ?? 0) + 1
            ordinal[delivery.recipient] = next
            return next
        }
        statement.deliveryTopics = deliveries.map(\.topic)
        statement.deliveryBodies = deliveries.map(\.body)
        statement.deliveryCompressed = deliveries.map(\.compressed)
        statement.node = self.node ?? 0
        var firsts: [String: UInt64] = [:]
        for row in try await self.prepared.rows(statement, on: connection) where !row.isNotification {
            firsts[row.recipient] = UInt64(bitPattern: row.first)
        }
        guard firsts.count == ordinal.count else {
            throw PostgresStoreError("appending deliveries numbered \(firsts.count) of \(ordinal.count) recipients")
        }
        // An acknowledgement of a delivery appended by an earlier write of this group (the
        // statement above saw the streams as they were before it): removed now.
        let late = acknowledgements.filter { recipient, upTo in firsts[recipient].map { upTo >= $0 } ?? false }
        if !late.isEmpty {
            try await self.acknowledge(late, on: connection)
        }
        return firsts
    }

    /// Removes acknowledged deliveries, and counts them out of their streams.
    private func acknowledge(_ acknowledgements: [String: UInt64], on connection: PostgresConnection) async throws {
        let recipients = Array(acknowledgements.keys)
        _ = try await connection.rows(
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
}
