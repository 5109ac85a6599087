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
            context.fireChannelRead(Self.wrapInboundOut(frame))
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
