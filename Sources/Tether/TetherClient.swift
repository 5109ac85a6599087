import Atomics
public import CoreMetrics
public import Logging
public import NIOCore
import NIOPosix
public import ServiceLifecycle
import TetherCore
public import TetherNIO
public import TetherNIOTransports
public import Tracing

/// A client that keeps one long-lived connection to a Tether gateway and makes it as easy to
/// use as HTTP: `try await client.request("method", body: …)`.
///
/// The client is a service: ``run()`` connects, keeps the connection alive (heartbeat), and
/// reconnects with exponential backoff and endpoint failover until the client shuts down.
/// Requests made while it is (re)connecting wait for the connection, up to their own
/// deadline.
///
/// ```swift
/// let client = try TetherClient(configuration: .init(endpoints: [Endpoint(host: "localhost", port: 7700)], clientID: "alice"))
/// try await withThrowingDiscardingTaskGroup { group in
///     group.addTask { try await client.run() }
///     let reply = try await client.request("echo", body: ByteBuffer(string: "hi"))
///     print(String(buffer: reply))
///     client.shutdown()
/// }
/// ```
///
/// With swift-service-lifecycle, add the client to a `ServiceGroup`; it shuts down gracefully
/// with the group: requests in flight finish, new ones fail with ``TetherError/Code/shutdown``.
public final class TetherClient: Service, Sendable {
    /// The configuration the client was created with.
    public let configuration: ClientConfiguration
    let transport: any ClientTransport
    /// All connections of this client live on this event loop.
    let eventLoop: any EventLoop
    /// Runs tasks on ``eventLoop``; see ``taskExecutor``.
    private let loopExecutor: EventLoopTaskExecutor
    /// The client's one clock: every deadline (requests, heartbeats, handshakes, backoff,
    /// racing, endpoint penalties, retransmissions, message expiry) is an instant on it.
    public let clock: any TetherClock
    let logger: Logger
    let state: TetherLock<State>
    let requestIDs = ManagedAtomic<UInt64>(1)
    let waiterIDs = ManagedAtomic<UInt64>(1)
    let droppedPushCount = ManagedAtomic<Int>(0)
    let pushRouter: PushRouter
    /// The channel subscriptions, on the event loop.
    let channels: ClientChannels
    let eventBroadcaster: Broadcaster<ConnectionEvent>
    let wakeup = Wakeup()
    /// Reliable messaging, if configured.
    let reliable: ReliableEngine?
    /// Where request spans go; `nil`: no tracing.
    let tracer: (any Tracer)?
    /// The client's statistics, metrics and alerts.
    let recorder: ClientStatisticsRecorder

    /// Creates a client. It does not connect until ``run()`` is called.
    /// - Parameters:
    ///   - configuration: Endpoints, identity, timeouts, heartbeat and backoff.
    ///   - transport: How to reach the gateway; TCP by default.
    ///   - eventLoopGroup: Where the connection's I/O runs; NIO's shared group if `nil`.
    ///   - clock: The clock of the run loop: backoff delays, connection racing and endpoint
    ///     penalties; inject a manual clock in tests.
    ///   - tracer: Where a client span per request goes, its context sent in the REQUEST so that
    ///     the gateway's span is its child; `nil`: swift-distributed-tracing's
    ///     `InstrumentationSystem.tracer` as the client is created (no spans if none was
    ///     bootstrapped).
    ///   - metrics: Where the client's metrics (`tether_client_*`, the figures of
    ///     ``statistics``) go; `nil`: swift-metrics' `MetricsSystem.factory`.
    ///   - logger: Where the client logs connection changes and protocol problems.
    /// - Throws: ``TetherError`` with code ``TetherError/Code/invalidConfiguration``.
    public init(
        configuration: ClientConfiguration,
        transport: any ClientTransport = TCPClientTransport(),
        eventLoopGroup: (any EventLoopGroup)? = nil,
        clock: any TetherClock = SystemClock(),
        tracer: (any Tracer)? = nil,
        metrics: (any MetricsFactory)? = nil,
        logger: Logger = Logger(label: "tether.client")
    ) throws(TetherError) {
        do {
            try configuration.validate()
        } catch {
            throw TetherError(code: .invalidConfiguration, message: error.message, cause: error)
        }
        self.configuration = configuration
        let tracer = tracer ?? InstrumentationSystem.tracer
        self.tracer = tracer is NoOpTracer ? nil : tracer
        self.transport = transport
        self.eventLoop = (eventLoopGroup ?? MultiThreadedEventLoopGroup.singleton).next()
        self.clock = clock
        var logger = logger
        logger[metadataKey: "tether.client"] = "\(configuration.clientID)"
        self.logger = logger
        let machine = ConnectivityStateMachine(
            configuration: .init(
                endpoints: configuration.endpoints,
                backoff: configuration.reconnect.backoff,
                stableAfter: configuration.reconnect.stableAfter
            )
        )
        var state = State(machine: machine, endpointPenalty: configuration.connection.failedEndpointPenalty)
        state.natProber = configuration.heartbeat.natProbing.map { NATTimeoutProber(configuration: $0) }
        self.state = TetherLock(state)
        self.pushRouter = PushRouter(bufferSize: configuration.pushes.bufferSize)
        self.eventBroadcaster = Broadcaster(bufferSize: 1024)
        let eventLoop = self.eventLoop
        self.channels = ClientChannels(loop: eventLoop)
        self.loopExecutor = EventLoopTaskExecutor(eventLoop)
        let statistics = ClientStatisticsRecorder(alerts: configuration.alerts.thresholds, clock: clock, factory: metrics)
        self.recorder = statistics
        self.reliable = configuration.reliability.map {
            ReliableEngine(configuration: $0, eventLoop: eventLoop, clock: clock, statistics: statistics, logger: logger)
        }
    }

