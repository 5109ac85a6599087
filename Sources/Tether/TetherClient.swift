import Atomics
public import Logging
import NIOConcurrencyHelpers
public import NIOCore
import NIOPosix
public import ServiceLifecycle
import TetherCore
public import TetherNIO

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
    let clock: any Clock<Duration>
    let logger: Logger
    let state: NIOLockedValueBox<State>
    let requestIDs = ManagedAtomic<UInt64>(1)
    let waiterIDs = ManagedAtomic<UInt64>(1)
    let droppedPushCount = ManagedAtomic<Int>(0)
    let pushRouter: PushRouter
    let eventBroadcaster: Broadcaster<ConnectionEvent>
    let wakeup = Wakeup()

    /// Creates a client. It does not connect until ``run()`` is called.
    /// - Parameters:
    ///   - configuration: Endpoints, identity, timeouts, heartbeat and backoff.
    ///   - transport: How to reach the gateway; TCP by default.
    ///   - eventLoopGroup: Where the connection's I/O runs; NIO's shared group if `nil`.
    ///   - clock: The clock backoff delays are measured with; inject a manual clock in tests.
    ///   - logger: Where the client logs connection changes and protocol problems.
    /// - Throws: ``TetherError`` with code ``TetherError/Code/invalidConfiguration``.
    public init(
        configuration: ClientConfiguration,
        transport: any ClientTransport = TCPClientTransport(),
        eventLoopGroup: (any EventLoopGroup)? = nil,
        clock: any Clock<Duration> = ContinuousClock(),
        logger: Logger = Logger(label: "tether.client")
    ) throws(TetherError) {
        do {
            try configuration.validate()
        } catch {
            throw TetherError(code: .invalidConfiguration, message: error.message, cause: error)
        }
        self.configuration = configuration
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
        self.state = NIOLockedValueBox(State(machine: machine))
        self.pushRouter = PushRouter(bufferSize: configuration.pushes.bufferSize)
        self.eventBroadcaster = Broadcaster(bufferSize: 1024)
    }

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
        try await withTaskCancellationOrGracefulShutdownHandler {
            try await self.runConnectionLoop()
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

    // MARK: The connection loop

    private func runConnectionLoop() async throws {
        let firstRun = self.state.withLockedValue { state in
            guard case .notStarted = state.run else { return false }
            state.run = .running
            return true
        }
        guard firstRun else {
            throw TetherError(code: .invalidArgument, message: "run() was already called on this client")
        }
        defer { self.finishRun() }

        var action = self.state.withLockedValue { $0.machine.start() }
        while true {
            switch action {
            case .connect(let endpoint, let attempt):
                action = await self.attempt(endpoint, attempt: attempt)

            case .backOff(let delay, let next):
                self.logger.debug("backing off", metadata: ["delay": "\(delay)", "next": "\(next)"])
                self.eventBroadcaster.yield(.backingOff(delay, next: next))
                await self.sleep(for: delay)
                action = self.state.withLockedValue { $0.machine.backoffElapsed() }

            case .fail(let attempts):
                let error = self.state.withLockedValue { state in
                    let error = TetherError(
                        code: .notConnected,
                        message: "gave up after \(attempts) failed connection attempts; the last: \(state.lastError?.message ?? "unknown")",
                        cause: state.lastError
                    )
                    state.terminalError = error
                    return error
                }
                self.failWaiters(with: error)
                self.logger.error("giving up", metadata: ["attempts": "\(attempts)"])
                self.eventBroadcaster.yield(.failed(error))
                throw error

            case .stop:
                return

            case .none, .stopDispatching, .closeConnection:
                assertionFailure("the run loop got \(action)")
                return
            }
        }
    }

    /// Connects, serves the connection until it closes, and returns what to do next.
    private func attempt(_ endpoint: Endpoint, attempt: Int) async -> ConnectivityStateMachine.Action {
        self.logger.debug("connecting", metadata: ["endpoint": "\(endpoint)", "attempt": "\(attempt)"])
        self.eventBroadcaster.yield(.connecting(endpoint, attempt: attempt))
        let connection: ClientConnection
        do {
            connection = try await self.establish(endpoint)
        } catch {
            let error =
                (error as? TetherError)
                ?? TetherError(
                    code: .notConnected,
                    message: "could not connect to \(endpoint): \(TransportErrors.describe(error))",
                    cause: error
                )
            self.logger.info("connection attempt failed", metadata: ["endpoint": "\(endpoint)", "error": "\(error)"])
            self.eventBroadcaster.yield(.connectFailed(endpoint, error))
            return self.state.withLockedValue { state in
                state.lastError = error
                return state.machine.connectFailed()
            }
        }

        let (next, waiters) = self.state.withLockedValue { state in
            let next = state.machine.connectSucceeded()
            guard next == .none else { return (next, State.Waiters()) }
            state.ready = connection
            state.current = connection
            return (next, state.takeWaiters())
        }
        if next == .closeConnection {
            // Shut down while connecting.
            connection.close()
            _ = try? await connection.closeFuture.get()
            return self.state.withLockedValue { $0.machine.connectionClosed(uptime: .zero) }
        }
        let negotiated = connection.negotiated
        self.logger.info(
            "connected",
            metadata: ["endpoint": "\(endpoint)", "connection": "\(negotiated.connectionID)", "version": "\(negotiated.version)"]
        )
        self.eventBroadcaster.yield(.connected(endpoint, version: negotiated.version, connectionID: negotiated.connectionID))
        waiters.resume(returning: connection)

        let closure = (try? await connection.closeFuture.get()) ?? ConnectionClosure(reason: .closedByPeer, uptime: .zero)
        // Update the state before telling anyone, so that a subscriber reacting to the event
        // already sees the client as disconnected.
        let afterClose = self.state.withLockedValue { state in
            if state.ready === connection { state.ready = nil }
            state.current = nil
            return state.machine.connectionClosed(uptime: closure.uptime)
        }
        self.logger.info("disconnected", metadata: ["endpoint": "\(endpoint)", "reason": "\(closure.reason)"])
        self.eventBroadcaster.yield(.disconnected(closure.reason))
        return afterClose
    }

    /// Opens a transport connection to `endpoint` and completes the handshake.
    private func establish(_ endpoint: Endpoint) async throws -> ClientConnection {
        let token: ByteBuffer?
        switch self.configuration.authentication {
        case .none: token = nil
        case .token(let value): token = value
        case .provider(let provider): token = try await provider()
        }
        let connectionConfiguration = self.configuration.connection
        let hello = Frame.Hello(
            versions: Handshake.supportedVersions,
            features: connectionConfiguration.checksums ? [.checksum] : [],
            maxBodySize: UInt32(connectionConfiguration.maxBodySize),
            clientID: self.configuration.clientID,
            authToken: token,
            userAgent: self.configuration.userAgent
        )
        let handlerConfiguration = ClientConnectionHandler.Configuration(
            hello: hello,
            handshakeTimeout: TimeAmount(connectionConfiguration.handshakeTimeout),
            heartbeatInterval: self.configuration.heartbeat.interval.map { TimeAmount($0) },
            heartbeatTimeout: TimeAmount(self.configuration.heartbeat.timeout),
            maxInboundBodySize: connectionConfiguration.maxBodySize
        )
        let callbacks = ClientConnectionHandler.Callbacks(
            push: { [weak self] push in self?.deliver(push) },
            goAway: { [weak self] goAway in self?.goAwayReceived(goAway) }
        )
        let established = self.eventLoop.makePromise(of: Handshake.Negotiated.self)
        let closed = self.eventLoop.makePromise(of: ConnectionClosure.self)
        let handlerBox = NIOLockedValueBox<NIOLoopBound<ClientConnectionHandler>?>(nil)
        let logger = self.logger

        let channel: any Channel
        do {
            channel = try await self.transport.connect(
                to: endpoint,
                timeout: connectionConfiguration.connectTimeout,
                eventLoop: self.eventLoop
            ) { channel in
                let handler = ClientConnectionHandler(
                    configuration: handlerConfiguration,
                    callbacks: callbacks,
                    established: established,
                    closed: closed,
                    logger: logger
                )
                try channel.pipeline.syncOperations.addHandler(handler)
                handlerBox.withLockedValue { $0 = NIOLoopBound(handler, eventLoop: channel.eventLoop) }
            }
        } catch {
            // The handler may never have existed; settle its promises so none leaks.
            established.fail(error)
            closed.succeed(ConnectionClosure(reason: .transportError("\(error)"), uptime: .zero))
            throw error
        }
        guard let handler = handlerBox.withLockedValue({ $0 }) else {
            channel.close(promise: nil)
            throw TetherError(code: .notConnected, message: "the transport did not run the channel initializer")
        }
        do {
            let negotiated = try await established.futureResult.get()
            return ClientConnection(
                channel: channel,
                handler: handler,
                endpoint: endpoint,
                negotiated: negotiated,
                closeFuture: closed.futureResult
            )
        } catch {
            channel.close(promise: nil)
            _ = try? await closed.futureResult.get()
            throw error
        }
    }

    /// The gateway sent GOAWAY: route new requests to the next connection.
    private func goAwayReceived(_ goAway: Frame.GoAway) {
        let alternate = goAway.alternateEndpoint.flatMap { try? Endpoint(parsing: $0) }
        if goAway.alternateEndpoint != nil && alternate == nil {
            self.logger.warning("ignoring an invalid alternate endpoint in GOAWAY", metadata: ["endpoint": "\(goAway.alternateEndpoint!)"])
        }
        self.state.withLockedValue { state in
            if state.machine.goAwayReceived(retryAfter: goAway.retryAfter, alternate: alternate) == .stopDispatching {
                state.ready = nil
            }
        }
    }

    /// Sleeps on the injected clock; returns early on ``shutdown()``.
    private func sleep(for delay: Duration) async {
        guard delay > .zero else { return }
        await withTaskGroup(of: Void.self) { group in
            let clock = self.clock
            group.addTask { try? await clock.sleep(for: delay) }
            group.addTask { await self.wakeup.wait() }
            await group.next()
            group.cancelAll()
        }
    }

    private func finishRun() {
        let waiters = self.state.withLockedValue { state in
            state.run = .finished
            state.terminalError = state.terminalError ?? TetherError(code: .shutdown, message: "the client is shut down")
            state.ready = nil
            return state.takeWaiters()
        }
        waiters.resume(throwing: TetherError(code: .shutdown, message: "the client stopped"))
        self.pushRouter.finish()
        self.eventBroadcaster.finish()
    }

    private func failWaiters(with error: TetherError) {
        let waiters = self.state.withLockedValue { $0.takeWaiters() }
        waiters.resume(throwing: error)
    }
}
