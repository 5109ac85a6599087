import Atomics
import Foundation
public import Logging
public import NIOCore
import NIOPosix
import Prometheus
public import ServiceLifecycle
import TetherCore
import TetherNIO
import TetherNIOTransports
public import Tracing

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

#if canImport(Darwin)
    private let RLIMIT_NOFILE_VALUE = RLIMIT_NOFILE
#else
    private let RLIMIT_NOFILE_VALUE = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
#endif

/// The Tether gateway: the server apps keep their long-lived connections to.
///
/// It accepts connections, performs the handshake, routes REQUEST frames to the handlers
/// registered with ``handle(_:_:)``, pushes to connections, clients and rooms, answers PINGs,
/// closes idle connections, and shuts down gracefully: GOAWAY to every client, requests in
/// flight finish, then connections close.
///
/// ```swift
/// let gateway = try Gateway(configuration: .defaults)
/// gateway.handle("echo") { request, _ in request.body }
/// gateway.handle("room.join") { request, context in
///     context.join(String(buffer: request.body))
///     return ByteBuffer(string: "joined")
/// }
/// try await gateway.run()  // or add it to a ServiceGroup
/// ```
public final class Gateway: Service, Sendable {
    /// A request handler: returns the reply body, or throws ``RequestError`` for a specific status.
    public typealias Handler = @Sendable (GatewayRequest, RequestContext) async throws -> ByteBuffer
    /// A request handler that answers without waiting, called on the connection's event loop;
    /// see ``handleInline(_:_:)``.
    public typealias InlineHandler = @Sendable (GatewayRequest, RequestContext) throws -> ByteBuffer
    /// Checks a client's credentials during the handshake; throwing refuses the client
    /// (`unauthenticated`, with the ``RequestError/message`` if it is a ``RequestError``).
    /// For credentials that expire or limit what the client may do, implement
    /// ``ClientAuthenticator`` instead.
    ///
    /// - Important: The client id in HELLO is only a claim. Check that the token belongs to
    ///   it: pushes to ``PushTarget/client(_:)`` reach every connection that presented that id.
    public typealias Authenticator = @Sendable (HandshakeInfo) async throws -> Void

    /// The configuration the gateway was created with.
    public let configuration: GatewayConfiguration
    /// The gateway's one clock: every deadline of its connections (handshakes, requests,
    /// handlers, idle connections, limits) is an instant on it.
    public let clock: any TetherClock
    let eventLoopGroup: any EventLoopGroup
    /// With ``GatewayConfiguration/Execution-swift.enum/eventLoop``, the task executor of each loop.
    let executors: EventLoopTaskExecutors?
    /// The ``PushBatcher`` of each loop of ``eventLoopGroup``.
    let pushBatchers: [ObjectIdentifier: PushBatcher]
    /// What all connections together may make the gateway hold (``GatewayConfiguration/Limits-swift.struct/memoryBudget``).
    let memoryBudget: MemoryBudget
    /// The ``IntakeMonitor`` of each loop of ``eventLoopGroup``: bodies in progress and paused connections.
    let intakeMonitors: [ObjectIdentifier: IntakeMonitor]
    let logger: Logger
    let authenticator: (any ClientAuthenticator)?
    /// The routes while they are registered; once the gateway starts, what its connections share.
    private let routing = TetherLock(Routing.building(Router()))
    /// Reliable delivery: the store, its writer, the outboxes' lanes; `nil` without a store.
    let reliable: ReliableServices?
    /// The other nodes, when the gateway is one of several sharing a store.
    let cluster: (any GatewayCluster)?
    /// The connection limits, checked as each connection is accepted.
    let admission: ConnectionAdmission
    /// Refusals, logged a few lines at a time however many there are.
    let refusalLog: RateLimitedLog
    let registry: ConnectionRegistry
    let pushes: Pusher
    let connectionIDs = ManagedAtomic<UInt64>(1)
    /// Connections of the HTTP listener that have not upgraded or served the HTTP stream yet.
    let pendingUpgrades = ManagedAtomic<Int>(0)
    /// Connections of the HTTP listener refused at once and being answered.
    let refusing = ManagedAtomic<Int>(0)
    /// Connections of the admin listener refused at once and being answered: counted apart, so
    /// that a flood of the HTTP listener does not leave a monitoring probe without its 503.
    let adminRefusing = ManagedAtomic<Int>(0)
    /// Connections of the admin listener.
    let adminConnections = ManagedAtomic<Int>(0)
    /// The HTTP streams open on the HTTP listener, by session token.
    let httpStreams: HTTPStreamSessions
    /// In a cluster, the key that opens this node's HTTP-stream tokens (``ClusterNode/streamKey``).
    let streamKey: UInt64
    let lifecycle = TetherLock(Lifecycle())
    /// What ``run()`` waits for: accepting, connections, and the tasks serving them.
    let activity = ActivityTracker()
    /// The TLS contexts of the listeners that speak TLS, made from ``GatewayConfiguration/tls``.
    let tlsContexts: ServerTLSContexts?
    /// The gateway's metrics.
    let metrics: GatewayMetrics
    /// The Prometheus registry the admin listener serves at `/metrics`, if any.
    let metricsRegistry: PrometheusCollectorRegistry?
    /// Where request and message spans go; `nil`: no tracing.
    let tracer: (any Tracer)?

