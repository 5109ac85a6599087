import Foundation
import NIOCore
import Testing
import TetherCompression

@testable import TetherCore

@Suite("Frame codec")
struct FrameCodecTests {
    @Test("every frame type round-trips, with and without a checksum", arguments: SampleFrames.all.map(\.name))
    func roundTrip(name: String) throws {
        let frame = SampleFrames.all.first { $0.name == name }!.frame
        for flags: FrameFlags in [[], [.checksum]] {
            var original = frame
            original.flags = flags
            var buffer = try SampleFrames.encode(original)
            var decoder = FrameDecoder(maxBodySize: 1 << 20)
            let decoded = try decoder.decodeFrame(from: &buffer)
            #expect(decoded == original)
            #expect(buffer.readableBytes == 0)
        }
    }

    @Test("channel frames round-trip: from the top or from a position, refused with a gap, with and without history")
    func channelFrames() throws {
        let position = ChannelPosition(epoch: 9, offset: 3)
        let frames: [Frame.Payload] = [
            .subscribe(.init(id: 1, channel: "news", recoverFrom: nil, presenceEvents: true)),
            .subscribe(.init(id: 2, channel: "news", recoverFrom: ChannelPosition(epoch: 9, offset: 0))),
            .subscribe(.init(id: 3, channel: "ünïcödé", recoverFrom: position, presenceEvents: true)),
            .subscribed(.init(id: 3, epoch: 9, startingAfter: 40, gap: true)),
            .subscribed(.init(id: 4, status: .permissionDenied, message: "not yours")),
            .publication(.init(channel: "news", position: position, publisher: "", body: ByteBuffer(repeating: 7, count: 300))),
            .publication(.init(channel: "news", body: ByteBuffer(string: "no history"))),
            .unsubscribe(.init(channel: "news")),
            .presence(.init(channel: "news", kind: .joined, clientID: "alice", info: "")),
            .presence(.init(channel: "news", kind: .joined, clientID: "ä", info: String(repeating: "i", count: 70_000))),
            .presence(.init(channel: "news", kind: .left, clientID: "alice")),
        ]
        for payload in frames {
            var buffer = try SampleFrames.encode(Frame(payload, flags: .checksum))
            var decoder = FrameDecoder(maxBodySize: 1 << 20)
            #expect(try decoder.decodeFrame(from: &buffer) == Frame(payload, flags: .checksum))
            #expect(buffer.readableBytes == 0)
        }
        // Refused by the encoder, appending nothing: a channel too long or empty, a position
        // with an epoch and no offset.
        for payload: Frame.Payload in [
            .subscribe(.init(id: 1, channel: String(repeating: "c", count: Frame.maxChannelLength + 1))),
            .unsubscribe(.init(channel: "")),
            .publication(.init(channel: "news", position: ChannelPosition(epoch: 9, offset: 0))),
            .presence(.init(channel: "news", kind: .joined, clientID: "")),
            .presence(.init(channel: "news", kind: .left, clientID: "alice", info: "a leaver shows nothing")),
        ] {
            var buffer = ByteBuffer(string: "keep")
            #expect(throws: FrameEncodingError.self) { try FrameEncoder().encode(Frame(payload), into: &buffer) }
            #expect(buffer == ByteBuffer(string: "keep"))
        }
    }

    @Test("a publication's payload is compressed like a push's and inflated on the way in")
    func publicationCompressed() throws {
        let body = ByteBuffer(string: String(repeating: "{\"text\":\"hello\"}", count: 40))
        let frame = Frame(.publication(.init(channel: "news", position: ChannelPosition(epoch: 1, offset: 1), body: body)))
        var buffer = ByteBuffer()
        try FrameEncoder().encode(frame, into: &buffer, deflater: PayloadDeflater(threshold: 64))
        #expect(buffer.readableBytes < body.readableBytes)
        var decoder = FrameDecoder(maxBodySize: 1 << 20)
        #expect(try decoder.decodeFrame(from: &buffer, inflater: PayloadInflater()) == frame)
    }

    @Test("bodySize of REQUEST, RESPONSE and PUSH is the length of the body the encoder writes")
    func bodySizes() throws {
        var checked: Set<FrameType> = []
        for (name, frame) in SampleFrames.all {
            let bodySize: Int
            switch frame.payload {
            case .request(let request): bodySize = request.bodySize
            case .response(let response): bodySize = response.bodySize
            case .push(let push): bodySize = push.bodySize
            default: continue
            }
            let encoded = try SampleFrames.encode(frame)
            #expect(bodySize == encoded.readableBytes - FrameHeader.size, "sample '\(name)'")
            checked.insert(frame.type)
        }
        #expect(checked == [.request, .response, .push], "the samples hold every one of the three types")
    }

