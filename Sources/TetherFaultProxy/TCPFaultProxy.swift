public import NIOCore
import NIOPosix
public import TetherCore
import TetherNIO

/// A TCP proxy between clients and a gateway that can degrade or break the path on demand:
/// add latency, jitter and a bandwidth cap, stop forwarding while keeping connections open (a
/// blackhole, the half-open case), cut every connection at once, abandon the current connections
/// while new ones work (a network switch), forget connections left idle too long (a NAT), or
/// refuse new connections.
///
/// ```swift
/// let proxy = TCPFaultProxy(upstream: Endpoint(host: "127.0.0.1", port: gatewayPort))
/// let address = try await proxy.start()
/// proxy.impairment = try .init(latency: .milliseconds(100), jitter: .milliseconds(300))
/// proxy.mode = .blackhole
/// proxy.cutAll()
/// ```
///
/// Given several upstreams it is also a load balancer without affinity: each new connection
/// goes to the next upstream in turn.
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

    /// How the proxy degrades the bytes it forwards, in each direction separately.
    ///
    /// Each chunk read from one side is written to the other after
    /// `latency + uniform(0...jitter)`, never before the chunk read ahead of it (a TCP stream is
    /// not reordered), and no faster than `bytesPerSecond` allows.
    public struct Impairment: Sendable, Hashable {
        /// The one-way delay added to every chunk; the round trip gains twice this.
        public var latency: Duration
        /// The largest random delay added on top of `latency`, drawn per chunk.
        public var jitter: Duration
        /// The bandwidth cap per direction and connection; `nil` for none.
        public var bytesPerSecond: Int?

        /// - Throws: ``ConfigurationError`` for a negative delay or a cap below 1 byte/s.
        public init(latency: Duration = .zero, jitter: Duration = .zero, bytesPerSecond: Int? = nil) throws(ConfigurationError) {
            guard latency >= .zero, jitter >= .zero else { throw ConfigurationError("latency and jitter must not be negative") }
            if let bytesPerSecond, bytesPerSecond < 1 { throw ConfigurationError("the bandwidth cap must be at least 1 byte/s") }
            self.latency = latency
            self.jitter = jitter
            self.bytesPerSecond = bytesPerSecond
        }

        /// No impairment: bytes are forwarded as soon as they are read.
        public static var none: Impairment { try! Impairment() }

        var isNone: Bool { self.latency == .zero && self.jitter == .zero && self.bytesPerSecond == nil }
    }

    private struct State {
        var mode = Mode.forward
        var impairment = Impairment.none
        var server: (any Channel)?
        var connections: [ObjectIdentifier: any Channel] = [:]
        var abandoned: Set<ObjectIdentifier> = []
        var accepted = 0
        var bytesToUpstream = 0
        var bytesToClient = 0
        var natTimeout: Duration?
        var natExpired = 0
        /// When the NAT forgot each connection still open, by client channel.
        var natExpiredAt: [ObjectIdentifier: NIODeadline] = [:]
        /// Time spent forgotten by connections since closed.
        var natUnreachable = TimeAmount.zero
        /// The upstream the next connection goes to.
        var nextUpstream = 0
    }

    /// The gateway the proxy forwards to (the first of ``upstreams``).
    public var upstream: Endpoint { self.upstreams[0] }
    /// The gateways the proxy forwards to, a connection to each in turn.
    public let upstreams: [Endpoint]
    private let group: any EventLoopGroup
    private let state = TetherLock(State())

    /// - Parameters:
    ///   - upstream: Where to forward to.
    ///   - eventLoopGroup: Where the proxy's I/O runs; NIO's shared group if `nil`.
    public init(upstream: Endpoint, eventLoopGroup: (any EventLoopGroup)? = nil) {
        self.upstreams = [upstream]
        self.group = eventLoopGroup ?? MultiThreadedEventLoopGroup.singleton
    }

    /// A proxy that sends each new connection to the next of `upstreams` in turn (round robin,
    /// no affinity), as a load balancer in front of several gateways does.
    /// - Parameters:
    ///   - upstreams: Where to forward to; at least one.
    ///   - eventLoopGroup: Where the proxy's I/O runs; NIO's shared group if `nil`.
    public init(upstreams: [Endpoint], eventLoopGroup: (any EventLoopGroup)? = nil) {
        precondition(!upstreams.isEmpty, "a proxy needs an upstream")
        self.upstreams = upstreams
        self.group = eventLoopGroup ?? MultiThreadedEventLoopGroup.singleton
    }

    /// What the proxy does now; changing it applies to current connections at once.
    public var mode: Mode {
        get { self.state.withLockedValue { $0.mode } }
        set { self.state.withLockedValue { $0.mode = newValue } }
    }

    /// How forwarded bytes are delayed and throttled; changing it applies to the next chunk.
    public var impairment: Impairment {
        get { self.state.withLockedValue { $0.impairment } }
        set { self.state.withLockedValue { $0.impairment = newValue } }
    }

    /// Like a NAT or a stateful firewall: a connection that carried nothing either way for this
    /// long is forgotten. Its later bytes go nowhere, both ways, and neither end is told (the
    /// silent kind of NAT; some send a reset instead). `nil` (the default) forgets nothing.
    public var natTimeout: Duration? {
        get { self.state.withLockedValue { $0.natTimeout } }
        set { self.state.withLockedValue { $0.natTimeout = newValue } }
    }

    /// How many connections the NAT timeout has forgotten so far.
    public var natExpiredConnections: Int { self.state.withLockedValue { $0.natExpired } }

    /// The time connections spent forgotten by the NAT timeout but still open (their client
    /// unaware, its pushes going nowhere), summed over connections, until now.
    public var natUnreachableTime: Duration {
        let now = NIODeadline.now()
        return self.state.withLockedValue { state in
            Duration(state.natExpiredAt.values.reduce(state.natUnreachable) { $0 + (now - $1) })
        }
    }

    /// The bytes forwarded so far from clients to the gateway, and from the gateway to clients.
    public var forwardedBytes: (toUpstream: Int, toClient: Int) {
        self.state.withLockedValue { ($0.bytesToUpstream, $0.bytesToClient) }
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

    /// Silently stops forwarding on every current connection, for good, while new connections
    /// work: the old network is gone (its packets go nowhere) and a new one is up, as after a
    /// switch from Wi-Fi to cellular. Nothing tells the endpoints; they must find out.
    public func abandonAll() {
        self.state.withLockedValue { state in
            state.abandoned.formUnion(state.connections.keys)
        }
    }

    /// Stops listening and closes every connection.
    public func stop() async {
        let server = self.state.withLockedValue { $0.server }
        try? await server?.close()
        self.cutAll()
    }

    private func accept(_ inbound: any Channel) -> EventLoopFuture<Void> {
        let count = self.upstreams.count
        let (refuse, target) = self.state.withLockedValue { state -> (Bool, Int) in
            state.accepted += 1
            defer { state.nextUpstream = (state.nextUpstream + 1) % count }
            return (state.mode == .refuse, state.nextUpstream)
        }
        if refuse {
            return inbound.close()
        }
        self.track(inbound)
        let upstream = ClientBootstrap(group: inbound.eventLoop)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .connect(host: self.upstreams[target].host, port: self.upstreams[target].port)
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
            let now = NIODeadline.now()
            self.state.withLockedValue { state in
                state.connections.removeValue(forKey: key)
                state.abandoned.remove(key)
                if let expiredAt = state.natExpiredAt.removeValue(forKey: key) {
                    state.natUnreachable = state.natUnreachable + (now - expiredAt)
                }
            }
        }
    }

    /// Whether bytes read from `channel` (the client side of its connection) are dropped, what
    /// delays the rest, and counts them. `idle` is how long the connection carried nothing.
    fileprivate func admit(_ bytes: Int, from channel: any Channel, toUpstream: Bool, idle: TimeAmount) -> Impairment? {
        self.state.withLockedValue { state in
            let key = ObjectIdentifier(channel)
            guard state.mode != .blackhole, !state.abandoned.contains(key) else { return nil }
            if let timeout = state.natTimeout, idle > TimeAmount(timeout) {
                state.abandoned.insert(key)
                state.natExpired += 1
                state.natExpiredAt[key] = .now() - idle + TimeAmount(timeout)
                return nil
            }
            if toUpstream { state.bytesToUpstream += bytes } else { state.bytesToClient += bytes }
            return state.impairment
        }
    }
}