    /// Creates a gateway; it accepts connections once ``run()`` is called.
    /// - Parameters:
    ///   - configuration: Listening address, limits, timeouts, checksum policy.
    ///   - eventLoopGroup: Where connections' I/O runs; NIO's shared group if `nil`.
    ///   - messageStore: Where reliable delivery keeps its state (``SQLiteMessageStore`` for a
    ///     file); without one the gateway does not offer reliable delivery.
    ///   - authenticator: Checks each client's HELLO and says who it is (``JWTAuthenticator``
    ///     in `TetherJWT` checks JSON Web Tokens); `nil` accepts everyone as the client id it
    ///     claims.
    ///   - cluster: The other gateways this one is a node with (`PostgresCluster` in
    ///     TetherPostgres), sharing `messageStore`; `nil` for a gateway on its own.
    ///   - clock: The gateway's one clock; inject `ManualClock` (TetherTesting) or an
    ///     ``EventLoopClock`` in tests to move every deadline by hand.
    ///   - metrics: Where its metrics go (``Metrics-swift.struct``): swift-metrics' global
    ///     factory by default; ``Metrics-swift.struct/prometheus(_:)`` also serves them at the
    ///     admin listener's `/metrics`.
    ///   - tracer: Where a span per request and per reliable message goes, each the child of the
    ///     trace its REQUEST or MESSAGE carried; `nil`: swift-distributed-tracing's
    ///     `InstrumentationSystem.tracer` as the gateway is created (no spans if none was
    ///     bootstrapped).
    ///   - logger: Where the gateway logs connections and errors.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidConfiguration``.
    public init(
        configuration: GatewayConfiguration = .defaults,
        eventLoopGroup: (any EventLoopGroup)? = nil,
        messageStore: (any MessageStore)? = nil,
        authenticator: (any ClientAuthenticator)? = nil,
        cluster: (any GatewayCluster)? = nil,
        clock: any TetherClock = SystemClock(),
        metrics: Metrics = .system,
        tracer: (any Tracer)? = nil,
        logger: Logger = Logger(label: "tether.gateway")
    ) throws(GatewayError) {
        do {
            try configuration.validate()
        } catch {
            throw GatewayError(code: .invalidConfiguration, message: error.message)
        }
        if authenticator == nil, !configuration.insecureOpen, let host = configuration.nonLoopbackHosts.first {
            throw GatewayError(
                code: .invalidConfiguration,
                message:
                    "the gateway listens on \(host) with no authenticator: any client could claim any client id. "
                    + "Give it an authenticator (tether serve --jwt-key), listen on loopback only, "
                    + "or allow it explicitly with insecureOpen (tether serve --insecure-open)"
            )
        }
        self.configuration = configuration
        let streamKey = UInt64.random(in: 1...UInt64.max)
        self.streamKey = streamKey
        self.httpStreams = HTTPStreamSessions(
            remembered: configuration.webSocket?.stream?.endedSessionsRemembered ?? 0,
            forwarding: cluster.map { cluster in Self.streamForwarding(through: cluster, nodeKey: streamKey) }
        )
        do {
            self.tlsContexts = try configuration.tls.map { tls throws(ConfigurationError) in try ServerTLSContexts(tls) }
        } catch {
            throw GatewayError(code: .invalidConfiguration, message: error.message)
        }
        self.eventLoopGroup = eventLoopGroup ?? MultiThreadedEventLoopGroup.singleton
        switch configuration.execution {
        case .eventLoop: self.executors = EventLoopTaskExecutor.perLoop(of: self.eventLoopGroup)
        case .globalExecutor: self.executors = nil
        }
        var pushBatchers: [ObjectIdentifier: PushBatcher] = [:]
        let memoryBudget = MemoryBudget(limit: configuration.limits.memoryBudget)
        var intakeMonitors: [ObjectIdentifier: IntakeMonitor] = [:]
        for loop in self.eventLoopGroup.makeIterator() {
            pushBatchers[ObjectIdentifier(loop)] = PushBatcher(loop: loop)
            intakeMonitors[ObjectIdentifier(loop)] = IntakeMonitor(
                budget: memoryBudget,
                bodyTimeout: configuration.timeouts.body,
                clock: clock,
                eventLoop: loop
            )
        }
        self.pushBatchers = pushBatchers
        self.memoryBudget = memoryBudget
        self.intakeMonitors = intakeMonitors
        self.authenticator = authenticator
        self.clock = clock
        let gatewayMetrics = GatewayMetrics(factory: metrics.factory)
        self.metrics = gatewayMetrics
        self.metricsRegistry = metrics.registry
        let tracer = tracer ?? InstrumentationSystem.tracer
        self.tracer = tracer is NoOpTracer ? nil : tracer
        self.reliable = messageStore.map {
            ReliableServices(
                store: $0,
                limits: configuration.limits,
                compression: configuration.compression,
                cluster: cluster,
                metrics: gatewayMetrics,
                clock: clock
            )
        }
        self.cluster = cluster
        var admissionLimits = ConnectionAdmission.Limits(
            connections: configuration.limits.maxConnections,
            connectionsPerAddress: configuration.limits.maxConnectionsPerAddress,
            unauthenticated: configuration.limits.maxUnauthenticatedConnections,
            handshakesPerSecond: configuration.limits.handshakesPerSecond,
            handshakesPerSecondPerAddress: configuration.limits.handshakesPerSecondPerAddress
        )
        // Running out of descriptors makes accepting fail in a loop and every client hang:
        // refuse connections, with a clear answer, before that.
        if let descriptors = Self.descriptorLimit(), descriptors - Self.reservedDescriptors < admissionLimits.connections {
            admissionLimits.connections = max(1, descriptors - Self.reservedDescriptors)
            logger.warning(
                "the process's descriptor limit caps the connections below limits.maxConnections",
                metadata: [
                    "descriptor-limit": "\(descriptors)", "max-connections": "\(admissionLimits.connections)",
                    "configured": "\(configuration.limits.maxConnections)",
                ]
            )
        }
        self.admission = ConnectionAdmission(limits: admissionLimits, now: clock.now, budget: memoryBudget)
        self.refusalLog = RateLimitedLog(clock: clock)
        self.registry = ConnectionRegistry(
            roomsPerConnection: configuration.limits.maxRoomsPerConnection,
            membersPerRoom: configuration.limits.maxMembersPerRoom
        )
        var channelWriter: ChannelWriter?
        if let channels = configuration.channels, channels.usesStore {
            guard let store = messageStore as? any ChannelHistoryStore else {
                throw GatewayError(
                    code: .invalidConfiguration,
                    message:
                        "a channel rule keeps its history in the store (storage: .store), but the gateway's message store "
                        + (messageStore == nil
                            ? "is not set" : "does not keep channels' history (a ChannelHistoryStore, as SQLiteMessageStore)")
                )
            }
            channelWriter = ChannelWriter(store: store, sends: !(cluster?.sendsChannelPublications ?? false))
        }
        self.pushes = Pusher(
            registry: self.registry,
            batchers: pushBatchers,
            cluster: cluster,
            metrics: gatewayMetrics,
            channels: configuration.channels.map { ChannelHub(configuration: $0, clock: clock, cluster: cluster) },
            channelWriter: channelWriter,
            clock: clock
        )
        if let cluster, let channels = configuration.channels,
            !cluster.sendsChannelPublications || channels.rules.contains(where: { $0.storage == .memory })
        {
            logger.warning(
                "channels kept in memory (or, with a cluster that does not share the store's channels, every channel) are each node's own: a publication reaches the subscribers of the node it was made on, and a client that moves to another node gets a gap"
            )
        }
        self.logger = logger
    }

