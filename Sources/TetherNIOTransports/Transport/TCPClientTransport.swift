import NIOConcurrencyHelpers
public import NIOCore
import NIOExtras
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket
public import TetherCore
public import TetherNIO

/// The socket transport (SwiftNIO's POSIX sockets): every endpoint kind over TCP, with
/// Nagle's algorithm off.
///
/// - `tether://`: Tether frames on the TCP connection.
/// - `tethers://`: on TLS (swift-nio-ssl), ALPN `tether/1`.
/// - `ws://` and `wss://`: one frame per binary WebSocket message (NIOWebSocket), subprotocol
///   `tether.v1`, after an HTTP/1.1 upgrade on the endpoint's path.
/// - `http://` and `https://`: the HTTP stream (NIOHTTP1): frames down a streaming response,
///   up in POSTs on a second connection.
///
/// Each of them may go through an HTTP proxy (``ProxySetting``): the connection is a `CONNECT`
/// tunnel (swift-nio-extras' `NIOHTTP1ProxyConnectHandler`), and the rest runs inside it.
///
/// ```swift
/// let client = try TetherClient(configuration: config, transport: TCPClientTransport())
/// // A private CA and a pinned key:
/// var tls = ClientTLSConfiguration.defaults
/// tls.trustRoots = .only(.file("ca.pem"))
/// tls.pins = [try CertificatePin("sha256/…")]
/// let pinned = try TCPClientTransport(tls: tls)
/// ```
public struct TCPClientTransport: ClientTransport {
    /// The local IP address connections are made from; `nil` lets the system choose.
    public let sourceAddress: String?
    /// How `tethers://` and `wss://` connections are secured.
    public var tls: ClientTLSConfiguration { self.contexts.configuration }
    /// The HTTP proxy connections go through, if any.
    public let proxy: ProxySetting
    /// Whether `https://` (the HTTP stream) offers HTTP/2 before HTTP/1.1 in TLS's ALPN.
    public let offersHTTP2: Bool
    private let source: SocketAddress?
    private let contexts: ClientTLSContexts

    /// A transport that lets the system choose each connection's local address and trusts the
    /// system's certificate authorities.
    public init() {
        self.sourceAddress = nil
        self.proxy = .none
        self.offersHTTP2 = true
        self.source = nil
        self.contexts = ClientTLSContexts(configuration: .defaults)
    }

    /// A transport with TLS settings of its own, whose connections leave from `sourceAddress`.
    ///
    /// A machine can open about 28,000 connections from one address to one gateway address
    /// and port (Linux's default ephemeral port range); a load generator that needs more uses
    /// several source addresses, e.g. `127.0.0.2`, `127.0.0.3`, … on loopback.
    ///
    /// ```swift
    /// let transport = try TCPClientTransport(sourceAddress: "127.0.0.2")
    /// ```
    /// - Parameters:
    ///   - tls: Trust roots, pins, server name and client certificate for `tethers://` and
    ///     `wss://`.
    ///   - sourceAddress: An IPv4 or IPv6 address literal of this machine; `nil` lets the
    ///     system choose.
    ///   - proxy: An HTTP proxy to go through, or `.environment` to take it from `https_proxy`
    ///     and `no_proxy` as curl does; none by default.
    ///   - offersHTTP2: Whether the HTTP stream over TLS (`https://`) offers HTTP/2 (ALPN `h2`,
    ///     one connection) before HTTP/1.1 (two connections). HTTP/1.1 is faster here
    ///     (BENCHMARKS.md); HTTP/2 needs one connection through a proxy instead of two.
    /// - Throws: ``ConfigurationError`` if `sourceAddress` is not an IP address, or a
    ///   certificate or key of `tls` cannot be read.
    public init(
        tls: ClientTLSConfiguration = .defaults,
        sourceAddress: String? = nil,
        proxy: ProxySetting = .none,
        offersHTTP2: Bool = true
    ) throws(ConfigurationError) {
        self.proxy = proxy
        self.offersHTTP2 = offersHTTP2
        if let sourceAddress {
            do {
                self.source = try SocketAddress(ipAddress: sourceAddress, port: 0)
            } catch {
                throw ConfigurationError("the source address must be an IP address, got '\(sourceAddress)'")
            }
        } else {
            self.source = nil
        }
        self.sourceAddress = sourceAddress
        self.contexts = ClientTLSContexts(configuration: tls)
        if tls != .defaults {
            // Read the certificates and keys now, so that a bad file is an error here.
            _ = try self.contexts.context(alpn: [TLSApplicationProtocols.tether])
        }
    }

