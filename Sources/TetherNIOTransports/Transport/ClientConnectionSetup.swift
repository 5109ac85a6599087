import NIOCore
import NIOHTTP1
import NIOSSL
import NIOTLS
import NIOWebSocket
package import TetherCore
import TetherNIO

/// Brings a new client connection to the point where it carries Tether frames: waits for the
/// TLS handshake (and its pin check), performs the WebSocket upgrade, then installs the
/// Tether handler through `ready` and leaves the pipeline.
///
/// Every failure on the way (a TLS alert, an unknown certificate, a pin mismatch, an HTTP
/// status other than 101, a close, the deadline) fails `promise` with a ``TransportError``
/// and closes the channel. It sits last in the pipeline while it works.
final class ClientConnectionSetup: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias OutboundIn = Any
    typealias OutboundOut = HTTPClientRequestPart

    enum Stage {
        /// Waiting for the TLS handshake; then the WebSocket upgrade if `upgrade` is set.
        case tlsHandshake
        /// The upgrade request is sent; waiting for 101.
        case webSocketUpgrade
        case done
    }

    private let endpoint: Endpoint
    private let secure: Bool
    private let webSocket: Bool
    private let deadline: NIODeadline
    private let promise: EventLoopPromise<Void>
    private let ready: (any Channel, String?) throws -> Void
    /// The ALPN protocol the TLS handshake chose, if any.
    private var negotiated: String?
    private var stage: Stage
    private var timeout: Scheduled<Void>?

    /// - Parameters:
    ///   - endpoint: Where the connection goes (its transport says what to wait for).
    ///   - deadline: When to give up.
    ///   - promise: Succeeded once `ready` ran; failed with a ``TransportError``.
    ///   - ready: Installs the Tether handler, given the ALPN protocol TLS chose (if any); runs
    ///     on the event loop.
    ///   - tlsInPipeline: Whether TLS is a handler of this pipeline, whose handshake to wait
    ///     for (swift-nio-ssl), or done below it before the channel is active (Network.framework).
    init(
        endpoint: Endpoint,
        deadline: NIODeadline,
        promise: EventLoopPromise<Void>,
        tlsInPipeline: Bool = true,
        ready: @escaping (any Channel, String?) throws -> Void
    ) {
        self.endpoint = endpoint
        self.secure = endpoint.transport.isSecure && tlsInPipeline
        self.webSocket = endpoint.transport.isWebSocket
        self.deadline = deadline
        self.promise = promise
        self.ready = ready
        self.stage = self.secure ? .tlsHandshake : .webSocketUpgrade
    }

    func handlerAdded(context: ChannelHandlerContext) {
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        self.timeout = context.eventLoop.scheduleTask(deadline: self.deadline) {
            let (handler, context) = loopBound.value
            let what = handler.stage == .tlsHandshake ? "TLS handshake" : "WebSocket upgrade"
            handler.fail(
                TransportError(code: .timedOut, message: "the \(what) with \(handler.endpoint) did not finish in time"),
                context: context
            )
        }
        if context.channel.isActive { self.start(context: context) }
    }

    func channelActive(context: ChannelHandlerContext) {
        context.fireChannelActive()
        self.start(context: context)
    }

    private func start(context: ChannelHandlerContext) {
        if self.stage == .webSocketUpgrade { self.sendUpgradeRequest(context: context) }
    }

    func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
        if self.stage == .tlsHandshake, case .handshakeCompleted(let negotiated)? = event as? TLSUserEvent {
            // A gateway that speaks ALPN picks tether/1 or refuses; one that does not (a TLS
            // terminator) picks nothing.
            let offered = TLSApplicationProtocols.offeredList(over: self.endpoint.transport)
            self.negotiated = negotiated
            if let negotiated, !offered.contains(negotiated) {
                self.fail(
                    TransportError(
                        code: .tlsHandshakeFailed,
                        message:
                            "\(self.endpoint) chose the ALPN protocol '\(negotiated)', not \(offered.map { "'\($0)'" }.joined(separator: " or "))"
                    ),
                    context: context
                )
                return
            }
            if self.webSocket {
                self.stage = .webSocketUpgrade
                self.sendUpgradeRequest(context: context)
            } else {
                self.succeed(context: context)
            }
            return
        }
        context.fireUserInboundEventTriggered(event)
    }

    private func sendUpgradeRequest(context: ChannelHandlerContext) {
        var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: self.endpoint.path ?? Endpoint.defaultWebSocketPath)
        head.headers.add(name: "Host", value: self.endpoint.authority)
        head.headers.add(name: "Sec-WebSocket-Protocol", value: WebSocketBinding.subprotocol)
        context.write(Self.wrapOutboundOut(.head(head)), promise: nil)
        context.writeAndFlush(Self.wrapOutboundOut(.end(nil)), promise: nil)
    }

    /// The upgrade succeeded (NIOWebSocket has replaced the HTTP handlers): check the
    /// subprotocol, then hand over to the Tether handler.
    func upgraded(response: HTTPResponseHead, context: ChannelHandlerContext) {
        let protocols = response.headers[canonicalForm: "Sec-WebSocket-Protocol"]
        guard protocols.contains(where: { $0.lowercased() == WebSocketBinding.subprotocol }) else {
            self.fail(
                TransportError(
                    code: .webSocketUpgradeFailed,
                    message:
                        "\(self.endpoint) accepted the WebSocket upgrade without the '\(WebSocketBinding.subprotocol)' subprotocol: it is not a Tether gateway"
                ),
                context: context
            )
            return
        }
        self.succeed(context: context)
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        // Only the HTTP decoder delivers reads before the setup is done.
        guard self.webSocket, self.stage == .webSocketUpgrade else {
            context.fireChannelRead(data)
            return
        }
        let part = Self.unwrapInboundIn(data)
        // A response that is not 101 Switching Protocols: the upgrade was refused.
        if case .head(let head) = part {
            self.fail(
                TransportError(
                    code: .webSocketUpgradeFailed,
                    message: "\(self.endpoint) refused the WebSocket upgrade: HTTP \(head.status.code) \(head.status.reasonPhrase)"
                ),
                context: context
            )
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.fail(self.translate(error), context: context)
    }

    func channelInactive(context: ChannelHandlerContext) {
        let what = self.stage == .tlsHandshake ? "TLS handshake" : "WebSocket upgrade"
        self.fail(
            TransportError(
                code: self.stage == .tlsHandshake ? .tlsHandshakeFailed : .webSocketUpgradeFailed,
                message: "\(self.endpoint) closed the connection during the \(what)"
            ),
            context: context
        )
        context.fireChannelInactive()
    }

    private func succeed(context: ChannelHandlerContext) {
        guard self.stage != .done else { return }
        self.stage = .done
        self.timeout?.cancel()
        do {
            try self.ready(context.channel, self.negotiated)
            context.pipeline.syncOperations.removeHandler(self, promise: nil)
            self.promise.succeed()
        } catch {
            self.promise.fail(error)
            context.close(promise: nil)
        }
    }

    private func fail(_ error: TransportError, context: ChannelHandlerContext) {
        guard self.stage != .done else { return }
        self.stage = .done
        self.timeout?.cancel()
        self.promise.fail(error)
        context.close(promise: nil)
    }

    /// A TLS or HTTP error as a ``TransportError`` that says what to check.
    private func translate(_ error: any Error) -> TransportError {
        if let error = error as? TransportError { return error }
        if let error = error as? NIOSSLError {
            return TransportError(
                code: .tlsHandshakeFailed,
                message: "TLS handshake with \(self.endpoint) failed: \(TLSErrors.describe(error))",
                cause: error
            )
        }
        if let error = error as? NIOSSLExtraError {
            return TransportError(code: .tlsHandshakeFailed, message: "TLS handshake with \(self.endpoint) failed: \(error)", cause: error)
        }
        if error is NIOHTTPClientUpgradeError || error is HTTPParserError {
            return TransportError(
                code: .webSocketUpgradeFailed,
                message: "the WebSocket upgrade with \(self.endpoint) failed: \(error)",
                cause: error
            )
        }
        let code: TransportError.Code = self.stage == .tlsHandshake ? .tlsHandshakeFailed : .webSocketUpgradeFailed
        return TransportError(code: code, message: "connecting to \(self.endpoint) failed: \(error)", cause: error)
    }
}

