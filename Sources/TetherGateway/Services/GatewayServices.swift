import Logging
import NIOCore
import TetherCore
import TetherNIO
import Tracing

/// What a gateway's connections share, composed once when the gateway starts: its
/// configuration and clock, the frozen ``Router``, the registry of connections, the limits,
/// and reliable delivery. Each connection's handler gets this one value and reaches nothing
/// else: no connection, handler or context reaches back into the ``Gateway``.
final class GatewayServices: Sendable {
    let configuration: GatewayConfiguration
    /// The gateway's one clock: every deadline of its connections is on it.
    let clock: any TetherClock
    let router: Router
    let registry: ConnectionRegistry
    let pushes: Pusher
    /// What ``Gateway/run()`` waits for: the listener and each connection, until its tasks ended.
    let activity: ActivityTracker
    let authenticator: (any ClientAuthenticator)?
    let admission: ConnectionAdmission
    let refusalLog: RateLimitedLog
    /// The ``IntakeMonitor`` of each event loop (the gateway's memory budget and body timeout).
    private let intakeMonitors: [ObjectIdentifier: IntakeMonitor]
    /// What the gateway offers in WELCOME.
    let handshakePolicy: Handshake.GatewayPolicy
    /// Reliable delivery, if the gateway has a message store.
    let reliable: ReliableServices?
    /// With ``GatewayConfiguration/Execution-swift.enum/eventLoop``, the task executor of each loop.
    let executors: EventLoopTaskExecutors?
    /// Every connection's machine starts from this.
    let connectionConfiguration: GatewayConnectionStateMachine.SharedConfiguration
    let metrics: GatewayMetrics
    /// Where request and message spans go; `nil`: no tracing.
    let tracer: (any Tracer)?
    /// The metrics of each method the router knows, `$auth`'s, and ``unknownMethodMetrics``.
    private let requestMetrics: [String: RequestMetrics]
    /// The metrics of requests for methods the router does not know (one label for them all).
    let unknownMethodMetrics: RequestMetrics
    /// The metrics of requests the connection answered without routing them (draining, limits).
    let notRoutedMetrics: RequestMetrics
    let logger: Logger
    /// Answers ``ChannelHistoryQuery/method`` when the gateway has channels.
    let channelHistory: Gateway.Handler?
    /// Answers ``ChannelPublishRequest/method`` when the gateway has channels.
    let channelPublish: Gateway.Handler?
    /// Answers ``ChannelPresenceQuery/method`` when the gateway has channels.
    let channelPresence: Gateway.Handler?

    init(
        configuration: GatewayConfiguration,
        clock: any TetherClock,
        router: Router,
        registry: ConnectionRegistry,
        pushes: Pusher,
        activity: ActivityTracker,
        authenticator: (any ClientAuthenticator)?,
        admission: ConnectionAdmission,
        refusalLog: RateLimitedLog,
        intakeMonitors: [ObjectIdentifier: IntakeMonitor],
        reliable: ReliableServices?,
        executors: EventLoopTaskExecutors?,
        metrics: GatewayMetrics,
        tracer: (any Tracer)?,
        logger: Logger
    ) {
        self.configuration = configuration
        self.clock = clock
        self.router = router
        self.registry = registry
        self.pushes = pushes
        self.activity = activity
        self.authenticator = authenticator
        self.admission = admission
        self.refusalLog = refusalLog
        self.intakeMonitors = intakeMonitors
        self.handshakePolicy = configuration.handshakePolicy(deliveryEpoch: reliable?.store.epoch)
        self.reliable = reliable
        self.executors = executors
        self.connectionConfiguration = .init(configuration.connectionConfiguration)
        self.metrics = metrics
        self.tracer = tracer
        var requestMetrics: [String: RequestMetrics] = [:]
        for method in router.routes.keys + [
            GatewayConnectionHandler.refreshCredentialsMethod, ChannelHistoryQuery.method, ChannelPublishRequest.method,
        ] {
            requestMetrics[method] = metrics.requests(method)
        }
        for (prefix, _) in router.prefixRoutes.entries {
            let label = Router.label(ofPrefix: prefix)
            requestMetrics[label] = metrics.requests(label)
        }
        self.requestMetrics = requestMetrics
        self.unknownMethodMetrics = metrics.requests("unknown")
        self.channelHistory = pushes.channels.map { _ in GatewayConnectionHandler.channelHistory(from: pushes, router: router) }
        self.channelPublish = pushes.channels.map { GatewayConnectionHandler.channelPublish(to: $0, pusher: pushes, router: router) }
        self.channelPresence = pushes.channels.map { GatewayConnectionHandler.channelPresence(from: $0, router: router) }
        self.notRoutedMetrics = metrics.requests("not_routed")
        self.logger = logger
    }

