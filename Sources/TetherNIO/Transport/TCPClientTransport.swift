import NIOConcurrencyHelpers
public import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket
public import TetherCore

/// The socket transport (SwiftNIO's POSIX sockets): every endpoint kind over TCP, with
/// Nagle's algorithm off.
///
/// - `tether://`: Tether frames on the TCP connection.
/// - `tethers://`: on TLS (swift-nio-ssl), ALPN `tether/1`.
/// - `ws://` and `wss://`: one frame per binary WebSocket message (NIOWebSocket), subprotocol
///   `tether.v1`, after an HTTP/1.1 upgrade on the endpoint's path.
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
    private let source: SocketAddress?
    private let contexts: ClientTLSContexts

    /// A transport that lets the system choose each connection's local address and trusts the
    /// system's certificate authorities.
    public init() {
        self.sourceAddress = nil
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
    /// - Throws: ``ConfigurationError`` if `sourceAddress` is not an IP address, or a
    ///   certificate or key of `tls` cannot be read.
    public init(tls: ClientTLSConfiguration = .defaults, sourceAddress: String? = nil) throws(ConfigurationError) {
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
            _ = try self.contexts.context(alpn: TLSApplicationProtocols.tether)
        }
    }

    public func connect(
        to endpoint: Endpoint,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel, Framing) throws -> Void
    ) async throws -> any Channel {
        let deadline = NIODeadline.now() + TimeAmount(timeout)
        let transport = endpoint.transport
        let framing = transport.framing
        let sslHandler: NIOSSLClientHandler?
        if transport.isSecure {
            sslHandler = try self.contexts.makeHandler(
                for: endpoint,
                alpn: TLSApplicationProtocols.offered(over: transport)
            )
        } else {
            sslHandler = nil
        }
        let ready = eventLoop.makePromise(of: Void.self)
        let handlerBox = NIOLoopBoundBox<NIOSSLClientHandler?>.makeBoxSendingValue(sslHandler, eventLoop: eventLoop)
        var bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(TimeAmount(timeout))
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try Self.configure(channel, endpoint: endpoint, ssl: handlerBox.value, deadline: deadline, ready: ready) {
                        try initializer($0, framing)
                    }
                }
            }
        if let source = self.source {
            bootstrap = bootstrap.bind(to: source)
        }
        let channel: any Channel
        do {
            channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
        } catch {
            ready.fail(error)
            throw error
        }
        return try await Self.whenReady(channel, ready)
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
        install: @escaping (any Channel) throws -> Void
    ) throws {
        let pipeline = channel.pipeline.syncOperations
        if let ssl { try pipeline.addHandler(ssl) }
        guard endpoint.transport.isWebSocket || ssl != nil else {
            try install(channel)
            ready.succeed()
            return
        }
        let setup = ClientConnectionSetup(endpoint: endpoint, deadline: deadline, promise: ready, tlsInPipeline: ssl != nil, ready: install)
        if endpoint.transport.isWebSocket {
            let setupBox = NIOLoopBound(setup, eventLoop: channel.eventLoop)
            let upgrader = NIOWebSocketClientUpgrader(
                maxFrameSize: WebSocketBinding.maxFrameSize,
                automaticErrorHandling: true
            ) { channel, response in
                channel.eventLoop.makeCompletedFuture {
                    try WebSocketBinding.addMessageHandlers(to: channel, role: .client)
                    guard let context = try? channel.pipeline.syncOperations.context(handler: setupBox.value) else { return }
                    setupBox.value.upgraded(response: response, context: context)
                }
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
    private let contexts = NIOLockedValueBox<[String: NIOSSLContext]>([:])

    init(configuration: ClientTLSConfiguration) {
        self.configuration = configuration
    }

    func context(alpn: String) throws(ConfigurationError) -> NIOSSLContext {
        if let context = self.contexts.withLockedValue({ $0[alpn] }) { return context }
        let context: NIOSSLContext
        do {
            context = try NIOSSLContext(configuration: try self.configuration.nioSSLConfiguration(alpn: [alpn]))
        } catch let error as ConfigurationError {
            throw error
        } catch {
            throw ConfigurationError("cannot set up TLS: \(error)")
        }
        return self.contexts.withLockedValue { contexts in
            if let existing = contexts[alpn] { return existing }
            contexts[alpn] = context
            return context
        }
    }

    /// A TLS handler for a connection to `endpoint`: SNI and name check against the endpoint's
    /// host (or ``ClientTLSConfiguration/serverName``), then the pin check.
    func makeHandler(for endpoint: Endpoint, alpn: String) throws -> NIOSSLClientHandler {
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

extension WebSocketBinding {
    /// The largest WebSocket frame accepted: the largest Tether frame (16 MiB body and its header).
    package static let maxFrameSize = FrameHeader.size + FrameHeader.absoluteMaximumBodySize

    /// Adds the frame aggregator and the ``WebSocketMessageHandler`` to a channel NIOWebSocket
    /// has just upgraded.
    package static func addMessageHandlers(to channel: any Channel, role: WebSocketMessageHandler.Role) throws {
        let pipeline = channel.pipeline.syncOperations
        try pipeline.addHandler(
            NIOWebSocketFrameAggregator(
                minNonFinalFragmentSize: 0,
                maxAccumulatedFrameCount: 1 << 12,
                maxAccumulatedFrameSize: Self.maxFrameSize
            )
        )
        try pipeline.addHandler(WebSocketMessageHandler(role: role))
    }
}