@available(*, unavailable)
extension ClientConnectionSetup: Sendable {}

/// The ALPN protocols of the TLS bindings.
package enum TLSApplicationProtocols {
    /// Tether frames directly on TLS (`tethers://`).
    package static let tether = "tether/1"
    /// HTTP/1.1, for the WebSocket upgrade (`wss://`) and the HTTP stream (`https://`).
    package static let http1 = "http/1.1"

    /// HTTP/2, which the HTTP stream also offers over TLS (`https://`).
    package static let http2 = "h2"

    /// The protocol a client offers over `transport`: `tether/1`, or `http/1.1` for `wss://`
    /// and `https://`.
    package static func offered(over transport: Endpoint.Transport) -> String {
        transport.isHTTP ? Self.http1 : Self.tether
    }

    /// The protocols a client using swift-nio-ssl offers over `transport`, preferred first:
    /// `h2` (if `http2`) and `http/1.1` for the HTTP stream, ``offered(over:)`` otherwise.
    package static func offeredList(over transport: Endpoint.Transport, http2: Bool = true) -> [String] {
        transport == .secureHTTPStream && http2 ? [Self.http2, Self.http1] : [Self.offered(over: transport)]
    }
}

/// Readable descriptions of TLS failures.
enum TLSErrors {
    /// `certificate verify failed`, `no ALPN protocol in common`, … from a NIOSSL error.
    static func describe(_ error: NIOSSLError) -> String {
        let text = "\(error)"
        if text.contains("CERTIFICATE_VERIFY_FAILED") {
            return "the gateway's certificate is not trusted (unknown authority, expired, or for another name): \(text)"
        }
        if text.contains("NO_APPLICATION_PROTOCOL") {
            return "no ALPN protocol in common (expected '\(TLSApplicationProtocols.tether)'): \(text)"
        }
        if text.contains("WRONG_VERSION_NUMBER") {
            return "the server does not speak TLS on this port: \(text)"
        }
        return text
    }
}