    /// Decides whether a client may do something: ``Access/request(method:)`` (called on the
    /// connection's event loop for every request: keep it fast), ``Access/send(topic:)`` and
    /// ``Access/join(room:)``. A refused request or message gets `permission denied`; a refused
    /// join returns `false`.
    public typealias Authorizer = @Sendable (Access, ConnectionInfo) -> Bool

    /// Sets the check of what each client may do, on top of what its credentials allow
    /// (``ClientIdentity/rooms`` and ``ClientIdentity/topics``). Set it before ``run()``.
    ///
    /// ```swift
    /// gateway.authorize { access, connection in
    ///     if case .request(let method) = access, method.hasPrefix("admin.") {
    ///         return connection.identity?.attributes["role"] == "admin"
    ///     }
    ///     return true
    /// }
    /// ```
    public func authorize(_ check: @escaping Authorizer) {
        self.register("authorize") { $0.authorizer = check }
    }

    /// What ``authorizeChannels(_:)`` calls: returns to allow, throws ``RequestError`` to refuse
    /// with its status and message (any other error refuses with `unavailable`).
    public typealias ChannelAuthorizer = @Sendable (_ access: Access, _ connection: ConnectionInfo) async throws -> Void

    /// Asks `check` before a client subscribes to a channel (a SUBSCRIBE; also its history
    /// reads: ``Access/subscribe(channel:)``), sees its presence (``Access/presence(channel:)``)
    /// or publishes to it (``Access/publish(channel:)``), once its credentials and the
    /// ``authorize(_:)`` hook allowed it: for checks that take a call (a backend, a database).
    /// The SUBSCRIBE waits for the answer (a SUBSCRIBE or UNSUBSCRIBE of the same channel meanwhile
    /// makes it moot). Set it before ``run()``.
    ///
    /// ```swift
    /// gateway.authorizeChannels { access, connection in
    ///     guard case .subscribe(let channel) = access, channel.hasPrefix("team.") else { return }
    ///     guard try await teams.isMember(connection.clientID, of: channel) else {
    ///         throw RequestError(.permissionDenied, "not in this team")
    ///     }
    /// }
    /// ```
    public func authorizeChannels(_ check: @escaping ChannelAuthorizer) {
        self.register("authorizeChannels") { $0.channelAuthorizer = check }
    }

