import NIOCore
import Testing

@testable import TetherCore

@Suite("Channel presence bodies")
struct ChannelPresenceQueryTests {
    static func hex(_ text: String) -> ByteBuffer {
        let digits = Array(text.filter { !$0.isWhitespace })
        return ByteBuffer(bytes: stride(from: 0, to: digits.count, by: 2).map { UInt8(String(digits[$0...$0 + 1]), radix: 16)! })
    }

    @Test("a query and its page go through their encodings unchanged")
    func roundTrips() throws {
        let query = ChannelPresenceQuery(channel: "room.lobby", after: "alice", limit: 20)
        #expect(try ChannelPresenceQuery(decoding: query.encoded()) == query)
        let page = ChannelPresencePage(
            channel: "room.lobby",
            total: 3,
            members: [.init(clientID: "bob", connections: 2, info: #"{"name":"Bob"}"#), .init(clientID: "carol", connections: 1, info: "")]
        )
        #expect(try query.page(decoding: ChannelPresenceQuery.encode(page)) == page)
        #expect(try ChannelPresenceQuery(decoding: ChannelPresenceQuery(channel: "a", limit: 5_000).encodedCapped()).limit == 1_000)
    }

    @Test("PROTOCOL.md's vectors: a query of room.lobby from the first, 100 at most; a page of 1 member of 2")
    func vectors() throws {
        let query = ChannelPresenceQuery(channel: "room.lobby", after: "", limit: 100)
        #expect(try query.encoded() == Self.hex("000a 726f6f6d2e6c6f626279 0000 00000064"))
        let page = ChannelPresencePage(channel: "room.lobby", total: 2, members: [.init(clientID: "alice", connections: 2, info: "A")])
        let encoded = Self.hex("00000002 00000001 0005 616c696365 00000002 00000001 41")
        #expect(ChannelPresenceQuery.encode(page) == encoded)
        #expect(try query.page(decoding: encoded) == page)
    }

    @Test("malformed bodies are refused: truncated, trailing bytes, a limit of 0, members out of order or past the limit")
    func malformed() throws {
        let valid = try ChannelPresenceQuery(channel: "room.lobby", limit: 10).encoded()
        for cut in 0..<valid.readableBytes {
            #expect(throws: ChannelHistoryQuery.Malformed.self) { try ChannelPresenceQuery(decoding: valid.getSlice(at: 0, length: cut)!) }
        }
        var trailing = valid
        trailing.writeInteger(UInt8(0))
        #expect(throws: ChannelHistoryQuery.Malformed.self) { try ChannelPresenceQuery(decoding: trailing) }
        #expect(throws: ChannelHistoryQuery.Malformed.self) {
            try ChannelPresenceQuery(decoding: Self.hex("000a 726f6f6d2e6c6f626279 0000 00000000"))
        }
        #expect(throws: ChannelHistoryQuery.Malformed.self) { try ChannelPresenceQuery(channel: "", limit: 1).encoded() }

        let query = ChannelPresenceQuery(channel: "room.lobby", after: "bob", limit: 1)
        let unordered = ChannelPresenceQuery.encode(
            .init(channel: "room.lobby", total: 5, members: [.init(clientID: "alice", connections: 1, info: "")])
        )
        #expect(throws: ChannelHistoryQuery.Malformed.self) { try query.page(decoding: unordered) }
        let tooMany = ChannelPresenceQuery.encode(
            .init(
                channel: "room.lobby",
                total: 5,
                members: [.init(clientID: "carol", connections: 1, info: ""), .init(clientID: "dan", connections: 1, info: "")]
            )
        )
        #expect(throws: ChannelHistoryQuery.Malformed.self) { try query.page(decoding: tooMany) }
        // A count that promises more members than the bytes hold allocates nothing for them.
        #expect(throws: ChannelHistoryQuery.Malformed.self) {
            try ChannelPresenceQuery(channel: "room.lobby", limit: 1_000).page(decoding: Self.hex("000003e8 000003e8"))
        }
    }
}

extension ChannelPresenceQuery {
    /// The body of a query whose limit is past ``maxLimit`` (what another client could send).
    fileprivate func encodedCapped() throws -> ByteBuffer {
        var body = try ChannelPresenceQuery(channel: self.channel, after: self.after, limit: 1).encoded()
        body.moveWriterIndex(to: body.writerIndex - 4)
        body.writeInteger(UInt32(self.limit))
        return body
    }
}
