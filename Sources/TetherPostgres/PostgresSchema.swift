import Foundation
import Logging
import NIOCore
import PostgresNIO
import TetherCore
import TetherGateway

/// The tables of Tether's PostgreSQL store and cluster, and their migrations.
///
/// Every table is named `tether_…`, so that they can live in an application's own database.
/// Migrations run in one transaction under an advisory lock: nodes starting together migrate
/// once. The record tables are logged (they survive a crash of the server); presence, signals
/// and pushes are `UNLOGGED` (a crash of the server empties them, and every node writes its
/// presence again when it reconnects).
enum PostgresSchema {
    /// The key space of the nodes' liveness locks (the first of the two 32-bit keys; the
    /// second is the node's id).
    static let lockSpace: Int32 = 0x7e7e
    /// The key space of Tether's other advisory locks: ``migrationLock`` and ``pushLock``.
    static let otherLocks: Int32 = 0x7e7d
    static let migrationLock: Int32 = 0
    static let pushLock: Int32 = 1
    /// Serializes the appends to channels' streams, so that the ids of their publications
    /// commit in order and a node tailing them (``PostgresCluster``) skips none.
    static let channelLock: Int32 = 2

    /// Each migration, in order; the schema's version is the number applied.
    static let migrations: [String] = [
        """
        CREATE TABLE tether_meta (key text PRIMARY KEY, value bigint NOT NULL);
        CREATE TABLE tether_outboxes (
            client text NOT NULL, epoch bigint NOT NULL, last_seen bigint NOT NULL,
            PRIMARY KEY (client, epoch));
        CREATE INDEX tether_outboxes_last_seen ON tether_outboxes (last_seen);
        CREATE TABLE tether_conversations (
            client text NOT NULL, epoch bigint NOT NULL, conversation text NOT NULL, last_sequence bigint NOT NULL,
            PRIMARY KEY (client, epoch, conversation));
        CREATE TABLE tether_outcomes (
            client text NOT NULL, epoch bigint NOT NULL, conversation text NOT NULL, sequence bigint NOT NULL,
            status integer NOT NULL, message_id bigint,
            PRIMARY KEY (client, epoch, conversation, sequence));
        CREATE TABLE tether_streams (
            recipient text PRIMARY KEY, next_sequence bigint NOT NULL,
            waiting bigint NOT NULL DEFAULT 0, waiting_bytes bigint NOT NULL DEFAULT 0);
        CREATE TABLE tether_deliveries (
            recipient text NOT NULL, sequence bigint NOT NULL, topic text NOT NULL, body bytea NOT NULL,
            PRIMARY KEY (recipient, sequence));
        CREATE TABLE tether_nodes (
            id bigserial PRIMARY KEY, name text NOT NULL, address text,
            started_at timestamptz NOT NULL DEFAULT now(), seen_at timestamptz NOT NULL DEFAULT now(),
            leaving boolean NOT NULL DEFAULT false);
        CREATE TABLE tether_lanes (
            client text NOT NULL, epoch bigint NOT NULL, node bigint, fence bigint NOT NULL,
            claimed_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (client, epoch));
        CREATE UNLOGGED TABLE tether_presence (client text NOT NULL, node bigint NOT NULL, PRIMARY KEY (client, node));
        CREATE INDEX tether_presence_node ON tether_presence (node);
        CREATE UNLOGGED TABLE tether_signals (
            id bigserial PRIMARY KEY, node bigint NOT NULL, kind smallint NOT NULL, key text NOT NULL);
        CREATE INDEX tether_signals_node ON tether_signals (node, id);
        CREATE UNLOGGED TABLE tether_pushes (
            id bigserial PRIMARY KEY, origin bigint NOT NULL, kind smallint NOT NULL, target text NOT NULL,
            topic text NOT NULL, body bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now());
        CREATE INDEX tether_pushes_created_at ON tether_pushes (created_at);
        """,
        // 2: where each node's HTTP streams are, for POSTs another node receives.
        """
        ALTER TABLE tether_nodes ADD COLUMN stream_key bigint, ADD COLUMN stream_url text;
        CREATE INDEX tether_nodes_stream_key ON tether_nodes (stream_key);
        """,
        // 3: payloads worth it are stored compressed (raw DEFLATE), and sent so.
        """
        ALTER TABLE tether_deliveries ADD COLUMN compressed boolean NOT NULL DEFAULT false;
        """,
        // 4: the nodes a group commit signals, read afresh. A VOLATILE function takes a new
        // snapshot for its query, so a group commit that locked a recipient's stream row reads
        // the presence committed before it did so, not as of its statement's start (see
        // PostgresCluster's "Presence and signals").
        """
        CREATE FUNCTION tether_presence_nodes(recipient text, origin bigint) RETURNS SETOF bigint
            LANGUAGE sql VOLATILE AS 'SELECT node FROM tether_presence WHERE client = recipient AND node <> origin'
        """,
        // 5: channels' history (ChannelHistoryStore): a stream per channel, its publications by
        // offset, their time (milliseconds since 1970) for the retention by age, and an id in
        // commit order that every node tails to send the publications to its subscribers.
        """
        CREATE TABLE tether_channel_streams (channel text PRIMARY KEY, epoch bigint NOT NULL, top bigint NOT NULL);
        CREATE TABLE tether_channel_publications (
            id bigserial PRIMARY KEY, channel text NOT NULL, position bigint NOT NULL, time bigint NOT NULL,
            publisher text NOT NULL, body bytea NOT NULL);
        CREATE UNIQUE INDEX tether_channel_publications_position ON tether_channel_publications (channel, position);
        CREATE INDEX tether_channel_publications_time ON tether_channel_publications (time)
        """,
        // 6: the members of channels that keep presence, by node (PostgresCluster): each
        // node's row of a client says how many of its connections are subscribed there.
        """
        CREATE UNLOGGED TABLE tether_channel_members (
            channel text NOT NULL, client text NOT NULL, node bigint NOT NULL, connections integer NOT NULL, info text NOT NULL,
            PRIMARY KEY (channel, client, node));
        CREATE INDEX tether_channel_members_node ON tether_channel_members (node)
        """,
        // 7: the answers of nodes to another node's question about their connections
        // (PostgresCluster.ask): read, then deleted, by the node that asked.
        """
        CREATE UNLOGGED TABLE tether_answers (
            query bigint NOT NULL, node bigint NOT NULL, body bytea NOT NULL, created_at timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (query, node));
        CREATE INDEX tether_answers_created_at ON tether_answers (created_at)
        """,
    ]

