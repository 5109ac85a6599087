package import NIOCore

/// A client subscribed to a channel that keeps presence: who is online there.
public struct ChannelPresenceMember: Sendable, Hashable {
    /// Its client id.
    public var clientID: String
    /// How many of its connections are subscribed (a phone and a laptop: 2).
    public var connections: Int
    /// What it shows others (a display name, an avatar's URL, JSON…): the `info` its
    /// credentials carry; empty when they carry none.
    public var info: String

    public init(clientID: String, connections: Int, info: String) {
        self.clientID = clientID
        self.connections = connections
        self.info = info
    }
}

/// Who is subscribed to a channel: a page of its members, by client id.
public struct ChannelPresencePage: Sendable, Hashable {
    public var channel: String
    /// How many members the channel has in all.
    public var total: Int
    /// Members in client id order (bytewise), after the one asked after.
    public var members: [ChannelPresenceMember]

    public init(channel: String, total: Int, members: [ChannelPresenceMember]) {
        self.channel = channel
        self.total = total
        self.members = members
    }
}

/// The request for a channel's members: the body of a REQUEST for the reserved method
/// ``method`` (PROTOCOL.md, section 12.3).
package struct ChannelPresenceQuery: Sendable, Hashable {
    package static let method = "$channel.presence"
    /// The most members a page holds, whatever the query asks.
    package static let maxLimit = 1_000

    package var channel: String
    /// The members after this client id (bytewise); empty: from the first.
    package var after: String
    /// The most members wanted, 1 to ``maxLimit``.
    package var limit: Int

    package init(channel: String, after: String = "", limit: Int = ChannelPresenceQuery.maxLimit) {
        self.channel = channel
        self.after = after
        self.limit = limit
    }

    /// The REQUEST body: `channel string`, `after string`, `limit u32`.
    package func encoded() throws(ChannelHistoryQuery.Malformed) -> ByteBuffer {
        var body = ByteBuffer()
        try body.writeChannelName(self.channel)
        guard self.after.utf8.count <= Int(UInt16.max) else {
            throw ChannelHistoryQuery.Malformed("the client id to start after is too long")
        }
        guard (1...Self.maxLimit).contains(self.limit) else {
            throw ChannelHistoryQuery.Malformed("the limit must be 1 to \(Self.maxLimit), got \(self.limit)")
        }
        body.writeInteger(UInt16(self.after.utf8.count))
        body.writeString(self.after)
        body.writeInteger(UInt32(self.limit))
        return body
    }

    package init(decoding body: ByteBuffer) throws(ChannelHistoryQuery.Malformed) {
        var body = body
        let channel = try body.readChannelName()
        guard let length = body.readInteger(as: UInt16.self), let after = body.readValidatedString(length: Int(length)),
            let limit = body.readInteger(as: UInt32.self)
        else { throw ChannelHistoryQuery.Malformed("the body must be channel, after (a client id, or empty) and limit") }
        guard body.readableBytes == 0 else { throw ChannelHistoryQuery.Malformed("\(body.readableBytes) bytes follow the limit") }
        guard limit >= 1 else { throw ChannelHistoryQuery.Malformed("the limit must be at least 1") }
        self.init(channel: channel, after: after, limit: min(Int(limit), Self.maxLimit))
    }

    /// The RESPONSE body: `total u32`, `count u32`, then each member: `client string`,
    /// `connections u32`, `info length u32` and its bytes.
    package static func encode(_ page: ChannelPresencePage) -> ByteBuffer {
        var body = ByteBuffer()
        body.reserveCapacity(8 + page.members.reduce(0) { $0 + 10 + $1.clientID.utf8.count + $1.info.utf8.count })
        body.writeInteger(UInt32(clamping: page.total))
        body.writeInteger(UInt32(page.members.count))
        for member in page.members {
            body.writeInteger(UInt16(clamping: member.clientID.utf8.count))
            body.writeString(member.clientID)
            body.writeInteger(UInt32(clamping: member.connections))
            body.writeInteger(UInt32(member.info.utf8.count))
            body.writeString(member.info)
        }
        return body
    }

    /// Reads the answer to this query.
    package func page(decoding body: ByteBuffer) throws(ChannelHistoryQuery.Malformed) -> ChannelPresencePage {
        var body = body
        guard let total = body.readInteger(as: UInt32.self), let count = body.readInteger(as: UInt32.self) else {
            throw ChannelHistoryQuery.Malformed("the page must start with total and count")
        }
        guard count <= self.limit, count <= total else {
            throw ChannelHistoryQuery.Malformed("\(count) members for a limit of \(self.limit) and a total of \(total)")
        }
        var members: [ChannelPresenceMember] = []
        members.reserveCapacity(Int(min(count, 64)))  // what was read, not what the count says
        var previous = self.after
        for _ in 0..<count {
            guard let length = body.readInteger(as: UInt16.self), let clientID = body.readValidatedString(length: Int(length)),
                !clientID.isEmpty, let connections = body.readInteger(as: UInt32.self), connections >= 1,
                let infoLength = body.readInteger(as: UInt32.self), infoLength <= body.readableBytes,
                let info = body.readValidatedString(length: Int(infoLength))
            else { throw ChannelHistoryQuery.Malformed("member \(members.count + 1) of \(count) is truncated or malformed") }
            guard previous.isEmpty || Array(previous.utf8).lexicographicallyPrecedes(Array(clientID.utf8)) else {
                throw ChannelHistoryQuery.Malformed("the members are not in client id order after '\(previous)'")
            }
            previous = clientID
            members.append(ChannelPresenceMember(clientID: clientID, connections: Int(connections), info: info))
        }
        guard body.readableBytes == 0 else { throw ChannelHistoryQuery.Malformed("\(body.readableBytes) bytes follow the members") }
        return ChannelPresencePage(channel: self.channel, total: Int(total), members: members)
    }
}