    @Test("PROTOCOL.md's test vectors match the codec in both directions")
    func protocolVectors() throws {
        let vectors = try ProtocolDocument.vectors()
        for (name, frame) in SampleFrames.all + SampleFrames.negotiated {
            let encoded = try SampleFrames.encode(frame)
            guard let hex = vectors[name] else {
                Issue.record("PROTOCOL.md has no vector '\(name)'; the codec produces:\n\(ProtocolDocument.format(encoded))")
                continue
            }
            #expect(encoded.hexDump == hex, "vector '\(name)' differs; the codec produces:\n\(ProtocolDocument.format(encoded))")
            var buffer = ByteBuffer(hex: hex)
            var decoder = FrameDecoder(maxBodySize: 1 << 20)
            decoder.acceptsTraceContext = true  // negotiated, as for request-traced
            let decoded = try decoder.decodeFrame(from: &buffer, inflater: try PayloadInflater())
            #expect(decoded == SampleFrames.decoded[name] ?? frame, "vector '\(name)' does not decode to the sample frame")
        }
        #expect(
            Set(vectors.keys) == Set((SampleFrames.all + SampleFrames.negotiated).map(\.name)),
            "PROTOCOL.md lists vectors no test checks"
        )
    }

    @Test("a partial frame yields nothing until its last byte arrives")
    func partialFrames() throws {
        let encoded = try SampleFrames.encode(SampleFrames.all[0].frame)
        var decoder = FrameDecoder(maxBodySize: 1 << 20)
        for length in 0..<encoded.readableBytes {
            var prefix = encoded.getSlice(at: 0, length: length)!
            #expect(try decoder.decodeFrame(from: &prefix) == nil)
            #expect(prefix.readerIndex == 0, "a partial frame must not be consumed")
        }
    }

    @Test("many frames in one buffer decode in order")
    func manyFrames() throws {
        var buffer = ByteBuffer()
        for (_, frame) in SampleFrames.all { try FrameEncoder().encode(frame, into: &buffer) }
        var decoder = FrameDecoder(maxBodySize: 1 << 20)
        var decoded: [Frame] = []
        while let frame = try decoder.decodeFrame(from: &buffer) { decoded.append(frame) }
        #expect(decoded == SampleFrames.all.map(\.frame))
    }

    @Test("bad magic is rejected as soon as two bytes arrive")
    func badMagic() {
        var buffer = ByteBuffer(bytes: [0x47, 0x45])  // "GE", as in "GET / HTTP/1.1"
        var decoder = FrameDecoder(maxBodySize: 1024)
        #expect(throws: ProtocolError.self) { try decoder.decodeFrame(from: &buffer) }
        #expect(Self.code { try decoder.decodeFrame(from: &buffer) } == .badMagic)
    }

    @Test("an oversized length is rejected from the header alone, before any body byte")
    func oversizedLength() throws {
        var header = ByteBuffer()
        FrameHeader.write(type: .request, id: 1, length: UInt32.max, into: &header)  // claims 4 GiB
        var decoder = FrameDecoder(maxBodySize: 1024)
        #expect(Self.code { try decoder.decodeFrame(from: &header) } == .frameTooLarge)
    }

    @Test("a flipped bit fails the checksum")
    func checksumMismatch() throws {
        var buffer = try SampleFrames.encode(
            Frame(.request(.init(id: 1, method: "echo", body: ByteBuffer(string: "payload"))), flags: .checksum)
        )
        let last = buffer.writerIndex - 1
        buffer.setInteger(buffer.getInteger(at: last, as: UInt8.self)! ^ 0x01, at: last)
        var decoder = FrameDecoder(maxBodySize: 1024)
        #expect(Self.code { try decoder.decodeFrame(from: &buffer) } == .checksumMismatch)
    }

    @Test(
        "header corruption is rejected",
        arguments: [
            (2, UInt8(2), StatusCode.unsupportedVersion),  // version
            (3, UInt8(0x42), StatusCode.unknownFrameType),  // type outside extension range
            (4, UInt8(0x80), StatusCode.protocolError),  // reserved flag bit
            (25, UInt8(0x01), StatusCode.protocolError),  // checksum without flag
        ]
    )
    func headerCorruption(offset: Int, value: UInt8, expected: StatusCode) throws {
        var buffer = try SampleFrames.encode(Frame(.ping(.init(id: 1))))
        buffer.setInteger(value, at: offset)
        var decoder = FrameDecoder(maxBodySize: 1024)
        #expect(Self.code { try decoder.decodeFrame(from: &buffer) } == expected)
    }

    @Test("unknown extension frames (0x80-0xFF) are passed through for the receiver to ignore")
    func extensionFrames() throws {
        let frame = Frame(.extension(.init(type: FrameType(rawValue: 0x90), id: 3, body: ByteBuffer(string: "x"))))
        var buffer = try SampleFrames.encode(frame)
        var decoder = FrameDecoder(maxBodySize: 1024)
        #expect(try decoder.decodeFrame(from: &buffer) == frame)
    }

    @Test("strings are checked as UTF-8: ASCII and valid multi-byte text decode as sent; invalid bytes are refused")
    func stringValidation() throws {
        let encoder = FrameEncoder()
        for method in ["echo", "caf\u{E9}.order", "\u{65E5}\u{672C}", "\u{1F600}", String(repeating: "a", count: 300) + "\u{E9}"] {
            var buffer = ByteBuffer()
            try encoder.encode(Frame(.request(.init(id: 1, method: method))), into: &buffer)
            var decoder = FrameDecoder(maxBodySize: 1 << 16)
            #expect(try decoder.decodeFrame(from: &buffer)?.payload == .request(.init(id: 1, method: method)))
        }
        let invalid: [[UInt8]] = [
            [0xC3, 0x28],  // bad continuation byte
            [0xE6, 0x97],  // truncated sequence
            [0xC0, 0xAF],  // overlong "/"
            [0xED, 0xA0, 0x80],  // a UTF-16 surrogate
            [0x61, 0x62, 0xFF],  // never valid, after ASCII
        ]
        for bytes in invalid {
            var buffer = ByteBuffer()
            FrameHeader.write(type: .request, id: 1, length: UInt32(6 + bytes.count), into: &buffer)
            buffer.writeInteger(UInt32(0))
            buffer.writeInteger(UInt16(bytes.count))
            buffer.writeBytes(bytes)
            var decoder = FrameDecoder(maxBodySize: 1 << 16)
            #expect(throws: ProtocolError.self, "\(bytes)") { try decoder.decodeFrame(from: &buffer) }
        }
    }

    @Test("malformed bodies are protocol errors")
    func malformedBodies() throws {
        func frame(type: FrameType, body: [UInt8]) -> ByteBuffer {
            var buffer = ByteBuffer()
            FrameHeader.write(type: type, id: 1, length: UInt32(body.count), into: &buffer)
            buffer.writeBytes(body)
            return buffer
        }
        let cases: [(FrameType, [UInt8])] = [
            (.request, [0, 0, 0, 0, 0, 9, 0x61]),  // method length 9, one byte present
            (.request, [0, 0, 0, 0, 0, 2, 0xC3, 0x28]),  // invalid UTF-8 method
            (.response, [0]),  // truncated status
            (.push, [0]),  // truncated topic length
            (.cancel, [1]),  // CANCEL has no body
            (.goAway, [0, 0, 0, 0, 0, 1]),  // alternate endpoint missing
            (.error, [0, 100, 0, 0, 9]),  // trailing byte
            (.hello, [2, 1, 0, 0, 0, 0, 0, 0, 4, 0]),  // version range 2...1
            (.hello, [1, 1, 0, 0, 0, 0, 0, 0, 4, 0, 0, 1, 0, 1, 0x61, 0, 1, 0, 1, 0x62]),  // client id twice
            (.welcome, [1, 0, 0, 0, 0]),  // truncated
            (.message, [0, 0, 0, 0, 0, 1, 0x74, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),  // sequence 0
            (.messageAck, [0, 0]),  // no entries
            (.messageAck, [0, 1, 0, 0, 0, 0, 0, 0, 0, 1]),  // truncated status
            (.deliveryAck, [0]),  // DELIVERY_ACK has no body
            (.hello, [1, 1, 0, 0, 0, 2, 0, 0, 4, 0, 0, 4, 0, 2, 0, 1]),  // resume of 2 bytes
            (.subscribe, [0, 0, 0] + [UInt8](repeating: 0, count: 16)),  // empty channel
            (.subscribe, [0, 1, 0x61, 0x04] + [UInt8](repeating: 0, count: 16)),  // a reserved flag
            (.subscribe, [0, 1, 0x61, 0] + [UInt8](repeating: 0, count: 15) + [1]),  // a position without `recover`
            (.subscribe, [0, 1, 0x61, 1] + [UInt8](repeating: 0, count: 15)),  // truncated offset
            (.subscribe, [1, 0] + [UInt8](repeating: 0x61, count: 256) + [0] + [UInt8](repeating: 0, count: 16)),  // channel of 256 bytes
            (.subscribed, [0, 0, 0, 0] + [UInt8](repeating: 0, count: 16) + [2]),  // gap neither 0 nor 1
            (.subscribed, [0, 0, 0, 0] + [UInt8](repeating: 0, count: 16) + [0, 0]),  // trailing byte
            (.publication, [0, 1, 0x61] + [UInt8](repeating: 0, count: 15) + [5, 0, 0]),  // an offset without an epoch
            (.publication, [0, 1, 0x61, 0, 0, 0, 0, 0, 0, 0, 7] + [UInt8](repeating: 0, count: 8) + [0, 0]),  // an epoch without an offset
            (.unsubscribe, [0, 1, 0x61, 0, 0, 0, 0, 9]),  // trailing byte
            (.presence, [0, 1, 0x61, 3, 0, 1, 0x62, 0, 0, 0, 0]),  // kind neither 1 nor 2
            (.presence, [0, 1, 0x61, 1, 0, 0, 0, 0, 0, 0]),  // empty client id
            (.presence, [0, 1, 0x61, 2, 0, 1, 0x62, 0, 0, 0, 1, 0x41]),  // a leaver with info
            (.presence, [0, 1, 0x61, 1, 0, 1, 0x62, 0, 0, 0, 2, 0x41]),  // info truncated
            (.presence, [0, 1, 0x61, 1, 0, 1, 0x62, 0, 0, 0, 1, 0xff]),  // info not UTF-8
            (.presence, [0, 1, 0x61, 1, 0, 1, 0x62, 0, 0, 0, 0, 0]),  // trailing byte
            (.presence, [0, 1, 0x61, 1, 0, 1, 0x62, 0, 0]),  // info length truncated
        ]
        for (type, body) in cases {
            var buffer = frame(type: type, body: body)
            var decoder = FrameDecoder(maxBodySize: 1024)
            #expect(Self.code { try decoder.decodeFrame(from: &buffer) } == .protocolError, "\(type) \(body)")
        }
    }

    @Test("the encoder refuses fields longer than their length prefix allows, and appends nothing")
    func encoderLimits() {
        var buffer = ByteBuffer(string: "keep")
        let frame = Frame(.push(.init(topic: String(repeating: "t", count: 70_000))))
        #expect(throws: FrameEncodingError.self) { try FrameEncoder().encode(frame, into: &buffer) }
        #expect(buffer == ByteBuffer(string: "keep"))
    }

    @Test("a request without a timeout encodes zero and decodes as nil")
    func requestWithoutTimeout() throws {
        let frame = Frame(.request(.init(id: 1, method: "m", timeout: nil)))
        var buffer = try SampleFrames.encode(frame)
        #expect(buffer.getInteger(at: FrameHeader.size, as: UInt32.self) == 0)
        var decoder = FrameDecoder(maxBodySize: 1024)
        #expect(try decoder.decodeFrame(from: &buffer) == frame)
    }

    @Test("an expired MESSAGE carries the EXPIRED flag; the flag is refused on any other frame")
    func expiredFlag() throws {
        let tombstone = Frame(.message(.init(id: 5, topic: "t", conversation: "c", sequence: 2, expired: true)), flags: .checksum)
        var buffer = try SampleFrames.encode(tombstone)
        #expect(buffer.getInteger(at: 4, as: UInt16.self) == 0x0003)
        var decoder = FrameDecoder(maxBodySize: 1024)
        let decoded = try decoder.decodeFrame(from: &buffer)
        #expect(decoded == tombstone)
        #expect(decoded?.flags == .checksum, "EXPIRED lives in the payload, not in Frame.flags")

        var ping = try SampleFrames.encode(Frame(.ping(.init(id: 1))))
        ping.setInteger(UInt16(0x0002), at: 4)
        var other = FrameDecoder(maxBodySize: 1024)
        #expect(Self.code { try other.decodeFrame(from: &ping) } == .protocolError)
    }

    @Test(
        "a DELIVERY after deliveries acknowledged elsewhere carries ACKED_ELSEWHERE; a decoder takes it only once shared deliveries were negotiated, and only on DELIVERY"
    )
    func ackedElsewhereFlag() throws {
        let delivery = Frame(
            .delivery(.init(sequence: 9, topic: "t", body: ByteBuffer(string: "x"), afterAcknowledged: true)),
            flags: .checksum
        )
        var buffer = try SampleFrames.encode(delivery)
        #expect(buffer.getInteger(at: 4, as: UInt16.self) == 0x0011)
        var unaware = FrameDecoder(maxBodySize: 1024)
        var copy = buffer
        #expect(Self.code { try unaware.decodeFrame(from: &copy) } == .protocolError, "not negotiated: a reserved bit")
        var decoder = FrameDecoder(maxBodySize: 1024)
        decoder.acceptsSharedDeliveries = true
        let decoded = try decoder.decodeFrame(from: &buffer)
        #expect(decoded == delivery)
        #expect(decoded?.flags == .checksum, "ACKED_ELSEWHERE lives in the payload, not in Frame.flags")

        var push = try SampleFrames.encode(Frame(.push(.init(topic: "t", body: ByteBuffer(string: "x")))))
        push.setInteger(UInt16(0x0010), at: 4)
        #expect(Self.code { try decoder.decodeFrame(from: &push) } == .protocolError, "on DELIVERY only")
    }

    @Test("request timeouts are rounded up to whole milliseconds, never down to 'no limit'")
    func timeoutRounding() throws {
        for (timeout, expected) in [(Duration.microseconds(1), UInt32(1)), (.microseconds(1500), 2), (.milliseconds(200), 200)] {
            let buffer = try SampleFrames.encode(Frame(.request(.init(id: 1, method: "m", timeout: timeout))))
            #expect(buffer.getInteger(at: FrameHeader.size, as: UInt32.self) == expected, "\(timeout)")
        }
    }

    static func code(_ body: () throws -> Frame?) -> StatusCode? {
        do {
            _ = try body()
            return nil
        } catch let error as ProtocolError {
            return error.code
        } catch {
            return nil
        }
    }
}

