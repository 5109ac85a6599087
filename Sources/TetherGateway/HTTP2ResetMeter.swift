import NIOCore
import NIOHTTP2

/// Tells when the HTTP/2 stream it sits on ends in a reset (by the client, or refused by the
/// gateway), so that the connection's address is charged a new-connection token for it: a client
/// that opens and resets streams, over one connection or by reconnecting, is paced like one that
/// opens connections.
final class HTTP2ResetMeter: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = Any

    private let reset: () -> Void

    init(reset: @escaping () -> Void) {
        self.reset = reset
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        context.fireChannelRead(data)
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        // NIOHTTP2 tells a stream's channel of a reset this way, then closes it.
        if error is NIOHTTP2Errors.StreamClosed { self.reset() }
        context.fireErrorCaught(error)
    }
}

@available(*, unavailable)
extension HTTP2ResetMeter: Sendable {}