    /// The metrics of `method`'s requests.
    func requestMetrics(_ method: String) -> RequestMetrics {
        if let metrics = self.requestMetrics[method] { return metrics }
        // A method routed by prefix counts under its prefix: one series per route, whatever
        // the methods clients call.
        guard let (prefix, _) = self.router.prefixRoute(method) else { return self.unknownMethodMetrics }
        return self.requestMetrics[Router.label(ofPrefix: prefix)] ?? self.unknownMethodMetrics
    }

    /// The intake monitor of `eventLoop`; `nil` for a loop outside the gateway's group (a
    /// channel given to ``Gateway/accept(_:framing:)``): its connections are not budgeted.
    func intakeMonitor(for eventLoop: any EventLoop) -> IntakeMonitor? {
        self.intakeMonitors[ObjectIdentifier(eventLoop)]
    }

    /// Where a connection's tasks run: its event loop, or the global executor (`nil`).
    func executor(for eventLoop: any EventLoop) -> (any TaskExecutor)? {
        self.executors?.executor(for: eventLoop)
    }
}

/// What reliable delivery shares across connections: the store, its group-commit writer, and
/// the outboxes' lanes.
struct ReliableServices: Sendable {
    let store: any MessageStore
    let writer: StoreWriter
    let lanes: ReliableLanes
    /// The cluster whose nodes share the store, if the gateway is one of several.
    let cluster: (any GatewayCluster)?
    /// How delivery payloads are compressed before they are stored; `nil`: they are not.
    let compression: Compression?
    /// The store-wide quota and the senders'.
    let quotas: StoreQuotas

    init(
        store: any MessageStore,
        limits: GatewayConfiguration.Limits,
        compression: Compression?,
        cluster: (any GatewayCluster)?,
        metrics: GatewayMetrics,
        clock: any TetherClock
    ) {
        self.store = store
        self.compression = compression
        self.quotas = StoreQuotas(limits: limits)
        self.writer = StoreWriter(store: store, metrics: metrics, clock: clock)
        self.lanes = ReliableLanes(limits: limits, cluster: cluster)
        self.cluster = cluster
    }
}

extension GatewayConfiguration {
    /// The settings of one connection's machine.
    var connectionConfiguration: GatewayConnectionStateMachine.Configuration {
        GatewayConnectionStateMachine.Configuration(
            handshakeTimeout: self.timeouts.handshake,
            idleTimeout: self.timeouts.idle,
            shutdownGracePeriod: self.timeouts.shutdownGracePeriod,
            closeTimeout: self.timeouts.closeTimeout,
            requests: GatewayRequestTable.Limits(
                handlerTimeout: self.timeouts.handler,
                maxRunning: self.limits.maxConcurrentRequestsPerConnection,
                maxWaiting: GatewayConnectionHandler.maxWaiting,
                requestsPerSecond: self.limits.requestsPerSecondPerConnection == .max ? nil : self.limits.requestsPerSecondPerConnection
            ),
            inbox: MessageInbox.Limits(
                maxMessages: 4096,
                // The frame being read may hold up to maxBodySize more, and the rest of one
                // read's frames are taken after reading stops.
                maxBytes: self.limits.maxBufferedInboundBytes - self.limits.maxBodySize,
                maxBatch: 256,
                messagesPerSecond: self.limits.messagesPerSecondPerConnection == .max ? nil : self.limits.messagesPerSecondPerConnection
            ),
            deliveryWindow: self.limits.deliveryWindow,
            compressionBytesPerSecond: self.compression == nil || self.limits.compressionBytesPerSecondPerConnection == .max
                ? nil : self.limits.compressionBytesPerSecondPerConnection
        )
    }
}
