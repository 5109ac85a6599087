import CompressNIO
import Foundation
import NIOCore
import Testing
import TetherCompression

@testable import TetherCore

@Suite("Payload compression")
struct PayloadCompressionTests {
    /// A 1 KiB JSON document of the kind a chat or trading app sends.
    static let json: ByteBuffer = {
        var items: [String] = []
        var index = 0
        while items.joined(separator: ",").utf8.count < 1000 {
            items.append(#"{"id":\#(1000 + index),"user":"user-\#(index % 7)","text":"hello there","ts":17000000\#(index)}"#)
            index += 1
        }
        let text = "[" + items.joined(separator: ",") + "]"
        return ByteBuffer(string: String(text.prefix(1024)))
    }()

    static let compressible: [Frame.Payload] = [
        .request(.init(id: 7, method: "room.post", timeout: .seconds(5), body: json)),
        .response(.init(id: 7, status: .ok, body: json)),
        .push(.init(topic: "room.message", body: json)),
        .message(.init(id: 9, topic: "chat.send", conversation: "bob", sequence: 3, body: json)),
        .delivery(.init(sequence: 11, topic: "chat.message", body: json)),
    ]

    @Test("a 1 KiB JSON payload of each compressible type goes at least 3 times smaller, flagged COMPRESSED, and decodes to the same frame")
    func roundTrip() throws {
        let deflater = try PayloadDeflater(threshold: 512)
        let inflater = try PayloadInflater()
        for payload in Self.compressible {
            for flags: FrameFlags in [[], .checksum] {
                let frame = Frame(payload, flags: flags)
                var plain = ByteBuffer()
                try FrameEncoder().encode(frame, into: &plain)
                var compressed = ByteBuffer()
                try FrameEncoder().encode(frame, into: &compressed, deflater: deflater)
                let header = try #require(compressed.withUnsafeReadableBytes { FrameHeader.read(from: $0) })
                #expect(header.flags.contains(.compressed), "\(frame.type)")
                let ratio =
                    Double(Self.json.readableBytes)
                    / Double(Int(header.length) - (plain.readableBytes - FrameHeader.size - Self.json.readableBytes))
                #expect(ratio >= 3, "\(frame.type): the 1 KiB payload is only \(ratio) times smaller")
                var decoder = FrameDecoder(maxBodySize: 1 << 20)
                let decoded = try decoder.decodeFrame(from: &compressed, inflater: inflater)
                #expect(decoded == frame)
                #expect(compressed.readableBytes == 0)
            }
        }
    }

    @Test("short or incompressible payloads, and the types without a payload, go as they are")
    func notCompressed() throws {
        let deflater = try PayloadDeflater(threshold: 512)
        var random = ByteBuffer()
        for _ in 0..<2048 { random.writeInteger(UInt8.random(in: .min ... .max)) }
        let frames: [Frame.Payload] = [
            .push(.init(topic: "short", body: ByteBuffer(string: String(repeating: "a", count: 511)))),
            .push(.init(topic: "random", body: random)),
            .ping(.init(id: 1, data: ByteBuffer(string: String(repeating: "a", count: 2048)))),
            .error(.init(code: .protocolError, message: String(repeating: "a", count: 2048))),
        ]
        for payload in frames {
            var plain = ByteBuffer()
            try FrameEncoder().encode(Frame(payload), into: &plain)
            var encoded = ByteBuffer()
            try FrameEncoder().encode(Frame(payload), into: &encoded, deflater: deflater)
            #expect(encoded == plain, "\(payload.type)")
        }
    }

    @Test("a COMPRESSED frame without negotiated compression, or on a type without a payload, is a protocol error")
    func flagNotAllowed() throws {
        let deflater = try PayloadDeflater(threshold: 1)
        var bytes = ByteBuffer()
        try FrameEncoder().encode(Frame(.push(.init(topic: "t", body: Self.json))), into: &bytes, deflater: deflater)
        var decoder = FrameDecoder(maxBodySize: 1 << 20)
        #expect(throws: ProtocolError.self) { try decoder.decodeFrame(from: &bytes) }

        var ping = ByteBuffer()
        try FrameEncoder().encode(Frame(.ping(.init(id: 1))), into: &ping)
        ping.setInteger(FrameFlags.compressed.rawValue, at: ping.readerIndex + FrameHeader.flagsOffset)
        let error = try #require(throws: ProtocolError.self) { try decoder.decodeFrame(from: &ping, inflater: try PayloadInflater()) }
        #expect(error.code == .protocolError)
    }

    /// A raw DEFLATE stream of `gibibytes` GiB of zeros (about 1 MiB per GiB), made in 1 MiB steps.
    static func bomb(gibibytes: Int) throws -> ByteBuffer {
        let compressor = try ZlibCompressor(algorithm: .deflate, configuration: .init(compressionLevel: 9))
        let zeros = ByteBuffer(repeating: 0, count: 1 << 20)
        var output = ByteBuffer()
        for step in 0..<(gibibytes << 10) {
            var input = zeros
            output.reserveCapacity(minimumWritableBytes: compressor.maxSize(from: input))
            try compressor.deflate(from: &input, to: &output, flush: step == (gibibytes << 10) - 1 ? .finish : .no)
        }
        return output
    }

    @Test("a payload of about 1 MiB that inflates to 1 GiB is refused with frame too large once the limit is out, not after 1 GiB")
    func bomb() throws {
        let bomb = try Self.bomb(gibibytes: 1)
        #expect(bomb.readableBytes < 2 << 20, "the bomb is \(bomb.readableBytes) bytes")
        var frame = ByteBuffer()
        try FrameEncoder().encode(Frame(.message(.init(id: 1, topic: "t", conversation: "", sequence: 1, body: bomb))), into: &frame)
        frame.setInteger(FrameFlags.compressed.rawValue, at: frame.readerIndex + FrameHeader.flagsOffset)
        var decoder = FrameDecoder(maxBodySize: FrameHeader.absoluteMaximumBodySize)
        let started = ContinuousClock.now
        let error = try #require(throws: ProtocolError.self) { try decoder.decodeFrame(from: &frame, inflater: try PayloadInflater()) }
        #expect(error.code == .frameTooLarge)
        #expect(error.message.contains("inflates beyond the limit of \(FrameHeader.absoluteMaximumBodySize) bytes"), "\(error.message)")
        #expect(ContinuousClock.now - started < .seconds(2), "refused after the limit, not after inflating it all")
    }

    @Test(
        "at most 64 times: a payload that inflates more is a protocol error as soon as it does; a sender sends one that would compress more as it is"
    )
    func ratio() throws {
        let zeros = ByteBuffer(repeating: 0, count: 1 << 20)
        let compressor = try ZlibCompressor(algorithm: .deflate, configuration: .init(compressionLevel: 9))
        var input = zeros
        var compressed = ByteBuffer()
        compressed.reserveCapacity(minimumWritableBytes: compressor.maxSize(from: input))
        try compressor.deflate(from: &input, to: &compressed, flush: .finish)
        #expect(compressed.readableBytes * Compression.maximumRatio < zeros.readableBytes, "\(compressed.readableBytes) bytes")
        let inflater = try PayloadInflater()
        let error = try #require(throws: ProtocolError.self) { try inflater.inflate(compressed, limit: 16 << 20, of: .request) }
        #expect(error.code == .protocolError)
        #expect(error.message.contains("more than 64 times its size"), "\(error.message)")
        #expect(inflater.takeWork() <= compressed.readableBytes * Compression.maximumRatio + 64 * 1024, "it stopped at the ratio")

        var buffer = ByteBuffer()
        let deflater = try PayloadDeflater(threshold: 512)
        #expect(!deflater.deflate(zeros, into: &buffer), "compressing 1 MiB of zeros beats 64:1: sent as it is")
        #expect(buffer.readableBytes == 0)
        #expect(deflater.takeWork() == zeros.readableBytes, "the attempt cost zlib the payload")
        // Compressible within the ratio: compressed, and inflated back.
        var text = ""
        var generator = SplitMix64(seed: 7)
        while text.utf8.count < 64 * 1024 { text += "\(generator.next() % 1000) " }
        let json = ByteBuffer(string: text)
        #expect(deflater.deflate(json, into: &buffer))
        #expect(try inflater.inflate(buffer, limit: 1 << 20, of: .request) == json)
    }

    @Test("a truncated DEFLATE stream, or bytes after its end, are protocol errors")
    func corrupt() throws {
        let deflater = try PayloadDeflater(threshold: 1)
        let inflater = try PayloadInflater()
        var compressed = ByteBuffer()
        try #require(deflater.deflate(Self.json, into: &compressed))
        let truncated = compressed.getSlice(at: compressed.readerIndex, length: compressed.readableBytes - 4)!
        var trailing = compressed
        trailing.writeString("extra")
        for body in [truncated, trailing, ByteBuffer(string: "not deflate at all")] {
            let error = try #require(throws: ProtocolError.self) { try inflater.inflate(body, limit: 1 << 20, of: .push) }
            #expect(error.code == .protocolError, "\(error)")
        }
        // The inflater is usable again after an error.
        #expect(try inflater.inflate(compressed, limit: 1 << 20, of: .push) == Self.json)
    }

    @Test("Compression settings are validated")
    func settings() {
        #expect(throws: ConfigurationError.self) { try Compression(threshold: 0) }
        #expect(throws: ConfigurationError.self) { try Compression(level: 0) }
        #expect(throws: ConfigurationError.self) { try Compression(level: 10) }
        #expect(Compression.defaults == (try? Compression(threshold: 512, level: 6)))
    }
}

@Suite("Trace context field")
struct TraceContextFieldTests {
    static let context = TraceContext([
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "tracestate": "congo=t61rcWkgMzE",
    ])

