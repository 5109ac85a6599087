public import Foundation
import NIOCore
import PostgresNIO
public import TetherCore
public import TetherGateway

extension PostgresMessageStore: ChannelHistoryStore {
    /// Appends in one transaction, under an advisory lock that makes the appends of every node
    /// commit one after another: the publications' ids are in commit order, and the nodes
    /// tailing them (``PostgresCluster``) skip none. Ends with a notification on
    /// `tether_channels`.
    public func appendPublications(_ publications: [ChannelAppend]) async throws -> [ChannelPosition] {
        guard !publications.isEmpty else { return [] }
        let channels = Array(Set(publications.map(\.channel))).sorted()
        let epochs = channels.map { Int64(bitPattern: self.streamEpoch(of: $0)) }
        return try await self.storage { [client = self.client, logger = self.logger] in
            try await client.withTransaction(logger: logger) { connection in
                try await connection.rows(
                    "SELECT pg_advisory_xact_lock(\(PostgresSchema.otherLocks), \(PostgresSchema.channelLock))",
                    logger: logger
                )
                try await connection.rows(
                    """
                    INSERT INTO tether_channel_streams (channel, epoch, top)
                    SELECT c, e, 0 FROM unnest(\(channels), \(epochs)) AS s(c, e) ON CONFLICT (channel) DO NOTHING
                    """,
                    logger: logger
                )
                var heads: [String: (epoch: UInt64, top: UInt64, maxCount: Int)] = [:]
                let rows = try await connection.rows(
                    "SELECT channel, epoch, top FROM tether_channel_streams WHERE channel = ANY(\(channels))",
                    logger: logger
                )
                for (channel, epoch, top) in try rows.decode((String, Int64, Int64).self) {
                    heads[channel] = (UInt64(bitPattern: epoch), UInt64(bitPattern: top), 1)
                }
                var positions: [ChannelPosition] = []
                positions.reserveCapacity(publications.count)
                for publication in publications {
                    guard var head = heads[publication.channel] else {
                        throw MessageStoreError(code: .storage, message: "the stream of \(publication.channel) was not created")
                    }
                    head.top += 1
                    head.maxCount = publication.maxCount
                    heads[publication.channel] = head
                    positions.append(ChannelPosition(epoch: head.epoch, offset: head.top))
                }
                try await connection.rows(
                    """
                    INSERT INTO tether_channel_publications (channel, position, time, publisher, body)
                    SELECT channel, position, time, publisher, body
                    FROM unnest(\(publications.map(\.channel)), \(positions.map { Int64(bitPattern: $0.offset) }),
                        \(publications.map { Self.milliseconds($0.time) }), \(publications.map(\.publisher)),
                        \(publications.map(\.body))) WITH ORDINALITY AS p(channel, position, time, publisher, body, n)
                    ORDER BY n
                    """,
                    logger: logger
                )
                let names = Array(heads.keys)
                let tops = names.map { Int64(bitPattern: heads[$0]!.top) }
                let cutoffs = names.map { name in
                    let head = heads[name]!
                    return Int64(bitPattern: head.top > UInt64(head.maxCount) ? head.top - UInt64(head.maxCount) : 0)
                }
                try await connection.rows(
                    """
                    UPDATE tether_channel_streams s SET top = t.top
                    FROM unnest(\(names), \(tops)) AS t(channel, top) WHERE s.channel = t.channel
                    """,
                    logger: logger
                )
                try await connection.rows(
                    """
                    DELETE FROM tether_channel_publications p
                    USING unnest(\(names), \(cutoffs)) AS d(channel, cutoff)
                    WHERE p.channel = d.channel AND p.position <= d.cutoff
                    """,
                    logger: logger
                )
                try await connection.rows("SELECT pg_notify('tether_channels', '')", logger: logger)
                return positions
            }
        }
    }

    public func head(of channel: String, notBefore: Date) async throws -> ChannelStreamHead {
        let derived = self.streamEpoch(of: channel)
        return try await self.storage { [client = self.client, logger = self.logger] in
            var head = ChannelStreamHead(epoch: derived, top: 0, oldest: nil)
            let rows = try await client.rows(
                """
                SELECT s.epoch, s.top, (SELECT min(position) FROM tether_channel_publications
                    WHERE channel = s.channel AND time >= \(Self.milliseconds(notBefore)))
                FROM tether_channel_streams s WHERE s.channel = \(channel)
                """,
                logger: logger
            )
            for (epoch, top, oldest) in try rows.decode((Int64, Int64, Int64?).self) {
                head = ChannelStreamHead(
                    epoch: UInt64(bitPattern: epoch),
                    top: UInt64(bitPattern: top),
                    oldest: oldest.map { UInt64(bitPattern: $0) }
                )
            }
            return head
        }
    }

    public func publications(
        of channel: String,
        epoch: UInt64,
        after offset: UInt64,
        limit: Int,
        notBefore: Date
    ) async throws -> [StoredPublication]? {
        let derived = self.streamEpoch(of: channel)
        return try await self.storage { [client = self.client, logger = self.logger] in
            var stored: UInt64?
            for value in try await client.rows(
                "SELECT epoch FROM tether_channel_streams WHERE channel = \(channel)",
                logger: logger
            ).decode(Int64.self) {
                stored = UInt64(bitPattern: value)
            }
            guard (stored ?? derived) == epoch else { return nil }
            var publications: [StoredPublication] = []
            let rows = try await client.rows(
                """
                SELECT position, time, publisher, body FROM tether_channel_publications
                WHERE channel = \(channel) AND position > \(Int64(bitPattern: offset)) AND time >= \(Self.milliseconds(notBefore))
                ORDER BY position LIMIT \(max(0, limit))
                """,
                logger: logger
            )
            for (position, time, publisher, body) in try rows.decode((Int64, Int64, String, ByteBuffer).self) {
                publications.append(
                    StoredPublication(
                        offset: UInt64(bitPattern: position),
                        publisher: publisher,
                        body: body,
                        time: Date(timeIntervalSince1970: Double(time) / 1000)
                    )
                )
            }
            return publications
        }
    }

    public func trimPublications(before time: Date) async throws -> Int {
        try await self.storage { [client = self.client, logger = self.logger] in
            try await client.rows(
                "DELETE FROM tether_channel_publications WHERE time < \(Self.milliseconds(time)) RETURNING 1",
                logger: logger
            ).count
        }
    }

    /// The epoch of a channel's stream in this database (``ChannelStreamHead/derivedEpoch(store:channel:)``):
    /// every node answers the same one before the stream's first publication creates its row.
    func streamEpoch(of channel: String) -> UInt64 {
        ChannelStreamHead.derivedEpoch(store: self.epoch, channel: channel)
    }

    static func milliseconds(_ time: Date) -> Int64 { Int64((time.timeIntervalSince1970 * 1000).rounded(.down)) }
}
