public import NIOCore

/// One publication of a channel: what a subscriber receives, and what a history page holds.
public struct ChannelPublication: Sendable, Hashable {
    /// The channel.
    public var channel: String
    /// Its position in the channel's stream (epoch and offset; both 0 in a channel without
    /// history). Keep the last one to subscribe from it later.
    public var position: ChannelPosition
    /// The client id that published it; empty when the gateway or the backend did.
    public var publisher: String
    /// The publication's content.
    public var body: ByteBuffer

    public init(channel: String, position: ChannelPosition, publisher: String, body: ByteBuffer) {
        self.channel = channel
        self.position = position
        self.publisher = publisher
        self.body = body
    }
}

/// A page of a channel's history: the publications it still keeps after a position, or its
/// latest ones (PROTOCOL.md, section 12.1).
public struct ChannelHistoryPage: Sendable, Hashable {
    /// The channel.
    public var channel: String
    /// The stream's epoch; 0 for a channel without history (no publications, ever).
    public var epoch: UInt64
    /// The offset of the channel's last publication (0: none yet).
    public var top: UInt64
    /// Publications between the position asked after and the first of ``publications`` that
    /// the history no longer keeps.
    public var gap: ChannelGap?
    /// Whether more publications follow the last of ``publications``: ask again after it.
    public var more: Bool
    /// The publications, oldest first.
    public var publications: [ChannelPublication]

    public init(channel: String, epoch: UInt64, top: UInt64, gap: ChannelGap?, more: Bool, publications: [ChannelPublication]) {
        self.channel = channel
        self.epoch = epoch
        self.top = top
        self.gap = gap
        self.more = more
        self.publications = publications
    }
}

/// The request for a page of a channel's history: the body of a REQUEST for the reserved
/// method ``method`` (PROTOCOL.md, section 12.1).
package struct ChannelHistoryQuery: Sendable, Hashable {
    package static let method = "$channel.history"
    /// The most publications a page holds, whatever the query asks.
    package static let maxLimit = 1_000

    package var channel: String
    /// The publications after this position; `nil`: the latest ones.
    package var after: ChannelPosition?
    /// The most publications wanted, 1 to ``maxLimit``.
    package var limit: Int

    package init(channel: String, after: ChannelPosition?, limit: Int) {
        self.channel = channel
        self.after = after
        self.limit = limit
    }

    /// Why a query or a page cannot be used.
    package struct Malformed: Error, Sendable, Hashable {
        package var message: String
        init(_ message: String) { self.message = message }
    }

    /// The REQUEST body: `channel string`, `flags u8` (bit 0: `after` is given), `epoch u64`,
    /// `offset u64`, `limit u32`.
    package func encoded() throws(Malformed) -> ByteBuffer {
        var body = ByteBuffer()
        try body.writeChannelName(self.channel)
        guard (1...Self.maxLimit).contains(self.limit) else {
            throw Malformed("the limit must be 1 to \(Self.maxLimit), got \(self.limit)")
        }
        body.writeInteger(UInt8(self.after == nil ? 0 : 1))
        body.writeInteger(self.after?.epoch ?? 0)
        body.writeInteger(self.after?.offset ?? 0)
        body.writeInteger(UInt32(self.limit))
        return body
    }

    package init(decoding body: ByteBuffer) throws(Malformed) {
        var body = body
        let channel = try body.readChannelName()
        guard let flags = body.readInteger(as: UInt8.self), flags <= 1, let epoch = body.readInteger(as: UInt64.self),
            let offset = body.readInteger(as: UInt64.self), let limit = body.readInteger(as: UInt32.self)
        else { throw Malformed("the body must be channel, flags (0 or 1), epoch, offset and limit") }
        guard body.readableBytes == 0 else { throw Malformed("\(body.readableBytes) bytes follow the limit") }
        guard flags == 1 || (epoch == 0 && offset == 0) else { throw Malformed("a position without the 'after' flag") }
        guard limit >= 1 else { throw Malformed("the limit must be at least 1") }
        self.init(
            channel: channel,
            after: flags == 1 ? ChannelPosition(epoch: epoch, offset: offset) : nil,
            limit: min(Int(limit), Self.maxLimit)
        )
    }

    /// The RESPONSE body: `epoch u64`, `top u64`, `gap u8`, `more u8`, `count u32`, then each
    /// publication: `offset u64`, `publisher string`, `length u32`, its bytes.
    package static func encode(_ page: ChannelHistoryPage) -> ByteBuffer {
        var body = ByteBuffer()
        body.reserveCapacity(22 + page.publications.reduce(0) { $0 + 14 + $1.publisher.utf8.count + $1.body.readableBytes })
        body.writeInteger(page.epoch)
        body.writeInteger(page.top)
        body.writeInteger(UInt8(page.gap == nil ? 0 : 1))
        body.writeInteger(UInt8(page.more ? 1 : 0))
        body.writeInteger(UInt32(page.publications.count))
        for publication in page.publications {
            body.writeInteger(publication.position.offset)
            body.writeInteger(UInt16(publication.publisher.utf8.count))
            body.writeString(publication.publisher)
            body.writeInteger(UInt32(publication.body.readableBytes))
            body.writeImmutableBuffer(publication.body)
        }
        return body
    }

    /// Reads the RESPONSE body of this query.
    package func page(decoding body: ByteBuffer) throws(Malformed) -> ChannelHistoryPage {
        var body = body
        guard let epoch = body.readInteger(as: UInt64.self), let top = body.readInteger(as: UInt64.self),
            let gap = body.readInteger(as: UInt8.self), gap <= 1, let more = body.readInteger(as: UInt8.self), more <= 1,
            let count = body.readInteger(as: UInt32.self)
        else { throw Malformed("the page's head is truncated or malformed") }
        var publications: [ChannelPublication] = []
        publications.reserveCapacity(min(Int(count), Self.maxLimit))
        for index in 0..<Int(count) {
            guard let offset = body.readInteger(as: UInt64.self), let length = body.readInteger(as: UInt16.self),
                let publisher = body.readValidatedString(length: Int(length)), let size = body.readInteger(as: UInt32.self),
                let payload = body.readSlice(length: Int(size))
            else { throw Malformed("publication \(index + 1) of \(count) is truncated or malformed") }
            publications.append(
                ChannelPublication(
                    channel: self.channel,
                    position: ChannelPosition(epoch: epoch, offset: offset),
                    publisher: publisher,
                    body: payload
                )
            )
        }
        guard body.readableBytes == 0 else { throw Malformed("\(body.readableBytes) bytes follow the last publication") }
        var missed: ChannelGap?
        if gap == 1 {
            let resumesAt = publications.first?.position ?? ChannelPosition(epoch: epoch, offset: top + 1)
            missed = ChannelGap(after: self.after ?? ChannelPosition(epoch: 0, offset: 0), resumesAt: resumesAt)
        }
        return ChannelHistoryPage(channel: self.channel, epoch: epoch, top: top, gap: missed, more: more == 1, publications: publications)
    }
}