    @Test("REQUEST and MESSAGE carry a trace context before their payload, which may be compressed after it")
    func roundTrip() throws {
        let frames: [Frame.Payload] = [
            .request(.init(id: 1, method: "m", body: PayloadCompressionTests.json, traceContext: Self.context)),
            .message(.init(id: 2, topic: "t", conversation: "c", sequence: 1, body: ByteBuffer(string: "x"), traceContext: Self.context)),
        ]
        for payload in frames {
            for deflater in [nil, try PayloadDeflater(threshold: 512)] {
                var bytes = ByteBuffer()
                try FrameEncoder().encode(Frame(payload, flags: .checksum), into: &bytes, deflater: deflater)
                let header = try #require(bytes.withUnsafeReadableBytes { FrameHeader.read(from: $0) })
                #expect(header.flags.contains(.traceContext))
                if case .request(let request) = payload { #expect(Int(header.length) <= request.bodySize) }
                var decoder = FrameDecoder(maxBodySize: 1 << 20)
                decoder.acceptsTraceContext = true
                #expect(try decoder.decodeFrame(from: &bytes, inflater: try PayloadInflater()) == Frame(payload, flags: .checksum))
            }
        }
    }

    @Test("without the negotiated feature, on another type, or malformed, a trace context is a protocol error")
    func refused() throws {
        var bytes = ByteBuffer()
        try FrameEncoder().encode(Frame(.request(.init(id: 1, method: "m", traceContext: Self.context))), into: &bytes)
        var decoder = FrameDecoder(maxBodySize: 1 << 20)
        var copy = bytes
        #expect(throws: ProtocolError.self) { try decoder.decodeFrame(from: &copy) }

        decoder.acceptsTraceContext = true
        var push = ByteBuffer()
        try FrameEncoder().encode(Frame(.push(.init(topic: "t"))), into: &push)
        push.setInteger(FrameFlags.traceContext.rawValue, at: push.readerIndex + FrameHeader.flagsOffset)
        #expect(throws: ProtocolError.self) { try decoder.decodeFrame(from: &push) }

        var tooMany = TraceContext()
        for index in 0...TraceContext.maxFields { tooMany.fields["k\(index)"] = "v" }
        #expect(throws: FrameEncodingError.self) {
            var buffer = ByteBuffer()
            try FrameEncoder().encode(Frame(.request(.init(id: 1, method: "m", traceContext: tooMany))), into: &buffer)
        }
        // A name twice: written by hand (the encoder cannot).
        var body = ByteBuffer()
        body.writeInteger(UInt32(0))
        body.writeInteger(UInt16(1))
        body.writeString("m")
        body.writeInteger(UInt8(2))
        for _ in 0..<2 {
            body.writeInteger(UInt16(11))
            body.writeString("traceparent")
            body.writeInteger(UInt16(1))
            body.writeString("x")
        }
        var frame = ByteBuffer()
        FrameHeader.write(
            version: 1,
            type: .request,
            flags: .traceContext,
            stream: 0,
            id: 1,
            length: UInt32(body.readableBytes),
            into: &frame
        )
        frame.writeBuffer(&body)
        let error = try #require(throws: ProtocolError.self) { try decoder.decodeFrame(from: &frame) }
        #expect(error.message.contains("twice"))
    }
}
