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

    @Test("a connected receiver gets the decoded frames by a direct call; disconnected, or removed mid-read, they go up the pipeline")
    func receiverLink() throws {
        let decoder = FrameDecodingHandler()
        let receiver = RecordingReceiver()
        let channel = EmbeddedChannel(handlers: [decoder, receiver])
        // Connected in its handlerAdded: every frame of one read comes by the direct call.
        try channel.writeInbound(try encoded(frames))
        #expect(receiver.received == frames)
        #expect(receiver.readsThroughPipeline == 0)

        // A receiver that leaves the pipeline while it handles a frame: the rest of the read
        // goes up the pipeline, past it.
        receiver.received = []
        receiver.removeAfter = 2
        try channel.writeInbound(try encoded(frames))
        #expect(receiver.received == Array(frames.prefix(2)))
        for frame in frames.dropFirst(2) {
            #expect(try channel.readInbound(as: Frame.self) == frame)
        }
        #expect(try channel.readInbound(as: Frame.self) == nil)
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

    @Test("frames written between two flushes leave as one buffer; each write's promise completes with it")
    func encoderJoinsUntilFlush() throws {
        let recorder = WriteRecorder()
        let handler = FrameEncodingHandler()
        let channel = EmbeddedChannel(handlers: [recorder, handler])
        let promises = (0..<3).map { _ in channel.eventLoop.makePromise(of: Void.self) }
        channel.write(frames[1], promise: promises[0])
        handler.write(frames[2], promise: nil)  // the direct entry joins the same buffer, in order
        channel.write(frames[3], promise: promises[1])
        handler.write(frames[4], promise: promises[2])
        #expect(recorder.events.isEmpty, "nothing passed down before the flush")
        channel.flush()
        #expect(recorder.events == [.write(try encoded(Array(frames[1...4])).readableBytes), .flush], "one write")
        #expect(try channel.readOutbound(as: ByteBuffer.self) == (try encoded(Array(frames[1...4]))))
        for promise in promises { try promise.futureResult.wait() }

        // Not flushed, then closed: handed down before the close, as an unflushed write.
        recorder.events.removeAll()
        channel.write(frames[0], promise: nil)
        channel.close(promise: nil)
        #expect(recorder.events.first == .write(try encoded([frames[0]]).readableBytes))
        #expect(recorder.events.contains(.close))
        _ = try? channel.finish()
    }

    @Test("a frame that cannot be encoded leaves the joined frames around it intact")
    func encoderJoinSurvivesFailure() throws {
        let channel = EmbeddedChannel(handlers: [FrameEncodingHandler(), ErrorCollector()])
        let failed = channel.eventLoop.makePromise(of: Void.self)
        channel.write(frames[1], promise: nil)
        channel.write(Frame(.push(.init(topic: String(repeating: "t", count: 70_000)))), promise: failed)
        channel.write(frames[2], promise: nil)
        channel.flush()
        #expect(throws: FrameEncodingError.self) { try failed.futureResult.wait() }
        #expect(try channel.readOutbound(as: ByteBuffer.self) == (try encoded([frames[1], frames[2]])))
        #expect(try channel.finish().isClean)
    }

    @Test("joined frames past maxJoinedBytes are passed down without waiting for the flush")
    func encoderPassesLargeBatches() throws {
        let recorder = WriteRecorder()
        let channel = EmbeddedChannel(handlers: [recorder, FrameEncodingHandler()])
        let big = Frame(.push(.init(topic: "t", body: ByteBuffer(repeating: 1, count: 20_000))))
        for _ in 0..<4 { channel.write(big, promise: nil) }
        #expect(recorder.events == [.write(80_000 + 4 * (try encoded([big]).readableBytes - 20_000))])
        channel.write(frames[1], promise: nil)
        channel.flush()
        #expect(recorder.events.count == 3 && recorder.events.last == .flush)
        var wire = ByteBuffer()
        while var chunk = try channel.readOutbound(as: ByteBuffer.self) { wire.writeBuffer(&chunk) }
        #expect(wire == (try encoded([big, big, big, big, frames[1]])))
        #expect(try channel.finish().isClean)
    }
}

/// Records what the handler above it passes down: writes (their byte counts), flushes, closes.
private final class WriteRecorder: ChannelOutboundHandler {
    typealias OutboundIn = ByteBuffer

    enum Event: Equatable {
        case write(Int)
        case flush
        case close
    }

    var events: [Event] = []

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        self.events.append(.write(Self.unwrapOutboundIn(data).readableBytes))
        context.write(data, promise: promise)
    }

    func flush(context: ChannelHandlerContext) {
        self.events.append(.flush)
        context.flush()
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        self.events.append(.close)
        context.close(mode: mode, promise: promise)
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

/// A handler that takes frames from the decoder below it by the direct call, counts the frames
/// that came as pipeline reads instead, and can remove itself after a number of frames.
private final class RecordingReceiver: ChannelInboundHandler, RemovableChannelHandler, FrameReceiver {
    typealias InboundIn = Frame
    typealias InboundOut = Frame

    var received: [Frame] = []
    var readsThroughPipeline = 0
    var removeAfter: Int?
    private var decoder: FrameDecodingHandler?

    func handlerAdded(context: ChannelHandlerContext) {
        self.decoder = try? context.pipeline.syncOperations.handler(type: FrameDecodingHandler.self)
        self.decoder?.connect(self, context: context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.decoder?.disconnect(self)
        self.decoder = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.readsThroughPipeline += 1
        context.fireChannelRead(data)
    }

    func receive(_ frame: Frame, context: ChannelHandlerContext) {
        self.received.append(frame)
        if let removeAfter, self.received.count == removeAfter {
            context.pipeline.syncOperations.removeHandler(context: context, promise: nil)
        }
    }
}

@available(*, unavailable)
extension RecordingReceiver: Sendable {}