    /// Brings the database's schema up to date.
    static func migrate(_ client: PostgresClient, logger: Logger) async throws {
        try await client.withTransaction(logger: logger) { connection in
            try await connection.rows("SELECT pg_advisory_xact_lock(\(Self.otherLocks), \(Self.migrationLock))", logger: logger)
            try await connection.rows("CREATE TABLE IF NOT EXISTS tether_schema (version integer NOT NULL)", logger: logger)
            var version = 0
            for value in try await connection.rows("SELECT version FROM tether_schema", logger: logger).decode(Int.self) {
                version = value
            }
            if version == 0 {
                try await connection.rows("INSERT INTO tether_schema (version) VALUES (0)", logger: logger)
            }
            guard version <= Self.migrations.count else {
                throw PostgresStoreError(
                    "the database's Tether schema is version \(version), newer than this gateway knows (\(Self.migrations.count)): upgrade the gateway"
                )
            }
            for (index, migration) in Self.migrations.enumerated().dropFirst(version) {
                for statement in migration.split(separator: ";").map({ $0.trimmingCharacters(in: .whitespacesAndNewlines) })
                where !statement.isEmpty {
                    try await connection.rows(PostgresQuery(unsafeSQL: statement), logger: logger)
                }
                try await connection.rows("UPDATE tether_schema SET version = \(index + 1)", logger: logger)
            }
        }
    }
}

/// A failure in Tether's PostgreSQL layer, outside the store's contract.
struct PostgresStoreError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}

/// A row of `tether_signals`: something one node asks of another, which a notification on the
/// node's channel (`tether_node_<id>`) wakes it to read.
/// How a push's target is stored in `tether_pushes` (`kind`, `target`); a connection is one
/// node's own and never stored.
enum StoredPushTarget {
    static func encode(_ target: PushTarget) -> (kind: Int16, name: String) {
        switch target {
        case .client(let client): (1, client)
        case .room(let room): (2, room)
        case .all: (3, "")
        case .connection: (0, "")
        }
    }

    /// The target a row names; `nil` for a kind this node does not know.
    static func decode(kind: Int16, name: String) -> PushTarget? {
        switch kind {
        case 1: .client(name)
        case 2: .room(name)
        case 3: .all
        default: nil
        }
    }
}

/// A row of `tether_pushes` to write: a push (its target's kind and name) or a client command.
struct StoredPush: Sendable {
    var kind: Int16
    var target: String
    var topic: String
    var body: ByteBuffer
}

/// An order about a client id's connections (``ClientCommand``), stored in `tether_pushes` as
/// kind ``kind``: the client in `target`, the order in `topic` (`disconnect`, `refresh`,
/// `expire`), its arguments in `body` — disconnect: `u8` reconnect, `i64` retry after (ms), the
/// message (UTF-8); refresh: `i64` the expiry (ms since 1970); expire: the message. A node that
/// does not know the kind skips the row.
enum StoredClientCommand {
    static let kind: Int16 = 5

