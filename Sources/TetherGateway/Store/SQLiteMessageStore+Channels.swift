public import Foundation
import GRDB
import NIOCore
public import TetherCore

extension SQLiteMessageStore: ChannelHistoryStore {
    public func appendPublications(_ publications: [ChannelAppend]) async throws -> [ChannelPosition] {
        guard !publications.isEmpty else { return [] }
        return try await self.write { db in
            var heads: [String: (epoch: UInt64, top: UInt64, maxCount: Int)] = [:]
            var positions: [ChannelPosition] = []
            positions.reserveCapacity(publications.count)
            let insert = try db.cachedStatement(
                sql: "INSERT INTO channel_publications (channel, position, time, publisher, body) VALUES (?, ?, ?, ?, ?)"
            )
            for publication in publications {
                var head: (epoch: UInt64, top: UInt64, maxCount: Int)
                if let known = heads[publication.channel] {
                    head = known
                } else {
                    let stream = try self.stream(of: publication.channel, db, creating: true)
                    head = (stream.epoch, stream.top, publication.maxCount)
                }
                head.top += 1
                head.maxCount = publication.maxCount
                try insert.execute(arguments: [
                    publication.channel, Int64(bitPattern: head.top), Self.milliseconds(publication.time), publication.publisher,
                    Data(publication.body.readableBytesView),
                ])
                heads[publication.channel] = head
                positions.append(ChannelPosition(epoch: head.epoch, offset: head.top))
            }
            for (channel, head) in heads {
                try db.cachedStatement(sql: "UPDATE channel_streams SET top = ? WHERE channel = ?")
                    .execute(arguments: [Int64(bitPattern: head.top), channel])
                if head.top > UInt64(head.maxCount) {
                    try db.cachedStatement(sql: "DELETE FROM channel_publications WHERE channel = ? AND position <= ?")
                        .execute(arguments: [channel, Int64(bitPattern: head.top - UInt64(head.maxCount))])
                }
            }
            return positions
        }
    }

    public func head(of channel: String, notBefore: Date) async throws -> ChannelStreamHead {
        try await self.read { db in
            let stream = try self.stream(of: channel, db, creating: false)
            let oldest = try Int64.fetchOne(
                db.cachedStatement(sql: "SELECT min(position) FROM channel_publications WHERE channel = ? AND time >= ?"),
                arguments: [channel, Self.milliseconds(notBefore)]
            )
            return ChannelStreamHead(epoch: stream.epoch, top: stream.top, oldest: oldest.map { UInt64(bitPattern: $0) })
        }
    }

    public func publications(
        of channel: String,
        epoch: UInt64,
        after offset: UInt64,
        limit: Int,
        notBefore: Date
    ) async throws -> [StoredPublication]? {
        try await self.read { db in
            let stored = try Int64.fetchOne(
                db.cachedStatement(sql: "SELECT epoch FROM channel_streams WHERE channel = ?"),
                arguments: [channel]
            )
            guard (stored.map { UInt64(bitPattern: $0) } ?? self.streamEpoch(of: channel)) == epoch else { return nil }
            return try Row.fetchAll(
                db.cachedStatement(
                    sql: """
                        SELECT position, time, publisher, body FROM channel_publications
                        WHERE channel = ? AND position > ? AND time >= ? ORDER BY position LIMIT ?
                        """
                ),
                arguments: [channel, Int64(bitPattern: offset), Self.milliseconds(notBefore), max(0, limit)]
            ).map { row in
                let body: Data = row["body"]
                return StoredPublication(
                    offset: UInt64(bitPattern: row["position"] as Int64),
                    publisher: row["publisher"],
                    body: ByteBuffer(bytes: body),
                    time: Date(timeIntervalSince1970: Double(row["time"] as Int64) / 1000)
                )
            }
        }
    }

    public func trimPublications(before time: Date) async throws -> Int {
        try await self.write { db in
            try db.execute(sql: "DELETE FROM channel_publications WHERE time < ?", arguments: [Self.milliseconds(time)])
            return db.changesCount
        }
    }

    /// A channel's stream; one without a row has the epoch it will be created with
    /// (``streamEpoch(of:)``) at offset 0, and gets its row if `creating`.
    ///
    /// Reading a channel never writes: a client subscribing to channels nobody publishes to
    /// leaves nothing in the file.
    private func stream(of channel: String, _ db: Database, creating: Bool) throws -> (epoch: UInt64, top: UInt64) {
        if let row = try Row.fetchOne(
            db.cachedStatement(sql: "SELECT epoch, top FROM channel_streams WHERE channel = ?"),
            arguments: [channel]
        ) {
            return (UInt64(bitPattern: row["epoch"] as Int64), UInt64(bitPattern: row["top"] as Int64))
        }
        let epoch = self.streamEpoch(of: channel)
        if creating {
            try db.cachedStatement(sql: "INSERT INTO channel_streams (channel, epoch, top) VALUES (?, ?, 0)")
                .execute(arguments: [channel, Int64(bitPattern: epoch)])
        }
        return (epoch, 0)
    }

    /// The epoch of a channel's stream in this store (``ChannelStreamHead/derivedEpoch(store:channel:)``):
    /// known before the stream's first publication creates its row.
    func streamEpoch(of channel: String) -> UInt64 {
        ChannelStreamHead.derivedEpoch(store: self.epoch, channel: channel)
    }

    /// A time as whole milliseconds since 1970, as the channel_publications table keeps it.
    private static func milliseconds(_ time: Date) -> Int64 { Int64((time.timeIntervalSince1970 * 1000).rounded(.down)) }
}
