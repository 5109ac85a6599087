import Foundation
import NIOCore
import Testing

@testable import TetherCore

@Suite("Channel history query")
struct ChannelHistoryQueryTests {
    @Test("a query and its page go through their encodings unchanged; a gap is rebuilt from the position asked after")
    func roundTrip() throws {
        let query = ChannelHistoryQuery(channel: "room.lobby", after: ChannelPosition(epoch: 9, offset: 4), limit: 20)
        #expect(try ChannelHistoryQuery(decoding: query.encoded()) == query)
        let latest = ChannelHistoryQuery(channel: "é", after: nil, limit: 1)
        #expect(try ChannelHistoryQuery(decoding: latest.encoded()) == latest)

        let publications = (7...8).map {
            ChannelPublication(
                channel: "room.lobby",
                position: ChannelPosition(epoch: 9, offset: UInt64($0)),
                publisher: $0 == 7 ? "alice" : "",
                body: ByteBuffer(string: "m\($0)")
            )
        }
        let gap = ChannelGap(after: ChannelPosition(epoch: 9, offset: 4), resumesAt: ChannelPosition(epoch: 9, offset: 7))
        let page = ChannelHistoryPage(channel: "room.lobby", epoch: 9, top: 12, gap: gap, more: true, publications: publications)
        let decoded = try query.page(decoding: ChannelHistoryQuery.encode(page))
        #expect(decoded == page && decoded.gap?.missed == 2)
    }

