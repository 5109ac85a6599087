import Atomics
import Foundation
import NIOCore
public import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import NIOTLS
import NIOWebSocket
import TetherCore
import TetherNIO

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

// The gateway's listeners: TCP (optionally TLS) and WebSocket (optionally TLS), and the
// WebSocket upgrader an application's own HTTP server can use.
extension Gateway {
    /// `SO_REUSEPORT`, which NIO has no name for.
    private static var reusePortOption: NIOBSDSocket.Option { NIOBSDSocket.Option(rawValue: SO_REUSEPORT) }

    /// Binds every configured listener; on a failure, closes those already bound.
    func bindListeners() async throws -> [any Channel] {
        var servers: [any Channel] = []
        do {
            if let listen = self.configuration.listen {
                servers.append(try await self.bindTCP(listen))
            }
            if let webSocket = self.configuration.webSocket {
                servers.append(try await self.bindWebSocket(webSocket))
            }
        } catch {
            for server in servers { server.close(promise: nil) }
            throw error
        }
        return servers
    }

    /// A server bootstrap with the options every listener's connections share.
    private func serverBootstrap(reusePort: Bool) -> ServerBootstrap {
        ServerBootstrap(group: self.eventLoopGroup)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .serverChannelOption(.socketOption(Self.reusePortOption), value: reusePort ? 1 : 0)
            .serverChannelOption(.backlog, value: 1024)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            // NIO keeps each connection's receive buffer at the largest size it ever had, and
            // starts at 2 KiB: a third of an idle connection's memory. Start small (a HELLO fits
            // in 128 bytes); a busy connection's buffer doubles on each full read, up to 64 KiB.
            .childChannelOption(.recvAllocator, value: AdaptiveRecvByteBufferAllocator(minimum: 64, initial: 128, maximum: 65536))
            // Fairness: one read (at most 64 KiB) per connection per turn of its event loop,
            // not NIO's default of four, so that a connection that floods the gateway gets
            // no more of its loop per turn than the others.
            .childChannelOption(.maxMessagesPerRead, value: 1)
    }

