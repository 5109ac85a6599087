import NIOConcurrencyHelpers
public import NIOCore
import NIOPosix
public import TetherCore

/// A TCP proxy between clients and a gateway that can break the path on demand: stop
/// forwarding while keeping connections open (a blackhole, the half-open case), cut every
/// connection at once (a network switch), or refuse new connections.
///
/// ```swift
/// let proxy = TCPFaultProxy(upstream: Endpoint(host: "127.0.0.1", port: gatewayPort))
/// let address = try await proxy.start()
/// proxy.mode = .blackhole
/// proxy.cutAll()
/// ```
public final class TCPFaultProxy: Sendable {
    /// What the proxy does with the bytes of its connections.
    public enum Mode: Sendable, Hashable {
        /// Forward both ways.
        case forward
        /// Accept and drop every byte both ways; connections stay open.
        case blackhole
        /// Close new connections as soon as they are accepted.
        case refuse
    }

    private struct State {
        var mode = Mode.forward
        var server: (any Channel)?
        var connections: [ObjectIdentifier: any Channel] = [:]
        var accepted = 0
    }

    /// The gateway the proxy forwards to.
    public let upstream: Endpoint
    private let group: any EventLoopGroup
    private let state = NIOLockedValueBox(State())

    /// - Parameters:
    ///   - upstream: Where to forward to.
    ///   - eventLoopGroup: Where the proxy's I/O runs; NIO's shared group if `nil`.
    public init(upstream: Endpoint, eventLoopGroup: (any EventLoopGroup)? = nil) {
        self.upstream = upstream
        self.group = eventLoopGroup ?? MultiThreadedEventLoopGroup.singleton
    }

    /// What the proxy does now; changing it applies to current connections at once.
    public var mode: Mode {
        get { self.state.withLockedValue { $0.mode } }
        set { self.state.withLockedValue { $0.mode = newValue } }
    }

    /// The number of client connections accepted so far.
    public var acceptedConnections: Int { self.state.withLockedValue { $0.accepted } }

    /// The number of proxied connections (client side) open now.
    public var openConnections: Int { self.state.withLockedValue { $0.connections.count / 2 } }

    /// Starts listening.
    /// - Parameters:
    ///   - host: The address to listen on.
    ///   - port: The port; 0 picks a free one.
    /// - Returns: The address clients should connect to.
    public func start(host: String = "127.0.0.1", port: Int = 0) async throws -> SocketAddress {
        let server = try await ServerBootstrap(group: self.group)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelOption(.autoRead, value: false)
            .childChannelInitializer { inbound in self.accept(inbound) }
            .bind(host: host, port: port)
            .get()
        self.state.withLockedValue { $0.server = server }
        return server.localAddress!
    }

    /// Closes every proxied connection, both sides, as a network switch would.
    public func cutAll() {
        let connections = self.state.withLockedValue { Array($0.connections.values) }
        for connection in connections { connection.close(promise: nil) }
    }

    /// Stops listening and closes every connection.
    public func stop() async {
        let server = self.state.withLockedValue { $0.server }
        try? await server?.close()
        self.cutAll()
    }

    private func accept(_ inbound: any Channel) -> EventLoopFuture<Void> {
        let refuse = self.state.withLockedValue { state -> Bool in
            state.accepted += 1
            return state.mode == .refuse
        }
        if refuse {
            return inbound.close()
        }
        self.track(inbound)
        let upstream = ClientBootstrap(group: inbound.eventLoop)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .connect(host: self.upstream.host, port: self.upstream.port)
        return upstream.flatMap { outbound in
            self.track(outbound)
            let (toUpstream, toClient) = RelayHandler.pair(proxy: self)
            do {
                try inbound.pipeline.syncOperations.addHandler(toUpstream)
                try outbound.pipeline.syncOperations.addHandler(toClient)
            } catch {
                outbound.close(promise: nil)
                return inbound.eventLoop.makeFailedFuture(error)
            }
            // Reading was held back until the upstream side existed.
            return inbound.setOption(ChannelOptions.autoRead, value: true)
        }.flatMapError { error in
            inbound.close(promise: nil)
            return inbound.eventLoop.makeFailedFuture(error)
        }
    }

    private func track(_ channel: any Channel) {
        let key = ObjectIdentifier(channel)
        self.state.withLockedValue { $0.connections[key] = channel }
        channel.closeFuture.whenComplete { _ in
            self.state.withLockedValue { _ = $0.connections.removeValue(forKey: key) }
        }
    }

    var isBlackholed: Bool { self.mode == .blackhole }
}

/// Forwards bytes to its partner on the other side of the proxy (both live on one event loop).
private final class RelayHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let proxy: TCPFaultProxy
    private var partner: RelayHandler?
    private var context: ChannelHandlerContext?
    private var pendingRead = false

    private init(proxy: TCPFaultProxy) {
        self.proxy = proxy
    }

    static func pair(proxy: TCPFaultProxy) -> (RelayHandler, RelayHandler) {
        let first = RelayHandler(proxy: proxy)
        let second = RelayHandler(proxy: proxy)
        first.partner = second
        second.partner = first
        return (first, second)
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        self.partner = nil
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !self.proxy.isBlackholed else { return }
        self.partner?.forward(data)
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.partner?.context?.flush()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.partner?.context?.close(promise: nil)
        self.partner = nil
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        // Resume reading on the other side once this side can take more.
        if context.channel.isWritable { self.partner?.resumeReading() }
        context.fireChannelWritabilityChanged()
    }

    func read(context: ChannelHandlerContext) {
        // Backpressure: read only while the partner can write.
        if let partner = self.partner, let partnerContext = partner.context, !partnerContext.channel.isWritable {
            self.pendingRead = true
        } else {
            context.read()
        }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }

    private func forward(_ data: NIOAny) {
        self.context?.write(data, promise: nil)
    }

    private func resumeReading() {
        guard self.pendingRead, let context = self.context else { return }
        self.pendingRead = false
        context.read()
    }
}
