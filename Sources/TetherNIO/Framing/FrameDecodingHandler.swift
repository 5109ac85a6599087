public import NIOCore
public import TetherCore

/// Turns a byte stream into ``Frame``s, for stream transports such as TCP and TLS.
///
/// The handler accumulates bytes and runs ``FrameDecoder`` over them. Its body limit starts at
/// ``FrameHeader/handshakeMaximumBodySize`` and is raised when a ``TetherChannelEvent/limitsNegotiated(maxInboundBodySize:)``
/// event passes through the pipeline (the connection handlers send it once the handshake is done).
///
/// On the first decoding error the handler stops decoding, drops further input and fires the
/// ``ProtocolError`` down the pipeline, where the connection handler answers with ERROR and
/// closes the connection.
public final class FrameDecodingHandler: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = ByteBuffer
    public typealias InboundOut = Frame
    public typealias OutboundIn = Frame
    public typealias OutboundOut = Frame

    private var decoder: FrameDecoder
    /// Where frames go: the ``FrameReceiver`` right above, or up the pipeline.
    private var link = FrameReceiverLink()
    private var cumulation: ByteBuffer?
    private var failed = false
    private var decoding = false

    /// Creates a decoding handler.
    /// - Parameter maxBodySize: The body limit before the handshake raises it.
    public init(maxBodySize: Int = FrameHeader.handshakeMaximumBodySize) {
        self.decoder = FrameDecoder(maxBodySize: maxBodySize)
    }

    /// The body limit in force.
    public var maxBodySize: Int { self.decoder.maxBodySize }

    /// Hands the decoded frames to `receiver` by a direct call from now on, rather than as
    /// pipeline reads. Call it on the event loop, from the `handlerAdded` of the handler right
    /// above this one; errors and other events still travel through the pipeline.
    /// - Parameters:
    ///   - receiver: The handler right above this one.
    ///   - context: The receiver's context.
    public func connect(_ receiver: any FrameReceiver, context: ChannelHandlerContext) {
        self.link.connect(receiver, context: context)
    }

    /// Sends frames up the pipeline again, if `receiver` is the one connected. Call it from the
    /// receiver's `handlerRemoved`.
    public func disconnect(_ receiver: any FrameReceiver) {
        self.link.disconnect(receiver)
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        self.link.disconnect()
    }

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !self.failed else { return }
        let bytes = Self.unwrapInboundIn(data)
        if var cumulation = self.cumulation, cumulation.readableBytes > 0 {
            self.cumulation = nil  // keep the buffer uniquely referenced while appending
            var bytes = bytes
            cumulation.writeBuffer(&bytes)
            self.cumulation = cumulation
        } else {
            self.cumulation = bytes
        }
        self.decodeLoop(context: context)
    }

    public func channelReadComplete(context: ChannelHandlerContext) {
        if let cumulation = self.cumulation, cumulation.readableBytes == 0 {
            self.cumulation = nil
        } else if var cumulation = self.cumulation, cumulation.readerIndex > 4096 {
            // Give back the space of consumed frames before the next read appends to it.
            self.cumulation = nil
            cumulation.discardReadBytes()
            self.cumulation = cumulation
        }
        context.fireChannelReadComplete()
    }

    public func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        if case .limitsNegotiated(let maxInboundBodySize) = event as? TetherChannelEvent {
            self.decoder.maxBodySize = min(maxInboundBodySize, FrameHeader.absoluteMaximumBodySize)
            promise?.succeed()
        } else {
            context.triggerUserOutboundEvent(event, promise: promise)
        }
    }

    private func decodeLoop(context: ChannelHandlerContext) {
        // A frame handler may raise the limit from inside fireChannelRead; the loop re-reads it.
        guard !self.decoding else { return }
        self.decoding = true
        defer { self.decoding = false }
        while !self.failed, var buffer = self.cumulation, buffer.readableBytes > 0 {
            self.cumulation = nil
            let frame: Frame?
            do {
                frame = try self.decoder.decodeFrame(from: &buffer)
            } catch {
                self.failed = true
                self.cumulation = nil
                context.fireErrorCaught(error)
                return
            }
            self.cumulation = buffer
            guard let frame else { return }
            // A copy: the receiver may disconnect (be removed) while it handles the frame.
            let link = self.link
            link.forward(frame, from: context)
        }
    }
}

@available(*, unavailable)
extension FrameDecodingHandler: Sendable {}

/// Events Tether's connection handlers send through the pipeline to the framing handlers below them.
public enum TetherChannelEvent: Hashable, Sendable {
    /// The handshake is done: accept bodies up to this size from now on.
    case limitsNegotiated(maxInboundBodySize: Int)
}