    /// Creates a gateway whose clients are checked by a closure.
    /// - Parameters:
    ///   - configuration: Listening address, limits, timeouts, checksum policy.
    ///   - eventLoopGroup: Where connections' I/O runs; NIO's shared group if `nil`.
    ///   - messageStore: Where reliable delivery keeps its state.
    ///   - authenticate: Checks each client's HELLO; throwing refuses it.
    ///   - clock: The gateway's one clock.
    ///   - metrics: Where its metrics go.
    ///   - tracer: Where request and message spans go.
    ///   - logger: Where the gateway logs connections and errors.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidConfiguration``.
    public convenience init(
        configuration: GatewayConfiguration = .defaults,
        eventLoopGroup: (any EventLoopGroup)? = nil,
        messageStore: (any MessageStore)? = nil,
        authenticate: @escaping Authenticator,
        clock: any TetherClock = SystemClock(),
        metrics: Metrics = .system,
        tracer: (any Tracer)? = nil,
        logger: Logger = Logger(label: "tether.gateway")
    ) throws(GatewayError) {
        try self.init(
            configuration: configuration,
            eventLoopGroup: eventLoopGroup,
            messageStore: messageStore,
            authenticator: ClosureAuthenticator(check: authenticate),
            clock: clock,
            metrics: metrics,
            tracer: tracer,
            logger: logger
        )
    }

    /// Registers the handler of `method`, replacing any earlier one.
    ///
    /// - Important: Register every handler before ``run()``: the routes are fixed when the
    ///   gateway starts (its connections then read them without a lock).
    /// - Parameters:
    ///   - method: The method clients call, e.g. `room.enter`.
    ///   - handler: Produces the reply; runs concurrently with other requests.
    public func handle(_ method: String, _ handler: @escaping Handler) {
        self.register("handle(\"\(method)\")") { $0.add(method, .task(handler)) }
    }

    /// Registers the handler of every method that starts with `prefix` and has no handler of
    /// its own (``handle(_:_:)``): the longest matching prefix wins. An empty prefix handles
    /// every method; reserved methods (`$…`) are never routed by prefix. Requests count in
    /// the metrics under `prefix*`. Register it before ``run()``.
    ///
    /// ```swift
    /// gateway.handle(prefix: "order.") { request, context in try await backend.call(request) }
    /// ```
    public func handle(prefix: String, _ handler: @escaping Handler) {
        precondition(!prefix.hasPrefix("$"), "methods starting with $ are reserved for the protocol")
        self.register("handle(prefix: \"\(prefix)\")") { $0.add(prefix: prefix, .task(handler)) }
    }