    /// What the client saw of its connections since it started: attempts, reconnections, round
    /// trips, heartbeat losses, bytes, requests, reliable messages (seed 002's statistics).
    public var statistics: ConnectionStatistics {
        self.recorder.snapshot
    }

    /// An executor that runs tasks on the event loop of the client's connections.
    ///
    /// A request made from a task that prefers it is sent and resumed on the thread that
    /// reads the responses: no thread hop and no wake-up each way. Worth it for code that makes
    /// many requests in a row (a sync loop, a load generator) and does little else; the task
    /// must not block, since it shares the thread with the connection's I/O.
    ///
    /// ```swift
    /// try await withTaskExecutorPreference(client.taskExecutor) {
    ///     for item in items { _ = try await client.request("sync.put", body: item) }
    /// }
    /// ```
    public var taskExecutor: some TaskExecutor { self.loopExecutor }

    /// The current connection state.
    public var connectionState: ConnectionState {
        self.state.withLockedValue { ConnectionState($0.machine.state) }
    }

    /// How many pushes were dropped because a subscriber fell more than
    /// ``ClientConfiguration/Pushes-swift.struct/bufferSize`` pushes behind.
    public var droppedPushes: Int { self.droppedPushCount.load(ordering: .relaxed) }

    /// Connects and keeps the client connected until it shuts down.
    ///
    /// Returns after ``shutdown()`` (or the service group's graceful shutdown) once the
    /// connection has drained. Cancelling the task also shuts the client down.
    /// - Throws: ``TetherError`` with code ``TetherError/Code/notConnected`` if the attempt limit
    ///   of ``ClientConfiguration/Reconnect-swift.struct/backoff`` was reached, or
    ///   ``TetherError/Code/invalidArgument`` if `run()` was already called.
    public func run() async throws {
        let firstRun = self.state.withLockedValue { state in
            guard case .notStarted = state.run else { return false }
            state.run = .running
            return true
        }
        guard firstRun else {
            throw TetherError(code: .invalidArgument, message: "run() was already called on this client")
        }
        try await withTaskCancellationOrGracefulShutdownHandler {
            guard let reliable = self.reliable else {
                try await self.runConnectionLoopFollowingPaths()
                return
            }
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { await reliable.runMaintenance() }
                // `finishRun` ends the maintenance loop once the connection loop is done.
                try await self.runConnectionLoopFollowingPaths()
            }
        } onCancelOrGracefulShutdown: {
            self.shutdown()
        }
    }

    /// Shuts the client down gracefully.
    ///
    /// New requests fail with ``TetherError/Code/shutdown``, requests waiting for a connection
    /// fail at once, requests in flight finish (or time out), then the connection closes and
    /// ``run()`` returns. Calling it again has no effect.
    public func shutdown() {
        let (action, waiters, current) = self.state.withLockedValue { state in
            let action = state.machine.shutdown()
            state.terminalError = state.terminalError ?? TetherError(code: .shutdown, message: "the client is shut down")
            state.ready = nil
            return (action, state.takeWaiters(), state.current)
        }
        waiters.resume(throwing: TetherError(code: .shutdown, message: "the client shut down before a connection was available"))
        if action == .closeConnection {
            current?.drain()
        }
        self.wakeup.signal()
    }
}
