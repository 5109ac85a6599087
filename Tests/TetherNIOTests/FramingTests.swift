import NIOCore
import NIOEmbedded
import NIOTestUtils
import Testing

@testable import TetherCore
@testable import TetherNIO

private let frames: [Frame] = [
    Frame(.hello(.init(versions: 1...1, features: .checksum, maxBodySize: 4096, clientID: "alice")), flags: .checksum),
    Frame(.request(.init(id: 1, method: "echo", timeout: .seconds(1), body: ByteBuffer(string: "hello")))),
    Frame(.response(.init(id: 1, body: ByteBuffer(repeating: 7, count: 300))), flags: .checksum),
    Frame(.push(.init(topic: "t", body: ByteBuffer()))),
    Frame(.ping(.init(id: 9, data: ByteBuffer(string: "12345678")))),
    Frame(.goAway(.init(reason: .maintenance, retryAfter: .milliseconds(250), alternateEndpoint: nil, message: "")), flags: .checksum),
]

private func encoded(_ frames: [Frame]) throws -> ByteBuffer {
    var buffer = ByteBuffer()
    for frame in frames { try FrameEncoder().encode(frame, into: &buffer) }
    return buffer
}

@Suite("Framing handlers")
struct FramingTests {
    @Test("FrameDecoder passes NIO's ByteToMessageDecoderVerifier (byte-at-a-time, all-at-once, and everything between)")
    func decoderVerifier() throws {
        let pairs = try frames.map { frame in (try encoded([frame]), [frame]) } + [(try encoded(frames), frames)]
        try ByteToMessageDecoderVerifier.verifyDecoder(inputOutputPairs: pairs) {
            FrameDecoder(maxBodySize: 4096)
        }
    }

    @Test("FrameDecodingHandler decodes input fed one byte at a time")
    func oneByteAtATime() throws {
        let channel = EmbeddedChannel(handler: FrameDecodingHandler())
        var input = try encoded(frames)
        while let byte = input.readSlice(length: 1) {
            try channel.writeInbound(byte)
        }
        for frame in frames {
            #expect(try channel.readInbound(as: Frame.self) == frame)
        }
        #expect(try channel.readInbound(as: Frame.self) == nil)
        #expect(try channel.finish().isClean)
    }

    @Test("FrameDecodingHandler decodes many frames from one read, and frames split across reads")
    func manyFramesPerRead() throws {
        let channel = EmbeddedChannel(handler: FrameDecodingHandler())
        var input = try encoded(frames + frames)
        let first = input.readSlice(length: input.readableBytes / 2 + 3)!
        try channel.writeInbound(first)
        try channel.writeInbound(input)
        for frame in frames + frames {
            #expect(try channel.readInbound(as: Frame.self) == frame)
        }
        #expect(try channel.finish().isClean)
    }

    @Test("before the handshake the limit is 64 KiB; the negotiated event raises it")
    func limitRaisedByEvent() throws {
        let channel = EmbeddedChannel(handler: FrameDecodingHandler())
        let big = Frame(.push(.init(topic: "t", body: ByteBuffer(repeating: 1, count: 100_000))))
        #expect(throws: ProtocolError.self) { try channel.writeInbound(try encoded([big])) }

        let raised = EmbeddedChannel(handler: FrameDecodingHandler())
        raised.pipeline.triggerUserOutboundEvent(TetherChannelEvent.limitsNegotiated(maxInboundBodySize: 1 << 20), promise: nil)
        try raised.writeInbound(try encoded([big]))
        #expect(try raised.readInbound(as: Frame.self) == big)
        #expect(try raised.finish().isClean)
    }

    @Test("after an error the handler decodes nothing more, even valid frames")
    func stopsAfterError() throws {
        let channel = EmbeddedChannel(handler: FrameDecodingHandler())
        var garbage = ByteBuffer(string: "GET / HTTP/1.1\r\n\r\n")
        garbage.writeImmutableBuffer(try encoded(frames))
        #expect(throws: ProtocolError.self) { try channel.writeInbound(garbage) }
        try channel.writeInbound(try encoded(frames))
        #expect(try channel.readInbound(as: Frame.self) == nil)
        _ = try? channel.finish()
    }

    @Test("an oversized length fails before the body arrives")
    func oversizeBeforeBody() throws {
        let channel = EmbeddedChannel(handler: FrameDecodingHandler(maxBodySize: 1024))
        let header = try encoded([Frame(.push(.init(topic: "t", body: ByteBuffer(repeating: 0, count: 5000))))]).getSlice(
            at: 0,
            length: FrameHeader.size
        )!
        do {
            try channel.writeInbound(header)
            Issue.record("expected frameTooLarge")
        } catch let error as ProtocolError {
            #expect(error.code == .frameTooLarge)
        }
        _ = try? channel.finish()
    }

    @Test("the encoder handler writes the exact bytes of FrameEncoder")
    func encoderHandler() throws {
        let channel = EmbeddedChannel(handler: FrameEncodingHandler())
        for frame in frames {
            try channel.writeOutbound(frame)
            #expect(try channel.readOutbound(as: ByteBuffer.self) == (try encoded([frame])))
        }
        #expect(try channel.finish().isClean)
    }

    @Test("a frame that cannot be encoded fails its write and is reported; the next frame still goes out")
    func encoderHandlerFailure() throws {
        let errors = ErrorCollector()
        let channel = EmbeddedChannel(handlers: [FrameEncodingHandler(), errors])
        let tooLong = Frame(.push(.init(topic: String(repeating: "t", count: 70_000))))
        let promise = channel.eventLoop.makePromise(of: Void.self)
        channel.write(tooLong, promise: promise)
        channel.flush()
        #expect(throws: FrameEncodingError.self) { try promise.futureResult.wait() }
        #expect(try channel.readOutbound(as: ByteBuffer.self) == nil)
        #expect(errors.errors.count == 1 && errors.errors.first is FrameEncodingError)

        try channel.writeOutbound(frames[1])
        #expect(try channel.readOutbound(as: ByteBuffer.self) == (try encoded([frames[1]])))
        #expect(try channel.finish().isClean)
    }

    @Test("writeEncoded passes bytes through, in order with the frames written around them")
    func encoderHandlerPreEncoded() throws {
        let handler = FrameEncodingHandler()
        let channel = EmbeddedChannel(handler: handler)
        let preEncoded = try encoded([frames[3], frames[4]])
        channel.write(frames[0], promise: nil)
        handler.writeEncoded(preEncoded, promise: nil)
        channel.write(frames[1], promise: nil)
        channel.flush()
        var wire = ByteBuffer()
        while var chunk = try channel.readOutbound(as: ByteBuffer.self) { wire.writeBuffer(&chunk) }
        #expect(wire == (try encoded([frames[0], frames[3], frames[4], frames[1]])))
        #expect(try channel.finish().isClean)

        let removed = channel.eventLoop.makePromise(of: Void.self)
        handler.writeEncoded(preEncoded, promise: removed)
        #expect(throws: ChannelError.self) { try removed.futureResult.wait() }
    }
}

/// Records the errors that reach the end of a pipeline.
private final class ErrorCollector: ChannelInboundHandler {
    typealias InboundIn = Never
    private(set) var errors: [any Error] = []

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.errors.append(error)
    }
}