/// Reads the test vectors out of PROTOCOL.md: a line `vector: NAME` followed by a fenced block of hex.
enum ProtocolDocument {
    static func vectors() throws -> [String: String] {
        let url = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("PROTOCOL.md")
        let text = try String(contentsOf: url, encoding: .utf8)
        var vectors: [String: String] = [:]
        var name: String?
        var hex: String?
        for line in text.split(separator: "\n", omittingEmptySubsequences: false) {
            if let current = name, hex != nil {
                if line.hasPrefix("```") {
                    vectors[current] = hex
                    name = nil
                    hex = nil
                } else {
                    hex! += line.filter { $0.isHexDigit }.lowercased()
                }
            } else if line.hasPrefix("vector: ") {
                name = String(line.dropFirst("vector: ".count)).trimmingCharacters(in: .whitespaces)
            } else if name != nil, line.hasPrefix("```") {
                hex = ""
            }
        }
        return vectors
    }

    /// Formats a frame's bytes as in PROTOCOL.md: the header's fields on one line, the body below.
    static func format(_ buffer: ByteBuffer) -> String {
        let hex = buffer.hexDump
        let widths = [4, 2, 2, 4, 8, 16, 8, 8]
        var fields: [String] = []
        var index = hex.startIndex
        for width in widths {
            let end = hex.index(index, offsetBy: width)
            fields.append(String(hex[index..<end]))
            index = end
        }
        var lines = [fields.joined(separator: " ")]
        var body = Substring(hex[index...])
        while !body.isEmpty {
            let chunk = body.prefix(32)
            lines.append(
                stride(from: 0, to: chunk.count, by: 2).map { offset -> String in
                    let start = chunk.index(chunk.startIndex, offsetBy: offset)
                    return String(chunk[start..<chunk.index(start, offsetBy: 2)])
                }.joined(separator: " ")
            )
            body = body.dropFirst(32)
        }
        return lines.joined(separator: "\n")
    }
}
