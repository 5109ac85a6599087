public import NIOCore
public import TetherCore

/// Encodes outbound ``Frame``s into bytes, joins the frames written between two flushes into
/// one buffer, and lets the handlers above it write frames that are already encoded.
///
/// Frames are encoded into a buffer of this handler's own and passed down on the next flush (or
/// close), so the responses to a batch of requests leave as one buffer rather than one each: one
/// allocation and one `iovec` per flush instead of per frame. A write that fills the buffer past
/// ``maxJoinedBytes`` passes it down at once, without flushing, so that the channel's
/// writability still follows what was written.
///
/// A frame that cannot be encoded (a field over its size limit) fails its write promise and is
/// reported through `errorCaught`; nothing of it reaches the wire, and later frames still go out.
///
/// ``writeEncoded(_:promise:)`` is how one encoding serves many connections: the gateway encodes
/// a push to a room once and hands the same bytes to the encoder of every member.
/// ``write(_:promise:)`` is the same entry as a pipeline write, for the handler right above this
/// one, without wrapping the frame in `NIOAny`.
///
/// ```swift
/// let encoder = try channel.pipeline.syncOperations.handler(type: FrameEncodingHandler.self)
/// encoder.writeEncoded(bytes, promise: nil)
/// ```
public final class FrameEncodingHandler: ChannelOutboundHandler, RemovableChannelHandler {
    public typealias OutboundIn = Frame
    public typealias OutboundOut = ByteBuffer

    /// How many encoded bytes may wait for a flush; past this, they are passed down at once.
    public static let maxJoinedBytes = 64 * 1024

    private let encoder = FrameEncoder()
    private var context: ChannelHandlerContext?
    private var allocator = ByteBufferAllocator()
    /// Frames encoded since the last pass down. Empty and without storage between batches, so
    /// that an idle connection holds no buffer.
    private var joined = ByteBuffer()
    /// Completed when `joined` is written: the promise of its first write that had one; the
    /// promises of later writes are cascaded from it.
    private var joinedPromise: EventLoopPromise<Void>?

    public init() {}

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.allocator = context.channel.allocator
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        // Removed with frames never flushed (the pipeline is torn down): as NIO does with
        // unflushed writes, fail them.
        self.joined = ByteBuffer()
        self.joinedPromise?.fail(ChannelError.ioOnClosedChannel)
        self.joinedPromise = nil
    }

    public func removeHandler(context: ChannelHandlerContext, removalToken: ChannelHandlerContext.RemovalToken) {
        // What was written before the removal goes on down, unflushed as it was.
        self.passJoined(context: context)
        context.leavePipeline(removalToken: removalToken)
    }

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        self.append(Self.unwrapOutboundIn(data), context: context, promise: promise)
    }

    public func flush(context: ChannelHandlerContext) {
        self.passJoined(context: context)
        context.flush()
    }

    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        // Written before the close: handed to the channel, which treats it as any unflushed write.
        self.passJoined(context: context)
        context.close(mode: mode, promise: promise)
    }

    /// Writes a frame, as a pipeline write of it into this handler would.
    ///
    /// Call it on the channel's event loop, from the handler right above this one: handlers in
    /// between do not see the frame. Flush as for any write.
    /// - Parameters:
    ///   - frame: The frame to encode.
    ///   - promise: Completed when the frame was written; failed if it cannot be encoded, or if
    ///     the handler is no longer in a pipeline.
    public func write(_ frame: Frame, promise: EventLoopPromise<Void>?) {
        guard let context = self.context else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        self.append(frame, context: context, promise: promise)
    }

    /// Writes bytes that hold whole encoded frames, as ``FrameEncoder`` makes them, as they are.
    ///
    /// Call it on the channel's event loop. The bytes queue behind the frames written before
    /// them; flush as for any write. Handlers between the caller and this handler do not see
    /// them: the bytes enter the pipeline here. They are not copied: the same buffer may be
    /// handed to many connections.
    /// - Parameters:
    ///   - bytes: One or more complete frames. They are not checked.
    ///   - promise: Completed when the bytes were written, or failed if the handler is no longer
    ///     in a pipeline.
    public func writeEncoded(_ bytes: ByteBuffer, promise: EventLoopPromise<Void>?) {
        guard let context = self.context else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        self.passJoined(context: context)
        context.write(Self.wrapOutboundOut(bytes), promise: promise)
    }

    // MARK: Joining

    private func append(_ frame: Frame, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        if self.joined.readableBytes == 0 {
            // A new batch: a buffer of its own, big enough for a few small frames.
            self.joined = self.allocator.buffer(capacity: 512)
        }
        do {
            try self.encoder.encode(frame, into: &self.joined)
        } catch {
            promise?.fail(error)
            context.fireErrorCaught(error)
            return
        }
        if let promise {
            if let joinedPromise = self.joinedPromise {
                joinedPromise.futureResult.cascade(to: promise)
            } else {
                self.joinedPromise = promise
            }
        }
        if self.joined.readableBytes >= Self.maxJoinedBytes {
            self.passJoined(context: context)
        }
    }

    /// Passes the joined frames down, unflushed.
    private func passJoined(context: ChannelHandlerContext) {
        guard self.joined.readableBytes > 0 else { return }
        let bytes = self.joined
        let promise = self.joinedPromise
        self.joined = ByteBuffer()
        self.joinedPromise = nil
        context.write(Self.wrapOutboundOut(bytes), promise: promise)
    }
}

@available(*, unavailable)
extension FrameEncodingHandler: Sendable {}

extension ChannelHandlerContext {
    /// Writes a frame from a handler whose outbound type is ``Frame``: to `encoder` directly, if
    /// the handler found Tether's encoder right below it, else down the pipeline.
    ///
    /// Call it on the event loop, from the handler this context belongs to.
    public func write(_ frame: Frame, through encoder: FrameEncodingHandler?, promise: EventLoopPromise<Void>?) {
        if let encoder {
            encoder.write(frame, promise: promise)
        } else {
            self.write(NIOAny(frame), promise: promise)
        }
    }
}