    /// Registers a handler of `method` that answers at once, replacing any earlier one.
    ///
    /// An inline handler is called on the connection's event loop as soon as the request is
    /// read, and its reply is written right after: no task is created, and the request takes
    /// none of the connection's concurrent-request slots. That saves a task, two hops and the
    /// bookkeeping of cancellation per request, which is most of the gateway's own cost for a
    /// cheap handler (a lookup in memory, an echo, a counter).
    ///
    /// - Important: It must not block: while it runs, no other connection of its event loop is
    ///   served, and neither CANCEL nor the deadline can stop it. For anything that waits (a
    ///   database, the network, a lock held long), use ``handle(_:_:)``. It has a name of its
    ///   own so that a synchronous closure given to `handle` keeps running in a task. Register
    ///   it before ``run()``.
    ///
    /// ```swift
    /// gateway.handleInline("echo") { request, _ in request.body }
    /// ```
    /// - Parameters:
    ///   - method: The method clients call.
    ///   - handler: Produces the reply, or throws ``RequestError`` for a specific status.
    public func handleInline(_ method: String, _ handler: @escaping InlineHandler) {
        self.register("handleInline(\"\(method)\")") { $0.add(method, .inline(handler)) }
    }

    /// Adds a route while the gateway has not started; a registration after that is a
    /// programming error (the connections would not all see it).
    func register(_ what: @autoclosure () -> String, _ add: (inout Router) -> Void) {
        self.routing.withLockedValue { routing in
            guard case .building(var router) = routing else {
                preconditionFailure("Gateway.\(what()) after the gateway started: register every handler before run()")
            }
            add(&router)
            routing = .building(router)
        }
    }

    /// What the gateway's connections share, with the routes frozen: composed when the gateway
    /// starts (or accepts its first connection, whichever comes first).
    var services: GatewayServices {
        self.routing.withLockedValue { routing in
            switch routing {
            case .frozen(let services):
                return services
            case .building(let router):
                let services = GatewayServices(
                    configuration: self.configuration,
                    clock: self.clock,
                    router: router,
                    registry: self.registry,
                    pushes: self.pushes,
                    activity: self.activity,
                    authenticator: self.authenticator,
                    admission: self.admission,
                    refusalLog: self.refusalLog,
                    intakeMonitors: self.intakeMonitors,
                    reliable: self.reliable,
                    executors: self.executors,
                    metrics: self.metrics,
                    tracer: self.tracer,
                    logger: self.logger
                )
                routing = .frozen(services)
                return services
            }
        }
    }

    /// The routes as they stand: frozen once the gateway started.
    var router: Router {
        self.routing.withLockedValue { routing in
            switch routing {
            case .building(let router): router
            case .frozen(let services): services.router
            }
        }
    }

    /// The routes, while they are registered, then frozen with the rest of what connections share.
    private enum Routing {
        case building(Router)
        case frozen(GatewayServices)
    }

    /// The established connections.
    public var connections: [ConnectionInfo] { self.registry.established }

    /// The address the gateway's TCP listener (``GatewayConfiguration/listen``) is bound to,
    /// once it is (useful with port 0).
    /// - Throws: ``GatewayError`` if the gateway has no TCP listener, failed to bind, or shut
    ///   down before binding.
    public var listeningAddress: SocketAddress {
        get async throws(GatewayError) {
            if self.configuration.listen == nil {
                throw GatewayError(code: .notListening, message: "the configuration has no TCP listener")
            }
            return try await self.boundAddress(of: .tcp)
        }
    }

    /// The address the gateway's WebSocket listener (``GatewayConfiguration/webSocket``) is
    /// bound to, once it is (useful with port 0).
    /// - Throws: ``GatewayError`` if the gateway has no WebSocket listener, failed to bind, or
    ///   shut down before binding.
    public var webSocketAddress: SocketAddress {
        get async throws(GatewayError) {
            if self.configuration.webSocket == nil {
                throw GatewayError(code: .notListening, message: "the configuration has no WebSocket listener")
            }
            return try await self.boundAddress(of: .webSocket)
        }
    }

    func boundAddress(of listener: Listener) async throws(GatewayError) -> SocketAddress {
        let result: Result<SocketAddress, GatewayError> = await withCheckedContinuation { continuation in
            let ready: Result<SocketAddress, GatewayError>? = self.lifecycle.withLockedValue { lifecycle in
                if let address = lifecycle.addresses[listener] { return address }
                lifecycle.addressWaiters.append((listener, continuation))
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
        return try result.get()
    }

    /// Descriptors kept for the store, the listener, logs and the handshake of a refusal.
    static let reservedDescriptors = 64

    /// The process's soft limit on open descriptors, if it has one.
    static func descriptorLimit() -> Int? {
        var limit = rlimit()
        guard getrlimit(RLIMIT_NOFILE_VALUE, &limit) == 0, limit.rlim_cur < rlim_t(Int32.max) else { return nil }
        return Int(clamping: limit.rlim_cur)
    }
}
