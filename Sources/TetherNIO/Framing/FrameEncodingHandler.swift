public import NIOCore
public import TetherCore

/// Encodes outbound ``Frame``s into bytes, and lets the handlers above it write frames that are
/// already encoded.
///
/// A frame that cannot be encoded (a field over its size limit) fails its write promise and is
/// reported through `errorCaught`; nothing of it reaches the wire, and later frames still go out.
///
/// ``writeEncoded(_:promise:)`` is how one encoding serves many connections: the gateway encodes
/// a push to a room once and hands the same bytes to the encoder of every member.
///
/// ```swift
/// let encoder = try channel.pipeline.syncOperations.handler(type: FrameEncodingHandler.self)
/// encoder.writeEncoded(bytes, promise: nil)
/// ```
public final class FrameEncodingHandler: ChannelOutboundHandler, RemovableChannelHandler {
    public typealias OutboundIn = Frame
    public typealias OutboundOut = ByteBuffer

    private let encoder = FrameEncoder()
    private var context: ChannelHandlerContext?
    private var allocator = ByteBufferAllocator()

    public init() {}

    public func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.allocator = context.channel.allocator
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
    }

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let frame = Self.unwrapOutboundIn(data)
        do {
            let bytes = try self.encoder.encode(frame, allocator: self.allocator)
            context.write(Self.wrapOutboundOut(bytes), promise: promise)
        } catch {
            promise?.fail(error)
            context.fireErrorCaught(error)
        }
    }

    /// Writes bytes that hold whole encoded frames, as ``FrameEncoder`` makes them, as they are.
    ///
    /// Call it on the channel's event loop. The bytes queue behind the frames written before
    /// them; flush as for any write. Handlers between the caller and this handler do not see
    /// them: the bytes enter the pipeline here.
    /// - Parameters:
    ///   - bytes: One or more complete frames. They are not checked.
    ///   - promise: Completed when the bytes were written, or failed if the handler is no longer
    ///     in a pipeline.
    public func writeEncoded(_ bytes: ByteBuffer, promise: EventLoopPromise<Void>?) {
        guard let context = self.context else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        context.write(Self.wrapOutboundOut(bytes), promise: promise)
    }
}

@available(*, unavailable)
extension FrameEncodingHandler: Sendable {}
