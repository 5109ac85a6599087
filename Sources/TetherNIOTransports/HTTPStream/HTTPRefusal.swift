package import NIOCore
package import NIOHTTP1
import TetherNIO

/// An HTTP request the gateway will not serve: the status, a one-line reason sent as the body,
/// and, for a limit, when to try again (`Retry-After`).
package struct HTTPRefusal: Sendable, Error {
    package var status: HTTPResponseStatus
    package var message: String
    /// Sent as `Retry-After` in whole seconds (at least one); `nil` sends none.
    package var retryAfter: Duration?

    package init(status: HTTPResponseStatus, message: String, retryAfter: Duration? = nil) {
        self.status = status
        self.message = message
        self.retryAfter = retryAfter
    }

    /// The gateway is shutting down: `503`, to try again (elsewhere) after `retryAfter`.
    package static func shuttingDown(retryAfter: Duration) -> HTTPRefusal {
        HTTPRefusal(status: .serviceUnavailable, message: "the gateway is shutting down; try again later", retryAfter: retryAfter)
    }

    /// The response's head and body.
    /// - Parameters:
    ///   - version: The request's HTTP version.
    ///   - keepAlive: Whether the connection stays open after it (else `Connection: close`).
    ///   - allocator: Where the body's buffer comes from.
    package func response(
        version: HTTPVersion,
        keepAlive: Bool,
        allocator: ByteBufferAllocator
    ) -> (head: HTTPResponseHead, body: ByteBuffer) {
        var body = allocator.buffer(capacity: self.message.utf8.count + 1)
        body.writeString(self.message + "\n")
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        headers.add(name: "Content-Length", value: "\(body.readableBytes)")
        headers.add(name: "Cache-Control", value: "no-store")
        if let retryAfter = self.retryAfter {
            headers.add(name: "Retry-After", value: "\(Self.wholeSeconds(retryAfter))")
        }
        if !keepAlive, version.major == 1 { headers.add(name: "Connection", value: "close") }
        return (HTTPResponseHead(version: version, status: self.status, headers: headers), body)
    }

    /// `duration` rounded up to whole seconds, at least one.
    static func wholeSeconds(_ duration: Duration) -> Int64 {
        let (seconds, attoseconds) = duration.components
        return max(1, seconds + (attoseconds > 0 ? 1 : 0))
    }
}

/// Answers every request of a connection the gateway refused with one status (a limit's `503`
/// or `429`), then closes it; closes it anyway after `timeout` without a request.
///
/// It sits after NIOHTTP1's server handlers, in place of the listener's own, for connections
/// accepted over a limit: they get an answer that says why, not a silent close.
package final class HTTPRefusalHandler: ChannelInboundHandler {
    package typealias InboundIn = HTTPServerRequestPart
    package typealias OutboundOut = HTTPServerResponsePart

    private let refusal: HTTPRefusal
    private let timeout: TimeAmount
    private var timer: Scheduled<Void>?
    private var head: HTTPRequestHead?
    private var answered = false

    package init(_ refusal: HTTPRefusal, timeout: TimeAmount) {
        self.refusal = refusal
        self.timeout = timeout
    }

    package func handlerAdded(context: ChannelHandlerContext) {
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
        self.timer = context.eventLoop.scheduleTask(in: self.timeout) { loopBound.value.close(promise: nil) }
    }

    package func handlerRemoved(context: ChannelHandlerContext) {
        self.timer?.cancel()
    }

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch Self.unwrapInboundIn(data) {
        case .head(let head):
            self.head = head
        case .body:
            break
        case .end:
            guard let head = self.head, !self.answered else { return }
            self.answered = true
            let (responseHead, body) = self.refusal.response(version: head.version, keepAlive: false, allocator: context.channel.allocator)
            context.write(Self.wrapOutboundOut(.head(responseHead)), promise: nil)
            context.write(Self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
            context.writeAndFlush(Self.wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in
                context.close(promise: nil)
            }
        }
    }

    package func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}

@available(*, unavailable)
extension HTTPRefusalHandler: Sendable {}
