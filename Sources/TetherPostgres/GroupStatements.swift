import NIOCore
import PostgresNIO
import TetherGateway

// The two statements of a group commit, prepared once per connection: PostgreSQL then parses
// and plans them once (a group's write statement took 1.2 ms to plan, as long as it took to
// run), and every group binds its arrays and executes.

/// Reads and locks what a group's writes depend on: the conversations they advance (for
/// update) and the fences of the lanes they commit under (for share, so that a takeover waits
/// for this commit).
struct GroupReadStatement: PreparedStatement {
    static let sql = """
        WITH c AS (
            SELECT c.client, c.epoch, c.conversation, c.last_sequence FROM tether_conversations c
            JOIN unnest($1::text[], $2::int8[], $3::text[]) AS k(client, epoch, conversation)
            ON c.client = k.client AND c.epoch = k.epoch AND c.conversation = k.conversation
            ORDER BY c.client, c.epoch, c.conversation
            FOR UPDATE OF c
        ),
        l AS (
            SELECT l.client, l.epoch, l.fence FROM tether_lanes l
            JOIN unnest($4::text[], $5::int8[]) AS k(client, epoch)
            ON l.client = k.client AND l.epoch = k.epoch
            FOR SHARE OF l
        )
        SELECT false, client, epoch, conversation, last_sequence FROM c
        UNION ALL SELECT true, client, epoch, '', fence FROM l
        """
    typealias Row = (isLane: Bool, client: String, epoch: Int64, conversation: String, value: Int64)

    var conversationClients: [String]
    var conversationEpochs: [Int64]
    var conversations: [String]
    var laneClients: [String]
    var laneEpochs: [Int64]

    func binds() throws -> [PostgresData] {
        [
            try PostgresData(encoding: self.conversationClients),
            try PostgresData(encoding: self.conversationEpochs),
            try PostgresData(encoding: self.conversations),
            try PostgresData(encoding: self.laneClients),
            try PostgresData(encoding: self.laneEpochs),
        ]
    }

    func decodeRow(_ row: PostgresRow) throws -> Row {
        try row.decodeBinary((Bool, String, Int64, String, Int64).self)
    }
}

/// Writes what a group accepted, in one statement: records the outcomes, advances their
/// conversations (inserting new ones) and forgets outcomes past the window; removes
/// acknowledged deliveries; appends the new deliveries to their recipients' streams; and
/// signals the other nodes where those recipients are connected, notifying each once (on
/// commit).
///
/// The sub-statements see one snapshot and must not change a row twice, so a recipient's
/// stream row is changed once, by one upsert that adds its new deliveries and subtracts its
/// acknowledged ones. It returns each recipient's first new sequence, and one row counting
/// the notifications.
///
/// The nodes to signal are read by `tether_presence_nodes`, after the recipient's stream row
/// is locked and with a snapshot of its own (the function is VOLATILE), not with the
/// statement's: a presence committed while the statement ran is seen. The node that writes a
/// presence then waits on the same row (`PostgresCluster.flushWrites`), so a commit
/// either sees the presence and signals, or had the row first and is committed before that node
/// reads the recipient's deliveries again.
struct GroupWriteStatement: PreparedStatement {
    static let sql = """
        WITH o AS (
            INSERT INTO tether_outcomes (client, epoch, conversation, sequence, status, message_id)
            SELECT client, epoch, conversation, sequence, status, CASE WHEN has_id THEN message_id END
            FROM unnest($1::text[], $2::int8[], $3::text[], $4::int8[], $5::int4[], $6::int8[], $7::bool[])
                AS v(client, epoch, conversation, sequence, status, message_id, has_id)
        ),
        k AS (
            SELECT * FROM unnest($8::text[], $9::int8[], $10::text[], $11::int8[], $12::bool[], $13::int8[])
                AS k(client, epoch, conversation, last_sequence, is_new, trimmed)
        ),
        ci AS (
            INSERT INTO tether_conversations (client, epoch, conversation, last_sequence)
            SELECT client, epoch, conversation, last_sequence FROM k WHERE is_new
        ),
        cu AS (
            UPDATE tether_conversations c SET last_sequence = k.last_sequence FROM k
            WHERE NOT k.is_new AND c.client = k.client AND c.epoch = k.epoch AND c.conversation = k.conversation
        ),
        ot AS (
            DELETE FROM tether_outcomes t USING k
            WHERE k.trimmed > 0 AND t.client = k.client AND t.epoch = k.epoch AND t.conversation = k.conversation
                AND t.sequence <= k.trimmed
        ),
        ad AS (
            DELETE FROM tether_deliveries d
            USING unnest($14::text[], $15::int8[]) AS a(recipient, up_to)
            WHERE d.recipient = a.recipient AND d.sequence <= a.up_to
            RETURNING d.recipient, length(d.body) AS bytes
        ),
        acked AS (SELECT recipient, count(*)::bigint AS n, sum(bytes)::bigint AS bytes FROM ad GROUP BY recipient),
        d AS (
            SELECT * FROM unnest($16::text[], $17::int8[], $18::text[], $19::bytea[], $21::bool[]) AS d(recipient, k, topic, body, compressed)
        ),
        counts AS (SELECT recipient, count(*)::bigint AS n, sum(length(body))::bigint AS bytes FROM d GROUP BY recipient),
        changes AS (
            SELECT recipient, coalesce(c.n, 0) AS added, coalesce(c.bytes, 0) AS added_bytes,
                coalesce(a.n, 0) AS removed, coalesce(a.bytes, 0) AS removed_bytes
            FROM counts c FULL JOIN acked a USING (recipient)
        ),
        s AS (
            INSERT INTO tether_streams AS s (recipient, next_sequence, waiting, waiting_bytes)
            SELECT recipient, added + 1, added - removed, added_bytes - removed_bytes FROM changes ORDER BY recipient
            ON CONFLICT (recipient) DO UPDATE SET next_sequence = s.next_sequence + excluded.next_sequence - 1,
                waiting = s.waiting + excluded.waiting, waiting_bytes = s.waiting_bytes + excluded.waiting_bytes
            RETURNING s.recipient, s.next_sequence
        ),
        firsts AS (SELECT s.recipient, s.next_sequence - counts.n AS first FROM s JOIN counts USING (recipient)),
        di AS (
            INSERT INTO tether_deliveries (recipient, sequence, topic, body, compressed)
            SELECT d.recipient, firsts.first + d.k - 1, d.topic, d.body, d.compressed FROM d JOIN firsts USING (recipient)
        ),
        w AS (
            INSERT INTO tether_signals (node, kind, key)
            SELECT p.node, \(ClusterSignal.Kind.deliveries.rawValue), f.recipient
            FROM firsts f, tether_presence_nodes(f.recipient, $20::int8) AS p(node)
            WHERE $20::int8 <> 0
            RETURNING node
        )
        SELECT false, recipient, first FROM firsts
        UNION ALL
        SELECT true, '', count(*) FROM (SELECT pg_notify('tether_node_' || n.node, '') FROM (SELECT DISTINCT node FROM w) AS n) AS z
        """
    typealias Row = (isNotification: Bool, recipient: String, first: Int64)