    public func connect(
        to endpoint: Endpoint,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel, Framing) throws -> Void
    ) async throws -> any Channel {
        try await HTTPStreamConnector.connect(to: endpoint, timeout: timeout, eventLoop: eventLoop, initializer: initializer) {
            deadline,
            install in
            try await self.open(endpoint, deadline: deadline, eventLoop: eventLoop, install: install)
        }
    }

    /// Opens a connection to `endpoint`: through the proxy, TLS, the WebSocket upgrade; then
    /// `install` adds the handlers that use it, given the ALPN protocol TLS chose.
    private func open(
        _ endpoint: Endpoint,
        deadline: NIODeadline,
        eventLoop: any EventLoop,
        install: @escaping @Sendable (any Channel, String?) throws -> Void
    ) async throws -> any Channel {
        let transport = endpoint.transport
        let sslHandler: NIOSSLClientHandler?
        if transport.isSecure {
            sslHandler = try self.contexts.makeHandler(
                for: endpoint,
                alpn: TLSApplicationProtocols.offeredList(over: transport, http2: self.offersHTTP2)
            )
        } else {
            sslHandler = nil
        }
        let proxy = try self.proxy.proxy(for: endpoint)
        let ready = eventLoop.makePromise(of: Void.self)
        let handlerBox = NIOLoopBoundBox<NIOSSLClientHandler?>.makeBoxSendingValue(sslHandler, eventLoop: eventLoop)
        var bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(max(deadline - .now(), .milliseconds(1)))
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    let configure = { @Sendable (channel: any Channel) throws in
                        try Self.configure(
                            channel,
                            endpoint: endpoint,
                            ssl: handlerBox.value,
                            deadline: deadline,
                            ready: ready,
                            install: install
                        )
                    }
                    if let proxy {
                        try Self.tunnel(channel, through: proxy, to: endpoint, deadline: deadline, ready: ready, then: configure)
                    } else {
                        try configure(channel)
                    }
                }
            }
        if let source = self.source {
            bootstrap = bootstrap.bind(to: source)
        }
        let channel: any Channel
        do {
            if let proxy {
                channel = try await bootstrap.connect(host: proxy.host, port: proxy.port).get()
            } else {
                channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
            }
        } catch {
            ready.fail(error)
            if let proxy {
                throw TransportError(code: .proxyFailed, message: "cannot reach the HTTP proxy \(proxy)", cause: error)
            }
            throw error
        }
        return try await Self.whenReady(channel, ready)
    }

    /// Asks `proxy` for a tunnel to `endpoint` (HTTP/1.1 `CONNECT`); once it is open, removes
    /// the HTTP handlers and calls `configure`, which builds the endpoint's pipeline inside it.
    /// A refusal fails `ready` with a ``TransportError`` that says what the proxy answered.
    static func tunnel(
        _ channel: any Channel,
        through proxy: HTTPProxy,
        to endpoint: Endpoint,
        deadline: NIODeadline,
        ready: EventLoopPromise<Void>,
        then configure: @escaping @Sendable (any Channel) throws -> Void
    ) throws {
        let pipeline = channel.pipeline.syncOperations
        let encoder = HTTPRequestEncoder()
        let decoder = ByteToMessageHandler(HTTPResponseDecoder(leftOverBytesStrategy: .forwardBytes))
        var headers = HTTPHeaders()
        if let authorization = proxy.authorization { headers.add(name: "Proxy-Authorization", value: authorization) }
        let tunnelled = channel.eventLoop.makePromise(of: Void.self)
        let connect = NIOHTTP1ProxyConnectHandler(
            // `CONNECT [2001:db8::1]:443`: an IPv6 literal in brackets, as in a URL's authority.
            targetHost: endpoint.uriHost,
            targetPort: endpoint.port,
            headers: headers,
            deadline: deadline,
            promise: tunnelled
        )
        try pipeline.addHandler(encoder)
        try pipeline.addHandler(decoder)
        try pipeline.addHandler(connect)
        let handlers = NIOLoopBound((encoder, decoder), eventLoop: channel.eventLoop)
        tunnelled.futureResult.assumeIsolated().whenComplete { result in
            switch result {
            case .success:
                // The response decoder also watches what is written (it pairs requests with
                // responses), and leaves only once the read that carried the proxy's answer
                // is done: build the endpoint's pipeline after it has gone.
                let pipeline = channel.pipeline.syncOperations
                let removed = channel.eventLoop.makePromise(of: Void.self)
                pipeline.removeHandler(handlers.value.0, promise: nil)
                pipeline.removeHandler(handlers.value.1, promise: removed)
                removed.futureResult.assumeIsolated().whenComplete { _ in
                    do {
                        try configure(channel)
                    } catch {
                        ready.fail(error)
                        channel.close(promise: nil)
                    }
                }
            case .failure(let error):
                ready.fail(Self.proxyError(error, proxy: proxy, endpoint: endpoint))
            }
        }
    }

    /// What a proxy's refusal means, for the app's logs.
    private static func proxyError(_ error: any Error, proxy: HTTPProxy, endpoint: Endpoint) -> TransportError {
        let target = endpoint.authority
        guard let error = error as? NIOHTTP1ProxyConnectHandler.Error else {
            return TransportError(code: .proxyFailed, message: "the HTTP proxy \(proxy) failed to open a tunnel to \(target)", cause: error)
        }
        let why: String
        if error == .proxyAuthenticationRequired() {
            why =
                proxy.credentials == nil
                ? "it requires authentication (407); give the proxy's user name and password"
                : "it refused the credentials given (407)"
        } else if error == .httpProxyHandshakeTimeout() {
            why = "no answer to CONNECT before the connect timeout"
        } else if error == .remoteConnectionClosed() {
            why = "it closed the connection"
        } else {
            why = "\(error)"
        }
        return TransportError(
            code: .proxyFailed,
            message: "the HTTP proxy \(proxy) did not open a tunnel to \(target): \(why)",
            cause: error
        )
    }

    /// Waits until `channel` carries frames (`ready` succeeded), or closes it and throws why not.
    static func whenReady(_ channel: any Channel, _ ready: EventLoopPromise<Void>) async throws -> any Channel {
        do {
            try await ready.futureResult.get()
        } catch {
            channel.close(promise: nil)
            throw error
        }
        return channel
    }

    /// Builds the pipeline for `endpoint`'s transport; `install` adds the Tether handler once
    /// the connection carries frames.
    /// - Parameter ssl: swift-nio-ssl's handler for a secure endpoint; `nil` for a plain one,
    ///   or where TLS runs below the pipeline (Network.framework).
    static func configure(
        _ channel: any Channel,
        endpoint: Endpoint,
        ssl: NIOSSLClientHandler?,
        deadline: NIODeadline,
        ready: EventLoopPromise<Void>,
        install: @escaping (any Channel, String?) throws -> Void
    ) throws {
        let pipeline = channel.pipeline.syncOperations
        if let ssl { try pipeline.addHandler(ssl) }
        guard endpoint.transport.isWebSocket || ssl != nil else {
            try install(channel, nil)
            ready.succeed()
            return
        }
        let setup = ClientConnectionSetup(endpoint: endpoint, deadline: deadline, promise: ready, tlsInPipeline: ssl != nil, ready: install)
        if endpoint.transport.isWebSocket {
            let setupBox = NIOLoopBound(setup, eventLoop: channel.eventLoop)
            let upgrader = WebSocketClientUpgrade { channel, response in
                try WebSocketBinding.addMessageHandlers(to: channel, role: .client)
                guard let context = try? channel.pipeline.syncOperations.context(handler: setupBox.value) else { return }
                setupBox.value.upgraded(response: response, context: context)
            }
            try pipeline.addHTTPClientHandlers(withClientUpgrade: (upgraders: [upgrader], completionHandler: { _ in }))
        }
        try pipeline.addHandler(setup)
    }
}