/// A client's publication to a channel: the body of a REQUEST for the reserved method
/// ``method`` (PROTOCOL.md, section 12.2), answered with the publication's position.
package struct ChannelPublishRequest: Sendable, Hashable {
    package static let method = "$channel.publish"

    package var channel: String
    package var body: ByteBuffer

    package init(channel: String, body: ByteBuffer) {
        self.channel = channel
        self.body = body
    }

    /// The REQUEST body: `channel string`, then the publication's bytes.
    package func encoded() throws(ChannelHistoryQuery.Malformed) -> ByteBuffer {
        var encoded = ByteBuffer()
        encoded.reserveCapacity(2 + self.channel.utf8.count + self.body.readableBytes)
        try encoded.writeChannelName(self.channel)
        encoded.writeImmutableBuffer(self.body)
        return encoded
    }

    package init(decoding body: ByteBuffer) throws(ChannelHistoryQuery.Malformed) {
        var body = body
        let channel = try body.readChannelName()
        self.init(channel: channel, body: body)
    }

    /// The RESPONSE body: `epoch u64`, `offset u64` (both 0 in a channel without history).
    package static func encode(_ position: ChannelPosition) -> ByteBuffer {
        var body = ByteBuffer()
        body.writeInteger(position.epoch)
        body.writeInteger(position.offset)
        return body
    }

    package static func position(decoding body: ByteBuffer) throws(ChannelHistoryQuery.Malformed) -> ChannelPosition {
        var body = body
        guard let epoch = body.readInteger(as: UInt64.self), let offset = body.readInteger(as: UInt64.self), body.readableBytes == 0
        else { throw ChannelHistoryQuery.Malformed("the position must be an epoch and an offset, 16 bytes") }
        return ChannelPosition(epoch: epoch, offset: offset)
    }
}

extension ByteBuffer {
    /// Writes the channel name a reserved method's body starts with (a `string`).
    mutating func writeChannelName(_ channel: String) throws(ChannelHistoryQuery.Malformed) {
        guard Frame.isValidChannelName(channel) else {
            throw ChannelHistoryQuery.Malformed("a channel name must be 1 to \(Frame.maxChannelLength) bytes long")
        }
        self.writeInteger(UInt16(channel.utf8.count))
        self.writeString(channel)
    }

    /// Reads the channel name a reserved method's body starts with.
    mutating func readChannelName() throws(ChannelHistoryQuery.Malformed) -> String {
        guard let length = self.readInteger(as: UInt16.self), let channel = self.readValidatedString(length: Int(length)),
            Frame.isValidChannelName(channel)
        else { throw ChannelHistoryQuery.Malformed("the channel must be a string of 1 to \(Frame.maxChannelLength) bytes of UTF-8") }
        return channel
    }
}