/// Forwards bytes to its partner on the other side of the proxy (both live on one event loop),
/// delayed and throttled as the proxy's ``TCPFaultProxy/Impairment`` says.
private final class RelayHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Reading pauses while this many delayed bytes wait to be written to the partner.
    private static let delayedBytesLimit = 256 * 1024

    private let proxy: TCPFaultProxy
    /// Whether this handler reads from the client (and writes to the gateway).
    private let fromClient: Bool
    private var partner: RelayHandler?
    private var context: ChannelHandlerContext?
    private var pendingRead = false
    /// When the last delayed chunk is due: later chunks never overtake it.
    private var lastDue = NIODeadline.distantPast
    /// When the capped link has sent everything read so far.
    private var linkFreeAt = NIODeadline.distantPast
    private var delayedBytes = 0
    private var random = SystemRandomNumberGenerator()
    /// When bytes last passed either way (kept by the client side's handler).
    private var lastActivity = NIODeadline.now()

    private init(proxy: TCPFaultProxy, fromClient: Bool) {
        self.proxy = proxy
        self.fromClient = fromClient
    }

    static func pair(proxy: TCPFaultProxy) -> (RelayHandler, RelayHandler) {
        let first = RelayHandler(proxy: proxy, fromClient: true)
        let second = RelayHandler(proxy: proxy, fromClient: false)
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
        let buffer = self.unwrapInboundIn(data)
        // An abandoned connection is judged by its client side: both directions stop.
        guard let clientSide = self.fromClient ? self : self.partner, let clientChannel = clientSide.context?.channel else { return }
        let now = NIODeadline.now()
        guard
            let impairment = self.proxy.admit(
                buffer.readableBytes,
                from: clientChannel,
                toUpstream: self.fromClient,
                idle: now - clientSide.lastActivity
            )
        else { return }
        clientSide.lastActivity = now
        if impairment.isNone && self.delayedBytes == 0 {
            self.partner?.forward(data)
            return
        }
        var due = now
        if let rate = impairment.bytesPerSecond {
            let sendTime = TimeAmount.nanoseconds(Int64(Double(buffer.readableBytes) / Double(rate) * 1e9))
            self.linkFreeAt = max(self.linkFreeAt, now) + sendTime
            due = self.linkFreeAt
        }
        var delay = TimeAmount(impairment.latency)
        if impairment.jitter > .zero {
            delay = delay + .nanoseconds(Int64.random(in: 0...TimeAmount(impairment.jitter).nanoseconds, using: &self.random))
        }
        due = max(due + delay, self.lastDue)
        self.lastDue = due
        self.delayedBytes += buffer.readableBytes
        context.eventLoop.assumeIsolated().scheduleTask(deadline: due) {
            self.delayedBytes -= buffer.readableBytes
            self.partner?.forward(data)
            self.partner?.context?.flush()
            if self.delayedBytes < Self.delayedBytesLimit / 2 { self.resumeReading() }
        }
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
        // Backpressure: read only while the partner can write and few delayed bytes wait.
        let partnerBlocked = self.partner?.context.map { !$0.channel.isWritable } ?? false
        if partnerBlocked || self.delayedBytes >= Self.delayedBytesLimit {
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