/// A client transport's NIOSSL contexts, one per ALPN protocol, made on first use (loading
/// the system's trust roots takes a while) and shared by its connections.
final class ClientTLSContexts: Sendable {
    let configuration: ClientTLSConfiguration
    private let contexts = TetherLock<[String: NIOSSLContext]>([:])

    init(configuration: ClientTLSConfiguration) {
        self.configuration = configuration
    }

    func context(alpn: [String]) throws(ConfigurationError) -> NIOSSLContext {
        let key = alpn.joined(separator: ",")
        if let context = self.contexts.withLockedValue({ $0[key] }) { return context }
        let context: NIOSSLContext
        do {
            context = try NIOSSLContext(configuration: try self.configuration.nioSSLConfiguration(alpn: alpn))
        } catch let error as ConfigurationError {
            throw error
        } catch {
            throw ConfigurationError("cannot set up TLS: \(error)")
        }
        return self.contexts.withLockedValue { contexts in
            if let existing = contexts[key] { return existing }
            contexts[key] = context
            return context
        }
    }

    /// A TLS handler for a connection to `endpoint`: SNI and name check against the endpoint's
    /// host (or ``ClientTLSConfiguration/serverName``), then the pin check.
    func makeHandler(for endpoint: Endpoint, alpn: [String]) throws -> NIOSSLClientHandler {
        let context = try self.context(alpn: alpn)
        let name = self.configuration.serverName ?? endpoint.host
        // SNI carries host names only: an IP address is checked against the certificate's
        // IP addresses instead.
        let serverName = (try? SocketAddress(ipAddress: name, port: 0)) == nil ? name : nil
        let pins = self.configuration.pins
        guard !pins.isEmpty else {
            return try NIOSSLClientHandler(context: context, serverHostname: serverName)
        }
        return try NIOSSLClientHandler._makeSSLClientHandler(context: context, serverHostname: serverName) { certificate, channel in
            let pin = try? CertificatePin(of: certificate)
            if let pin, pins.contains(pin) {
                return channel.eventLoop.makeSucceededVoidFuture()
            }
            return channel.eventLoop.makeFailedFuture(TransportError.pinMismatch(at: endpoint, presented: pin, pins: pins))
        }
    }
}
