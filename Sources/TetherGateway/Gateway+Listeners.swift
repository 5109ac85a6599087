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
import TetherNIOTransports

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
    func makeWebSocketUpgrader(
        path: String,
        allowedOrigins: Set<String>?,
        admit: @escaping @Sendable (any Channel) -> Bool,
        upgraded: @escaping @Sendable (any Channel) throws -> ConnectionAdmission.Ticket?
    ) -> WebSocketServerUpgrade {
        // A WebSocket message holds one Tether frame: no larger than the largest body accepted.
        let maxMessageSize = FrameHeader.size + self.configuration.limits.maxBodySize
        return WebSocketServerUpgrade(
            shouldUpgrade: { channel, head in
                guard WebSocketUpgradeRefusal.refusal(of: head, path: path, allowedOrigins: allowedOrigins) == nil, admit(channel) else {
                    return channel.eventLoop.makeSucceededFuture(nil)
                }
                var headers = HTTPHeaders()
                headers.add(name: "Sec-WebSocket-Protocol", value: WebSocketBinding.subprotocol)
                return channel.eventLoop.makeSucceededFuture(headers)
            },
            upgraded: { channel, _ in
                let ticket = try upgraded(channel)
                try WebSocketBinding.addMessageHandlers(
                    to: channel,
                    role: .server,
                    maxMessageSize: maxMessageSize,
                    intake: self.intakeMonitors[ObjectIdentifier(channel.eventLoop)]
                )
                try self.configure(channel, framing: .messages, transport: .webSocket, admitted: ticket)
            }
        )
    }
}