    static func row(_ command: ClientCommand) -> StoredPush {
        var body = ByteBuffer()
        let topic: String
        switch command {
        case .disconnect(_, let reconnect, let retryAfter, let message):
            topic = "disconnect"
            body.writeInteger(UInt8(reconnect ? 1 : 0))
            body.writeInteger(Int64(clamping: retryAfter.wholeMilliseconds))
            body.writeString(message)
        case .refreshCredentials(_, let expiresAt):
            topic = "refresh"
            body.writeInteger(Int64(expiresAt.timeIntervalSince1970 * 1000))
        case .expireCredentials(_, let message):
            topic = "expire"
            body.writeString(message)
        }
        return StoredPush(kind: Self.kind, target: command.clientID, topic: topic, body: body)
    }

    /// The command a row holds; `nil` for one this node does not know or cannot read.
    static func decode(client: String, topic: String, body: ByteBuffer) -> ClientCommand? {
        var body = body
        switch topic {
        case "disconnect":
            guard let reconnect = body.readInteger(as: UInt8.self), let retryAfter = body.readInteger(as: Int64.self),
                let message = body.readString(length: body.readableBytes)
            else { return nil }
            return .disconnect(client: client, reconnect: reconnect != 0, retryAfter: .milliseconds(retryAfter), message: message)
        case "refresh":
            guard let milliseconds = body.readInteger(as: Int64.self) else { return nil }
            return .refreshCredentials(client: client, expiresAt: Date(timeIntervalSince1970: TimeInterval(milliseconds) / 1000))
        case "expire":
            guard let message = body.readString(length: body.readableBytes) else { return nil }
            return .expireCredentials(client: client, message: message)
        default:
            return nil
        }
    }
}

/// A node's question about the other nodes' connections (``ClusterQuestion``), stored in
/// `tether_pushes` as kind ``kind``: the client id or room in `target`, what is asked in
/// `topic` (`connections`, `members`), the question's id (`i64`) in `body`. Each node that
/// reads it answers with a row of `tether_answers`: its connections, as JSON. A node that does
/// not know the kind skips the row (and is named among those that did not answer).
enum StoredQuestion {
    static let kind: Int16 = 6

    /// One connection in an answer.
    struct Connection: Codable {
        var id: UInt64
        var client: String
        var userAgent: String?
        var remoteAddress: String?
    }

    static func row(_ question: ClusterQuestion, id: Int64) -> StoredPush {
        var body = ByteBuffer()
        body.writeInteger(id)
        switch question {
        case .connections(let client): return StoredPush(kind: Self.kind, target: client, topic: "connections", body: body)
        case .members(let room): return StoredPush(kind: Self.kind, target: room, topic: "members", body: body)
        }
    }

    /// The question a row holds and its id; `nil` for one this node does not know or cannot read.
    static func decode(target: String, topic: String, body: ByteBuffer) -> (id: Int64, question: ClusterQuestion)? {
        var body = body
        guard let id = body.readInteger(as: Int64.self) else { return nil }
        switch topic {
        case "connections": return (id, .connections(client: target))
        case "members": return (id, .members(room: target))
        default: return nil
        }
    }

    static func answer(_ connections: [ConnectionInfo]) -> ByteBuffer {
        let stored = connections.map {
            Connection(id: $0.id, client: $0.clientID, userAgent: $0.userAgent, remoteAddress: $0.remoteAddress)
        }
        return ByteBuffer(bytes: (try? JSONEncoder().encode(stored)) ?? Data("[]".utf8))
    }

    /// The connections of an answer; `nil` if it cannot be read.
    static func connections(in answer: ByteBuffer) -> [ConnectionInfo]? {
        guard let stored = try? JSONDecoder().decode([Connection].self, from: Data(answer.readableBytesView)) else { return nil }
        return stored.map { ConnectionInfo(id: $0.id, clientID: $0.client, userAgent: $0.userAgent, remoteAddress: $0.remoteAddress) }
    }
}

/// A change of a node's channel members, stored in `tether_pushes` as kind ``kind``: the
/// channel in `target`, the client in `topic`, and in `body` its connections on that node
/// (`u32`, 0: none left) followed by its info (UTF-8).
enum StoredChannelMember {
    static let kind: Int16 = 4

    static func body(of member: ClusterChannelMember) -> ByteBuffer {
        var body = ByteBuffer()
        body.writeInteger(UInt32(clamping: member.connections))
        body.writeString(member.info)
        return body
    }

    static func decode(channel: String, client: String, body: ByteBuffer) -> ClusterChannelMember? {
        var body = body
        guard let connections = body.readInteger(as: UInt32.self), let info = body.readString(length: body.readableBytes) else {
            return nil
        }
        return ClusterChannelMember(channel: channel, clientID: client, connections: Int(connections), info: info)
    }
}

enum ClusterSignal {
    enum Kind: Int16 {
        /// Deliveries were appended for the recipient named by the key.
        case deliveries = 1
        /// Another node wants the lane of the outbox named by the key (`client`, a tab, the epoch).
        case releaseLane = 2
    }
}