    @Test(
        "malformed queries and pages are refused with a message: bad flags, a position without its flag, truncation, trailing bytes, limits, UTF-8"
    )
    func malformed() throws {
        func query(_ build: (inout ByteBuffer) -> Void) -> ByteBuffer {
            var body = ByteBuffer()
            build(&body)
            return body
        }
        func head(_ body: inout ByteBuffer, channel: [UInt8] = Array("news".utf8), flags: UInt8 = 0, epoch: UInt64 = 0, offset: UInt64 = 0)
        {
            body.writeInteger(UInt16(channel.count))
            body.writeBytes(channel)
            body.writeInteger(flags)
            body.writeInteger(epoch)
            body.writeInteger(offset)
        }
        let bad: [ByteBuffer] = [
            query {
                head(&$0, flags: 2); $0.writeInteger(UInt32(5))
            },
            query {
                head(&$0, epoch: 3); $0.writeInteger(UInt32(5))
            },
            query {
                head(&$0); $0.writeInteger(UInt32(0))
            },
            query {
                head(&$0); $0.writeInteger(UInt16(5))
            },
            query {
                head(&$0); $0.writeInteger(UInt32(5)); $0.writeInteger(UInt8(0))
            },
            query {
                head(&$0, channel: []); $0.writeInteger(UInt32(5))
            },
            query {
                head(&$0, channel: [0xFF, 0xFE]); $0.writeInteger(UInt32(5))
            },
        ]
        for body in bad {
            #expect(throws: ChannelHistoryQuery.Malformed.self) { try ChannelHistoryQuery(decoding: body) }
        }
        #expect(
            try ChannelHistoryQuery(
                decoding: query {
                    head(&$0); $0.writeInteger(UInt32.max)
                }
            ).limit == ChannelHistoryQuery.maxLimit
        )
        #expect(throws: ChannelHistoryQuery.Malformed.self) {
            try ChannelHistoryQuery(channel: "news", after: nil, limit: 0).encoded()
        }

        let query = ChannelHistoryQuery(channel: "news", after: nil, limit: 5)
        var truncated = ChannelHistoryQuery.encode(
            ChannelHistoryPage(
                channel: "news",
                epoch: 1,
                top: 1,
                gap: nil,
                more: false,
                publications: [.init(channel: "news", position: .init(epoch: 1, offset: 1), publisher: "", body: ByteBuffer(string: "x"))]
            )
        )
        truncated.moveWriterIndex(to: truncated.writerIndex - 1)
        #expect(throws: ChannelHistoryQuery.Malformed.self) { try query.page(decoding: truncated) }
        var wrongGap = ByteBuffer()
        wrongGap.writeInteger(UInt64(1))
        wrongGap.writeInteger(UInt64(1))
        wrongGap.writeInteger(UInt8(2))
        wrongGap.writeInteger(UInt8(0))
        wrongGap.writeInteger(UInt32(0))
        #expect(throws: ChannelHistoryQuery.Malformed.self) { try query.page(decoding: wrongGap) }
    }

    @Test("random and mutated bodies: the decoders refuse or accept without crashing, and what they accept encodes back to the same bytes")
    func randomBodies() throws {
        var generator = SystemRandomNumberGenerator()
        let seed = UInt64.random(in: 0...UInt64.max, using: &generator)
        var random = SplitMix64(seed: seed)
        let valid = try ChannelHistoryQuery(channel: "room.lobby", after: ChannelPosition(epoch: 3, offset: 9), limit: 7).encoded()
        let page = ChannelHistoryQuery.encode(
            ChannelHistoryPage(
                channel: "room.lobby",
                epoch: 3,
                top: 11,
                gap: nil,
                more: false,
                publications: [
                    .init(channel: "room.lobby", position: .init(epoch: 3, offset: 10), publisher: "bob", body: ByteBuffer(string: "hi"))
                ]
            )
        )
        let query = ChannelHistoryQuery(channel: "room.lobby", after: nil, limit: 5)
        for _ in 0..<20_000 {
            for base in [valid, page] {
                var bytes = Array(base.readableBytesView)
                switch Int.random(in: 0..<3, using: &random) {
                case 0: bytes = (0..<Int.random(in: 0..<48, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) }
                case 1:
                    if !bytes.isEmpty { bytes[Int.random(in: 0..<bytes.count, using: &random)] = UInt8.random(in: 0...255, using: &random) }
                default: bytes = Array(bytes.prefix(Int.random(in: 0...bytes.count, using: &random)))
                }
                let body = ByteBuffer(bytes: bytes)
                if let decoded = try? ChannelHistoryQuery(decoding: body), decoded.limit <= ChannelHistoryQuery.maxLimit,
                    let encoded = try? decoded.encoded()
                {
                    #expect(try ChannelHistoryQuery(decoding: encoded) == decoded, "seed \(seed)")
                }
                if let decoded = try? query.page(decoding: body), decoded.gap == nil {
                    #expect(ChannelHistoryQuery.encode(decoded) == body, "seed \(seed)")
                }
            }
        }
    }

    /// FuzzTesting/Corpus/ChannelBodies: the fuzz target's seeds, and any input that once failed it.
    static var corpus: [URL] {
        let directory = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("FuzzTesting/Corpus/ChannelBodies")
        let files = (try? FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)) ?? []
        return files.sorted { $0.lastPathComponent < $1.lastPathComponent }
    }

    @Test("the fuzz corpus of the channel bodies replays as the fuzz target checks it: what decodes encodes back the same")
    func corpusReplay() throws {
        #expect(Self.corpus.count >= 5)
        for file in Self.corpus {
            let body = ByteBuffer(bytes: try Data(contentsOf: file))
            if let query = try? ChannelHistoryQuery(decoding: body) {
                #expect(try ChannelHistoryQuery(decoding: query.encoded()) == query, "\(file.lastPathComponent)")
            }
            if let publish = try? ChannelPublishRequest(decoding: body) {
                #expect(try ChannelPublishRequest(decoding: publish.encoded()) == publish, "\(file.lastPathComponent)")
            }
            if let position = try? ChannelPublishRequest.position(decoding: body) {
                #expect(try ChannelPublishRequest.position(decoding: ChannelPublishRequest.encode(position)) == position)
            }
            let query = ChannelHistoryQuery(channel: "room.lobby", after: nil, limit: ChannelHistoryQuery.maxLimit)
            if let page = try? query.page(decoding: body) {
                #expect(try query.page(decoding: ChannelHistoryQuery.encode(page)) == page, "\(file.lastPathComponent)")
            }
            if let presence = try? ChannelPresenceQuery(decoding: body) {
                #expect(try ChannelPresenceQuery(decoding: presence.encoded()) == presence, "\(file.lastPathComponent)")
            }
            let members = ChannelPresenceQuery(channel: "room.lobby")
            if let page = try? members.page(decoding: body) {
                #expect(try members.page(decoding: ChannelPresenceQuery.encode(page)) == page, "\(file.lastPathComponent)")
            }
        }
    }

    @Test("PROTOCOL.md's vector of a history page is what the encoder writes")
    func protocolVector() throws {
        let protocolURL = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().deletingLastPathComponent().appendingPathComponent("PROTOCOL.md")
        let text = try String(contentsOf: protocolURL, encoding: .utf8)
        let start = try #require(text.range(of: "Vector: the page of epoch"))
        let open = try #require(text.range(of: "(hex) `", range: start.upperBound..<text.endIndex))
        let close = try #require(text.range(of: "`", range: open.upperBound..<text.endIndex))
        let hex = text[open.upperBound..<close.lowerBound].filter(\.isHexDigit)
        let page = ChannelHistoryPage(
            channel: "news",
            epoch: 9,
            top: 12,
            gap: nil,
            more: true,
            publications: [.init(channel: "news", position: .init(epoch: 9, offset: 7), publisher: "alice", body: ByteBuffer(string: "m7"))]
        )
        let encoded = ChannelHistoryQuery.encode(page).readableBytesView.map { String(format: "%02x", $0) }.joined()
        #expect(encoded == String(hex))
    }

    @Test("a publication request goes through its encoding unchanged; a bad channel is refused; the answer is 16 bytes")
    func publishRequest() throws {
        let request = ChannelPublishRequest(channel: "room.lobby", body: ByteBuffer(string: "hi"))
        #expect(try ChannelPublishRequest(decoding: request.encoded()) == request)
        let empty = ChannelPublishRequest(channel: "é", body: ByteBuffer())
        #expect(try ChannelPublishRequest(decoding: empty.encoded()) == empty)
        for bad: [UInt8] in [[], [0], [0, 0], [0, 3, 0x61], [0, 2, 0xFF, 0xFE, 1]] {
            #expect(throws: ChannelHistoryQuery.Malformed.self) { try ChannelPublishRequest(decoding: ByteBuffer(bytes: bad)) }
        }
        #expect(throws: ChannelHistoryQuery.Malformed.self) { try ChannelPublishRequest(channel: "", body: ByteBuffer()).encoded() }
        let position = ChannelPosition(epoch: 7, offset: 42)
        #expect(try ChannelPublishRequest.position(decoding: ChannelPublishRequest.encode(position)) == position)
        var long = ChannelPublishRequest.encode(position)
        long.writeInteger(UInt8(0))
        #expect(throws: ChannelHistoryQuery.Malformed.self) { try ChannelPublishRequest.position(decoding: long) }
    }
}