    var outcomeClients: [String] = []
    var outcomeEpochs: [Int64] = []
    var outcomeConversations: [String] = []
    var outcomeSequences: [Int64] = []
    var outcomeStatuses: [Int32] = []
    var outcomeMessageIDs: [Int64] = []
    var outcomeHasID: [Bool] = []
    var conversationClients: [String] = []
    var conversationEpochs: [Int64] = []
    var conversations: [String] = []
    var lastSequences: [Int64] = []
    var newConversations: [Bool] = []
    var trimmedUpTo: [Int64] = []
    var acknowledgedRecipients: [String] = []
    var acknowledgedUpTo: [Int64] = []
    var deliveryRecipients: [String] = []
    var deliveryOrdinals: [Int64] = []
    var deliveryTopics: [String] = []
    var deliveryBodies: [ByteBuffer] = []
    var deliveryCompressed: [Bool] = []
    /// This node's id in the cluster; 0 outside one (no signals).
    var node: Int64 = 0

    func binds() throws -> [PostgresData] {
        [
            try PostgresData(encoding: self.outcomeClients),
            try PostgresData(encoding: self.outcomeEpochs),
            try PostgresData(encoding: self.outcomeConversations),
            try PostgresData(encoding: self.outcomeSequences),
            try PostgresData(encoding: self.outcomeStatuses),
            try PostgresData(encoding: self.outcomeMessageIDs),
            try PostgresData(encoding: self.outcomeHasID),
            try PostgresData(encoding: self.conversationClients),
            try PostgresData(encoding: self.conversationEpochs),
            try PostgresData(encoding: self.conversations),
            try PostgresData(encoding: self.lastSequences),
            try PostgresData(encoding: self.newConversations),
            try PostgresData(encoding: self.trimmedUpTo),
            try PostgresData(encoding: self.acknowledgedRecipients),
            try PostgresData(encoding: self.acknowledgedUpTo),
            try PostgresData(encoding: self.deliveryRecipients),
            try PostgresData(encoding: self.deliveryOrdinals),
            try PostgresData(encoding: self.deliveryTopics),
            try PostgresData(encoding: self.deliveryBodies),
            try PostgresData(encoding: self.node),
            try PostgresData(encoding: self.deliveryCompressed),
        ]
    }

    func decodeRow(_ row: PostgresRow) throws -> Row {
        try row.decodeBinary((Bool, String, Int64).self)
    }
}
