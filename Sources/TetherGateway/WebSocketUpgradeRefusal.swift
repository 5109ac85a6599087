import NIOCore
import NIOHTTP1
import TetherNIO
import TetherNIOTransports

/// Answers an HTTP request the WebSocket upgrader declined with a status that says why, then
/// closes: `404` for another path, `426` for a request that is not a WebSocket upgrade, `400`
/// without the `tether.v1` subprotocol, `403` for an origin not allowed, and the admission's
/// refusal (`503` or `429` with `Retry-After`) for an upgrade over a limit.
final class WebSocketUpgradeRefusal: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let path: String
    private let allowedOrigins: Set<String>?
    private var refusal: (head: HTTPRequestHead, refusal: HTTPRefusal)?
    /// Set by the upgrader when the admission limits refused the upgrade of the current request.
    var admissionRefusal: HTTPRefusal?

    init(path: String, allowedOrigins: Set<String>?) {
        self.path = path
        self.allowedOrigins = allowedOrigins
    }

    /// Why a request cannot become a Tether WebSocket, or `nil` if it can.
    static func refusal(
        of head: HTTPRequestHead,
        path: String,
        allowedOrigins: Set<String>?
    ) -> (status: HTTPResponseStatus, message: String)? {
        let requestPath = head.pathWithoutQuery
        guard requestPath == path else {
            return (.notFound, "no Tether endpoint at \(requestPath): WebSocket connections go to \(path)")
        }
        let upgrade = head.headers[canonicalForm: "Upgrade"].contains { $0.lowercased() == "websocket" }
        guard head.method == .GET, upgrade else {
            return (.upgradeRequired, "\(path) speaks Tether over WebSocket only: send a GET with 'Upgrade: websocket'")
        }
        // An opening handshake has no body (RFC 6455, 4.1). NIO's upgrade handler waits for a
        // body's end to upgrade, and a connection that closes first leaves that wait (and the
        // handler) behind: a peer could leak memory with each one. Refused before it waits.
        let declared = head.headers.first(name: "Content-Length").map { $0.trimmingCharacters(in: .whitespaces) != "0" } ?? false
        if declared || head.headers.contains(name: "Transfer-Encoding") {
            return (.badRequest, "a WebSocket upgrade request has no body (RFC 6455, 4.1)")
        }
        if let allowedOrigins, let origin = head.headers.first(name: "Origin"), !allowedOrigins.contains(origin) {
            return (.forbidden, "the origin \(origin) may not connect")
        }
        let protocols = head.headers[canonicalForm: "Sec-WebSocket-Protocol"]
        guard protocols.contains(where: { $0.lowercased() == WebSocketBinding.subprotocol }) else {
            return (.badRequest, "ask for the '\(WebSocketBinding.subprotocol)' subprotocol (Sec-WebSocket-Protocol)")
        }
        return nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch Self.unwrapInboundIn(data) {
        case .head(let head):
            if let refused = self.admissionRefusal {
                self.refusal = (head, refused)
            } else {
                let (status, message) =
                    Self.refusal(of: head, path: self.path, allowedOrigins: self.allowedOrigins)
                    ?? (.badRequest, "invalid WebSocket upgrade (Sec-WebSocket-Key and Sec-WebSocket-Version 13 are required)")
                self.refusal = (head, HTTPRefusal(status: status, message: message))
            }
            self.admissionRefusal = nil
        case .body:
            break
        case .end:
            guard let (head, refusal) = self.refusal else { return }
            self.refusal = nil
            var (responseHead, body) = refusal.response(version: head.version, keepAlive: false, allocator: context.channel.allocator)
            if refusal.status == .upgradeRequired {
                responseHead.headers.add(name: "Upgrade", value: "websocket")
            }
            context.write(Self.wrapOutboundOut(.head(responseHead)), promise: nil)
            context.write(Self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
            context.writeAndFlush(Self.wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
        }
    }
}