    private func bindTCP(_ listen: GatewayConfiguration.Listen) async throws -> any Channel {
        let tls = listen.tls ? self.tlsContexts?.tether : nil
        let bootstrap = self.serverBootstrap(reusePort: listen.reusePort)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let tls {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls))
                    }
                    try self.configure(channel, framing: .byteStream, transport: tls == nil ? .tcp : .tls)
                }
            }
        return try await self.bind(bootstrap, host: listen.host, port: listen.port, as: .tcp, scheme: listen.tls ? "tethers" : "tether")
    }

    private func bindWebSocket(_ settings: GatewayConfiguration.WebSocket) async throws -> any Channel {
        // With TLS and the HTTP stream, ALPN may pick HTTP/2 (the stream only; WebSocket stays on HTTP/1.1).
        let h2 = settings.tls && settings.stream?.http2 == true
        let tls = settings.tls ? (h2 ? self.tlsContexts?.httpAndH2 : self.tlsContexts?.http) : nil
        let upgradeTimeout = TimeAmount(self.configuration.timeouts.handshake)
        let bootstrap = self.serverBootstrap(reusePort: false)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    guard let stopWaiting = try self.admitHTTPConnection(channel, timeout: upgradeTimeout, tls: tls != nil) else { return }
                    guard let tls else {
                        try self.configureHTTP1(channel, settings: settings, stopWaiting: stopWaiting)
                        return
                    }
                    try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls))
                    guard h2, let stream = settings.stream else {
                        try self.configureHTTP1(channel, settings: settings, stopWaiting: stopWaiting)
                        return
                    }
                    let negotiation = ApplicationProtocolNegotiationHandler { result, channel in
                        channel.eventLoop.makeCompletedFuture {
                            if case .negotiated(TLSApplicationProtocols.http2) = result {
                                try self.configureHTTP2(channel, settings: settings, stream: stream, stopWaiting: stopWaiting)
                            } else {
                                try self.configureHTTP1(channel, settings: settings, stopWaiting: stopWaiting)
                            }
                        }
                    }
                    try channel.pipeline.syncOperations.addHandler(negotiation)
                }
            }
        let scheme = settings.tls ? "wss" : "ws"
        return try await self.bind(bootstrap, host: settings.host, port: settings.port, as: .webSocket, scheme: scheme, path: settings.path)
    }

    private func bind(
        _ bootstrap: ServerBootstrap,
        host: String,
        port: Int,
        as listener: Listener,
        scheme: String,
        path: String = ""
    ) async throws -> any Channel {
        let server: any Channel
        do {
            server = try await bootstrap.bind(host: host, port: port).get()
        } catch {
            let failure = GatewayError(code: .bindFailed, message: "cannot listen on \(host):\(port) (\(scheme)): \(error)")
            self.resolveAddress(of: listener, .failure(failure))
            throw failure
        }
        let shutDown = self.lifecycle.withLockedValue { lifecycle in
            lifecycle.serverChannels.append(server)
            return lifecycle.shuttingDown
        }
        if shutDown { server.close(promise: nil) }
        if let address = server.localAddress {
            self.logger.info("listening", metadata: ["address": "\(scheme)://\(address.ipAddress ?? host):\(address.port ?? port)\(path)"])
            self.resolveAddress(of: listener, .success(address))
        }
        return server
    }

    /// Counts a new connection of the HTTP listener among those not serving Tether yet, capped
    /// at the limit of unauthenticated connections, and closes it if it has not upgraded or
    /// opened an HTTP stream within `timeout`.
    /// - Returns: What to call once it serves Tether; `nil` if it was refused: a plain HTTP
    ///   connection is then answered `503` (by an ``HTTPRefusalHandler``, at most
    ///   ``maxRefusing`` at once), a TLS one closed.
    func admitHTTPConnection(_ channel: any Channel, timeout: TimeAmount, tls: Bool) throws -> (@Sendable () -> Void)? {
        let address = channel.remoteAddress?.ipAddress
        if self.admission.isOverRate(address, now: self.clock.now) {
            // Its new connections (or, over HTTP/2, its resets) came faster than its rate.
            let rate = self.configuration.limits.handshakesPerSecondPerAddress
            let reason = "more than \(rate) new connections (or HTTP/2 resets) per second from \(address ?? "-")"
            try self.refuse(channel, .tooManyRequests, reason, limit: "handshake_rate_per_address", retryAfter: .seconds(1), tls: tls)
            return nil
        }
        // Connections that have not upgraded yet are not Tether connections, so the admission
        // limits do not see them: cap them here, at the limit of unauthenticated connections.
        let limit = self.configuration.limits.maxUnauthenticatedConnections
        guard self.pendingUpgrades.loadThenWrappingIncrement(ordering: .relaxed) < limit else {
            self.pendingUpgrades.wrappingDecrement(ordering: .relaxed)
            let reason = "\(limit) HTTP connections are waiting to upgrade or open a stream"
            try self.refuse(channel, .serviceUnavailable, reason, limit: "unauthenticated", retryAfter: .seconds(5), tls: tls)
            return nil
        }
        // Waiting ends once: with the upgrade, or with the connection closing first.
        let pendingUpgrades = self.pendingUpgrades
        let waiting = NIOLoopBoundBox(true, eventLoop: channel.eventLoop)
        @Sendable func stopWaiting() {
            guard waiting.value else { return }
            waiting.value = false
            pendingUpgrades.wrappingDecrement(ordering: .relaxed)
        }
        channel.closeFuture.whenComplete { _ in stopWaiting() }
        channel.eventLoop.scheduleTask(in: timeout) {
            if waiting.value { channel.close(promise: nil) }
        }
        return stopWaiting
    }

    /// Connections of the HTTP listener refused at once and being answered, at most.
    static let maxRefusing = 256

    /// Refuses a new connection of the HTTP listener by `limit` (a metric label), logged.
    private func refuse(
        _ channel: any Channel,
        _ status: HTTPResponseStatus,
        _ reason: String,
        limit: String,
        retryAfter: Duration,
        tls: Bool
    ) throws {
        self.refusalLog.log(self.logger, .warning, "refusing HTTP connections", metadata: ["reason": "\(reason)"])
        self.metrics.refused(limit)
        try self.refuse(channel, HTTPRefusal(status: status, message: "\(reason); try again later", retryAfter: retryAfter), tls: tls)
    }

    /// Answers a refused plain-HTTP connection's request with `refusal` and closes it; closes a
    /// TLS connection (a handshake is not worth a refusal), and any beyond ``maxRefusing``.
    private func refuse(_ channel: any Channel, _ refusal: HTTPRefusal, tls: Bool) throws {
        guard !tls, self.refusing.loadThenWrappingIncrement(ordering: .relaxed) < Self.maxRefusing else {
            if !tls { self.refusing.wrappingDecrement(ordering: .relaxed) }
            channel.close(promise: nil)
            return
        }
        let refusing = self.refusing
        channel.closeFuture.whenComplete { _ in refusing.wrappingDecrement(ordering: .relaxed) }
        try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
        try channel.pipeline.syncOperations.addHandler(HTTPRefusalHandler(refusal, timeout: .seconds(2)))
    }

    /// How long a connection carrying POSTs may stay idle: as configured, or twice the idle
    /// timeout of Tether connections (a live client's heartbeats come more often).
    private func postIdleTimeout(of stream: GatewayConfiguration.HTTPStream) -> Duration {
        stream.postIdleTimeout ?? self.configuration.timeouts.idle * 2
    }

    /// How this node's HTTP streams reach the other nodes': a POST for a session another node
    /// holds goes to that node through `cluster`.
    static func streamForwarding(through cluster: any GatewayCluster, nodeKey: UInt64) -> HTTPStreamSessions.Forwarding {
        HTTPStreamSessions.Forwarding(nodeKey: nodeKey) { token, owner, body, proof in
            let post = ClusterStreamPost(token: token, proof: proof, body: body, nodeKey: owner, forwardedBy: nodeKey)
            return await cluster.forwardStreamPost(post).map { answer in
                .init(status: HTTPResponseStatus(statusCode: answer.status), message: answer.message)
            }
        }
    }

    /// Where the other nodes of a cluster post to this node's HTTP streams, once the HTTP
    /// listener is bound; `nil` without an HTTP stream.
    var streamURL: String? {
        guard let settings = self.configuration.webSocket, let stream = settings.stream,
            let port = self.lifecycle.withLockedValue({ try? $0.addresses[.webSocket]?.get().port })
        else { return nil }
        var host = settings.host
        if GatewayConfiguration.isWildcard(host) { host = ProcessInfo.processInfo.hostName }
        if host.contains(":") && !host.hasPrefix("[") { host = "[\(host)]" }
        return "\(settings.tls ? "https" : "http")://\(host):\(port)\(stream.path)"
    }

    /// The stream's handler for one HTTP connection (HTTP/1.1) or one HTTP/2 stream.
    /// - Parameters:
    ///   - refusal: The handler that answers other requests: it leaves once a stream opens.
    ///   - admitPosts: Admits the connection's POSTs (an HTTP/2 stream asks its connection's).
    ///   - opened: Called with the channel once a GET opened a stream on it.
    ///   - served: Called once the connection serves the stream (a GET, an admitted POST).
    private func makeStreamHandler(
        _ stream: GatewayConfiguration.HTTPStream,
        on eventLoop: any EventLoop,
        http2: Bool,
        refusal: NIOLoopBound<WebSocketUpgradeRefusal>,
        admitPosts: @escaping (any Channel) -> HTTPStreamServerHandler.Admission,
        opened: @escaping (any Channel) -> Void = { _ in },
        served: @escaping @Sendable () -> Void
    ) -> HTTPStreamServerHandler {
        HTTPStreamServerHandler(
            settings: .init(
                path: stream.path,
                maxPostBodySize: stream.maxPostBodySize,
                postIdleTimeout: TimeAmount(self.postIdleTimeout(of: stream)),
                bytesInFlightWhilePaused: http2 ? HTTPStreamBinding.gatewayStreamWindow : 0
            ),
            sessions: self.httpStreams,
            admit: { channel, purpose in
                switch purpose {
                case .posts:
                    return admitPosts(channel)
                case .stream:
                    switch self.admitHTTP(channel, kind: .tether) {
                    case .failure(let refusal):
                        return .refused(refusal)
                    case .success(let ticket):
                        return .admitted {
                            // The refusal reads HTTP requests; what follows the stream's handler reads frames.
                            channel.pipeline.syncOperations.removeHandler(refusal.value, promise: nil)
                            try self.configure(channel, framing: .byteStream, transport: .httpStream, admitted: ticket)
                            opened(channel)
                        }
                    }
                }
            },
            served: served,
            intake: self.intakeMonitors[ObjectIdentifier(eventLoop)]
        )
    }

    /// Admits the POSTs of `channel` (an HTTP/1.1 connection, or an HTTP/2 connection for all of
    /// its streams): they count as a connection until it closes.
    private func admitPosts(of channel: any Channel) -> HTTPStreamServerHandler.Admission {
        switch self.admitHTTP(channel, kind: .posts) {
        case .failure(let refusal):
            return .refused(refusal)
        case .success(let ticket):
            let admission = self.admission
            return .admitted { channel.closeFuture.whenComplete { _ in admission.left(ticket) } }
        }
    }

    /// An HTTP/1.1 pipeline that upgrades to a Tether WebSocket on `settings.path`, serves the
    /// HTTP stream on its path, and answers anything else with an HTTP error.
    func configureHTTP1(
        _ channel: any Channel,
        settings: GatewayConfiguration.WebSocket,
        stopWaiting: @escaping @Sendable () -> Void
    ) throws {
        let refusal = WebSocketUpgradeRefusal(path: settings.path, allowedOrigins: settings.allowedOrigins)
        let boundRefusal = NIOLoopBound(refusal, eventLoop: channel.eventLoop)
        let streamHandler = settings.stream.map {
            self.makeStreamHandler(
                $0,
                on: channel.eventLoop,
                http2: false,
                refusal: boundRefusal,
                admitPosts: { self.admitPosts(of: $0) },
                served: stopWaiting
            )
        }
        let boundStreamHandler = NIOLoopBound(streamHandler, eventLoop: channel.eventLoop)
        // An upgrade is admitted before the 101, so that a refusal is an HTTP answer; the ticket
        // waits here for the connection's handler, and is given back if the upgrade never happens.
        let ticket = NIOLoopBoundBox(ConnectionAdmission.Ticket?.none, eventLoop: channel.eventLoop)
        let admission = self.admission
        channel.closeFuture.whenComplete { _ in
            if let unused = ticket.value { admission.left(unused) }
        }
        let upgrader = self.makeWebSocketUpgrader(
            path: settings.path,
            allowedOrigins: settings.allowedOrigins,
            admit: { channel in
                switch self.admitHTTP(channel, kind: .tether) {
                case .success(let admitted):
                    ticket.value = admitted
                    return true
                case .failure(let refused):
                    boundRefusal.value.admissionRefusal = refused
                    return false
                }
            },
            upgraded: { channel in
                stopWaiting()
                // The HTTP handlers of this pipeline leave: what follows reads WebSocket frames.
                channel.pipeline.syncOperations.removeHandler(boundRefusal.value, promise: nil)
                if let streamHandler = boundStreamHandler.value {
                    channel.pipeline.syncOperations.removeHandler(streamHandler, promise: nil)
                }
                defer { ticket.value = nil }
                return ticket.value
            }
        )
        try channel.pipeline.syncOperations.configureHTTPServerPipeline(
            withServerUpgrade: (upgraders: [upgrader], completionHandler: { _ in }),
            withErrorHandling: true
        )
        if let streamHandler {
            try channel.pipeline.syncOperations.addHandler(streamHandler)
        }
        try channel.pipeline.syncOperations.addHandler(refusal)
    }

    /// An HTTP/2 connection (ALPN `h2`, TLS only): each stream is a request; the HTTP stream's
    /// GET becomes a Tether connection on its HTTP/2 stream, and its POSTs are other streams of
    /// the same connection. WebSocket is not spoken over HTTP/2 (`426`). The connection counts
    /// as serving Tether once a GET opened a stream on it, and closes
    /// ``GatewayConfiguration/HTTPStream/postIdleTimeout`` after its last stream ended.
    func configureHTTP2(
        _ channel: any Channel,
        settings: GatewayConfiguration.WebSocket,
        stream: GatewayConfiguration.HTTPStream,
        stopWaiting: @escaping @Sendable () -> Void
    ) throws {
        // The Tether streams open on this connection, and the close waiting for none to be.
        let open = NIOLoopBoundBox((count: 0, idleClose: Scheduled<Void>?.none), eventLoop: channel.eventLoop)
        let idleTimeout = TimeAmount(self.postIdleTimeout(of: stream))
        let opened = { (child: any Channel) in
            stopWaiting()  // a GET opened a stream: this is a Tether connection now
            open.value.count += 1
            open.value.idleClose?.cancel()
            child.closeFuture.whenComplete { _ in
                open.value.count -= 1
                guard open.value.count == 0 else { return }
                open.value.idleClose = channel.eventLoop.scheduleTask(in: idleTimeout) { channel.close(promise: nil) }
            }
        }
        let boundOpened = NIOLoopBound(opened, eventLoop: channel.eventLoop)
        // The connection's POSTs are admitted once, as one connection, at its first POST.
        let postsAdmitted = NIOLoopBoundBox(false, eventLoop: channel.eventLoop)
        let connection = channel
        let admitPosts = { (_: any Channel) -> HTTPStreamServerHandler.Admission in
            if postsAdmitted.value { return .admitted {} }
            let admission = self.admitPosts(of: connection)
            if case .admitted = admission { postsAdmitted.value = true }
            return admission
        }
        let boundAdmitPosts = NIOLoopBound(admitPosts, eventLoop: channel.eventLoop)
        // Each stream that ends in a reset costs the address a new connection's token; past its
        // rate, the connection is closed (and new ones from the address turned away).
        let charge = {
            guard !self.admission.charge(connection.remoteAddress?.ipAddress, now: self.clock.now) else { return }
            self.refusalLog.log(
                self.logger,
                .warning,
                "closing an HTTP/2 connection whose streams end in resets faster than its address's rate",
                metadata: ["remote": "\(connection.remoteAddress?.ipAddress ?? "-")"]
            )
            self.metrics.refused("http2_resets")
            connection.close(promise: nil)
        }
        let boundCharge = NIOLoopBound(charge, eventLoop: channel.eventLoop)
        _ = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
            mode: .server,
            connectionConfiguration: HTTPStreamBinding.gatewayHTTP2Connection,
            streamConfiguration: HTTPStreamBinding.gatewayHTTP2Stream,
            inboundStreamInitializer: { child in
                child.eventLoop.makeCompletedFuture {
                    let refusal = WebSocketUpgradeRefusal(path: settings.path, allowedOrigins: settings.allowedOrigins)
                    let boundRefusal = NIOLoopBound(refusal, eventLoop: child.eventLoop)
                    let pipeline = child.pipeline.syncOperations
                    try pipeline.addHandler(HTTP2ResetMeter(reset: boundCharge.value))
                    try pipeline.addHandler(HTTP2FramePayloadToHTTP1ServerCodec())
                    // Only a GET that opens a stream makes the connection a Tether connection (its
                    // POSTs come on the same connection): `opened`, not `served`.
                    try pipeline.addHandler(
                        self.makeStreamHandler(
                            stream,
                            on: child.eventLoop,
                            http2: true,
                            refusal: boundRefusal,
                            admitPosts: boundAdmitPosts.value,
                            opened: boundOpened.value,
                            served: {}
                        )
                    )
                    try pipeline.addHandler(refusal)
                }
            }
        )
    }

    /// A WebSocket upgrader for an application's own HTTP/1.1 server, so that the gateway
    /// shares its port: requests for `path` with subprotocol `tether.v1` become Tether
    /// connections of this gateway; the application's handlers serve the rest.
    ///
    /// The application's HTTP handler must leave the pipeline when the upgrade completes (the
    /// bytes that follow are WebSocket frames, which it cannot read), as in NIO's own examples:
    ///
    /// ```swift
    /// let http = NIOLoopBound(MyHTTPHandler(), eventLoop: channel.eventLoop)
    /// try channel.pipeline.syncOperations.configureHTTPServerPipeline(
    ///     withServerUpgrade: (
    ///         upgraders: [gateway.webSocketUpgrader()],
    ///         completionHandler: { context in context.pipeline.syncOperations.removeHandler(http.value, promise: nil) }
    ///     )
    /// )
    /// try channel.pipeline.syncOperations.addHandler(http.value)
    /// ```
    /// A request the upgrader declines (another path, no `tether.v1` subprotocol, an origin
    /// not allowed) goes on to the application's handler as a plain HTTP request.
    /// - Parameters:
    ///   - path: The path to upgrade on.
    ///   - allowedOrigins: The `Origin` headers accepted; `nil` accepts any.
    public func webSocketUpgrader(
        path: String = Endpoint.defaultWebSocketPath,
        allowedOrigins: Set<String>? = nil
    ) -> any HTTPServerProtocolUpgrader & Sendable {
        // The connection's handler asks the admission limits itself (a refusal: ERROR and a close).
        self.makeWebSocketUpgrader(path: path, allowedOrigins: allowedOrigins, admit: { _ in true }, upgraded: { _ in nil })
    }

    /// - Parameters:
    ///   - admit: Whether the gateway takes the connection (a request the upgrade would
    ///     accept); `false` declines the upgrade, and the request goes on to be refused.
    ///   - upgraded: Called once upgraded, before the connection's handler is added; returns
    ///     the connection's admission ticket, if it was admitted already.
    private func makeWebSocketUpgrader(
        path: String,
        allowedOrigins: Set<String>?,
        admit: @escaping @Sendable (any Channel) -> Bool,
        upgraded: @escaping @Sendable (any Channel) throws -> ConnectionAdmission.Ticket?
    ) -> NIOWebSocketServerUpgrader {
        // A WebSocket message holds one Tether frame: no larger than the largest body accepted.
        let maxMessageSize = FrameHeader.size + self.configuration.limits.maxBodySize
        return NIOWebSocketServerUpgrader(
            maxFrameSize: maxMessageSize,
            automaticErrorHandling: true,
            shouldUpgrade: { channel, head in
                guard WebSocketUpgradeRefusal.refusal(of: head, path: path, allowedOrigins: allowedOrigins) == nil, admit(channel) else {
                    return channel.eventLoop.makeSucceededFuture(nil)
                }
                var headers = HTTPHeaders()
                headers.add(name: "Sec-WebSocket-Protocol", value: WebSocketBinding.subprotocol)
                return channel.eventLoop.makeSucceededFuture(headers)
            },
            upgradePipelineHandler: { channel, _ in
                channel.eventLoop.makeCompletedFuture {
                    let ticket = try upgraded(channel)
                    try WebSocketBinding.addMessageHandlers(
                        to: channel,
                        role: .server,
                        maxMessageSize: maxMessageSize,
                        intake: self.intakeMonitors[ObjectIdentifier(channel.eventLoop)]
                    )
                    try self.configure(channel, framing: .messages, transport: .webSocket, admitted: ticket)
                }
            }
        )
    }
}

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

/// The gateway's NIOSSL contexts: one offering ALPN `tether/1` (TCP), one `http/1.1`
/// (WebSocket), one `h2` and `http/1.1` (WebSocket and the HTTP stream).
final class ServerTLSContexts: Sendable {
    let tether: NIOSSLContext
    let http: NIOSSLContext
    let httpAndH2: NIOSSLContext

    init(_ tls: GatewayConfiguration.TLS) throws(ConfigurationError) {
        do {
            self.tether = try NIOSSLContext(configuration: try tls.nioSSLConfiguration(alpn: ["tether/1"]))
            self.http = try NIOSSLContext(configuration: try tls.nioSSLConfiguration(alpn: ["http/1.1"]))
            self.httpAndH2 = try NIOSSLContext(configuration: try tls.nioSSLConfiguration(alpn: ["h2", "http/1.1"]))
        } catch let error as ConfigurationError {
            throw error
        } catch {
            throw ConfigurationError("tls: cannot set up TLS with this certificate and key: \(error)")
        }
    }
}

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
