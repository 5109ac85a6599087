import Logging
import NIOConcurrencyHelpers
import NIOCore
import TetherCore

/// The client's run loop: connect, serve the connection until it closes, back off, repeat,
/// as ``ConnectivityStateMachine`` decides.
extension TetherClient {
    /// Connects, reconnects, and returns once the client shut down. ``run()`` checked that it runs once.
    func runConnectionLoop() async throws {
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
                action = self.state.withLockedValue { state in
                    // A network that came back cut the delay short: its decision stands.
                    if let pending = state.takePendingAction() {
                        self.wakeup.reset()
                        return pending
                    }
                    return state.machine.backoffElapsed()
                }

            case .waitForPath(let next):
                self.logger.info("no network; waiting for one", metadata: ["next": "\(next)"])
                self.eventBroadcaster.yield(.waitingForNetwork(next: next))
                var decided: ConnectivityStateMachine.Action?
                while decided == nil {
                    await self.wakeup.wait()
                    decided = self.state.withLockedValue { state in
                        if let pending = state.takePendingAction() { return pending }
                        if case .shutDown = state.machine.state { return .stop }
                        return nil
                    }
                    if decided == nil, Task.isCancelled { decided = .stop }
                }
                action = decided!

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
            }
        }
    }

    /// The connection loop, with the configured path monitor's reports fed to it.
    func runConnectionLoopFollowingPaths() async throws {
        guard let monitor = self.configuration.pathMonitor else {
            try await self.runConnectionLoop()
            return
        }
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { await self.follow(monitor) }
            do {
                try await self.runConnectionLoop()
            } catch {
                group.cancelAll()
                throw error
            }
            group.cancelAll()
        }
    }

    /// Feeds the monitor's paths to the state machine and carries out what it decides.
    private func follow(_ monitor: any NetworkPathMonitor) async {
        for await path in monitor.paths() {
            let (action, connection) = self.state.withLockedValue { state -> (ConnectivityStateMachine.PathAction, ClientConnection?) in
                let action = state.machine.pathChanged(path)
                if case .connect(let endpoint, let attempt) = action { state.pendingAction = .connect(endpoint, attempt: attempt) }
                return (action, state.current)
            }
            self.logger.debug("network path", metadata: ["path": "\(path)", "action": "\(action)"])
            switch action {
            case .connect:
                self.wakeup.signal()  // the run loop is waiting: for a path, or in a backoff
            case .closeConnection:
                self.logger.info("the network changed; reconnecting", metadata: ["path": "\(path)"])
                connection?.close()
            case .none:
                break
            }
        }
    }

    /// Connects, serves the connection until it closes, and returns what to do next.
    private func attempt(_ endpoint: Endpoint, attempt: Int) async -> ConnectivityStateMachine.Action {
        self.logger.debug("connecting", metadata: ["endpoint": "\(endpoint)", "attempt": "\(attempt)"])
        self.eventBroadcaster.yield(.connecting(endpoint, attempt: attempt))
        // Backoff counts from the start of the attempt, on the injected clock.
        let began = self.clock.now
        let connection: ClientConnection
        do {
            connection = try await self.race(from: endpoint)
        } catch {
            let elapsed = began.duration(to: self.clock.now)
            let error = TransportErrors.connectFailure(error, endpoint: endpoint)
            self.logger.info("connection attempt failed", metadata: ["endpoint": "\(endpoint)", "error": "\(error)"])
            self.eventBroadcaster.yield(.connectFailed(endpoint, error))
            return self.state.withLockedValue { state in
                state.lastError = error
                return state.machine.connectFailed(after: elapsed)
            }
        }

        let (next, waiters) = self.state.withLockedValue { state in
            let next = state.machine.connectSucceeded(via: connection.endpoint)
            guard next == .serve else { return (next, State.Waiters()) }
            state.ready = connection
            state.current = connection
            return (next, state.takeWaiters())
        }
        // A mode set while the handshake was under way reached no connection: catch up. Later
        // changes reach this one through setHeartbeatMode.
        connection.refreshHeartbeatMode()
        if next == .closeConnection {
            // Shut down while connecting.
            connection.close()
            _ = try? await connection.closeFuture.get()
            return self.state.withLockedValue { $0.machine.connectionClosed(uptime: .zero) }
        }
        let negotiated = connection.negotiated
        if let reliable = self.reliable {
            if negotiated.features.contains(.reliableDelivery), let epoch = negotiated.deliveryEpoch {
                connection.enqueue(reliable.attach(connection, deliveryEpoch: epoch, resume: connection.resume))
            } else {
                self.logger.warning("the gateway does not offer reliable delivery; messages wait in the outbox")
            }
        }
        self.logger.info(
            "connected",
            metadata: [
                "endpoint": "\(connection.endpoint)", "connection": "\(negotiated.connectionID)", "version": "\(negotiated.version)",
            ]
        )
        self.eventBroadcaster.yield(.connected(connection.endpoint, version: negotiated.version, connectionID: negotiated.connectionID))
        waiters.resume(returning: connection)

        let closure = await self.serve(connection)
        self.reliable?.detach(connection)
        // Update the state before telling anyone, so that a subscriber reacting to the event
        // already sees the client as disconnected.
        let afterClose = self.state.withLockedValue { state in
            if state.ready === connection { state.ready = nil }
            state.current = nil
            return state.machine.connectionClosed(uptime: closure.uptime)
        }
        self.logger.info("disconnected", metadata: ["endpoint": "\(connection.endpoint)", "reason": "\(closure.reason)"])
        self.eventBroadcaster.yield(.disconnected(closure.reason))
        return afterClose
    }

    /// Waits until `connection` closes, keeping its credentials fresh meanwhile if they expire.
    private func serve(_ connection: ClientConnection) async -> ConnectionClosure {
        await withTaskGroup { group in
            if let validFor = connection.credentialValidFor, case .expiring(let provider) = self.configuration.authentication {
                group.addTask { await self.keepCredentialsFresh(validFor: validFor, provider: provider) }
            }
            let closure = (try? await connection.closeFuture.get()) ?? ConnectionClosure(reason: .closedByPeer, uptime: .zero)
            group.cancelAll()
            return closure
        }
    }

    /// Until cancelled (the connection closed), fetches a fresh token when 80 % of the current
    /// one's validity has passed and sends it on the connection (the `$auth` request). A
    /// refusal or a failure is tried again after a tenth of the validity; if the token runs out
    /// meanwhile, the gateway ends the connection and the next one starts with a fresh token.
    private func keepCredentialsFresh(validFor: Duration, provider: @Sendable () async throws -> ClientConfiguration.Credential) async {
        var wait = validFor * 0.8
        while !Task.isCancelled {
            do {
                try await self.clock.sleep(for: wait)
            } catch {
                return  // cancelled
            }
            do {
                let credential = try await provider()
                _ = try await self.request(Self.refreshCredentialsMethod, body: credential.token)
                self.logger.debug("credentials refreshed on the open connection", metadata: ["valid-for": "\(credential.validFor)"])
                wait = credential.validFor * 0.8
            } catch {
                if Task.isCancelled { return }
                self.logger.warning("could not refresh the credentials; trying again", metadata: ["error": "\(error)"])
                wait = max(validFor / 10, .seconds(1))
            }
        }
    }

    /// The request that replaces a connection's credentials (PROTOCOL.md, section 5.1).
    static let refreshCredentialsMethod = "$auth"

    /// One connection attempt, racing connections as ``ClientConfiguration/Connection-swift.struct/raceDelay``
    /// says: the first to complete the handshake wins, the others are closed.
    ///
    /// A new racer starts every `raceDelay` while none has answered, fewer than `maximumRacers`
    /// are open and the connect timeout has not passed since the attempt began; one that fails
    /// fast (refused) makes room for the next endpoint at once. Endpoints that refused recently
    /// go last. The attempt fails when every racer failed and no more may start.
    private func race(from first: Endpoint) async throws -> ClientConnection {
        let settings = self.configuration.connection
        guard let raceDelay = settings.raceDelay else { return try await self.establish(first) }
        let order = self.racingOrder(from: first)
        let deadline = self.clock.now.advanced(by: settings.connectTimeout)

        enum Outcome: Sendable {
            case won(ClientConnection)
            case failed(Endpoint, any Error, fast: Bool)
            case tick
        }
        return try await withThrowingTaskGroup(of: Outcome.self) { group in
            var started = 0
            var open = 0
            var lastError: (any Error)?
            var winner: ClientConnection?
            var done = false
            let clock = self.clock
            func start() {
                let endpoint = order[started % order.count]
                started += 1
                open += 1
                group.addTask {
                    let began = clock.now
                    do {
                        return .won(try await self.establish(endpoint))
                    } catch {
                        return .failed(endpoint, error, fast: began.duration(to: clock.now) < raceDelay)
                    }
                }
            }
            func scheduleTick() {
                group.addTask {
                    try? await clock.sleep(for: raceDelay)
                    return .tick
                }
            }
            start()
            scheduleTick()
            while let outcome = try await group.next() {
                switch outcome {
                case .won(let connection):
                    open -= 1
                    if winner == nil {
                        winner = connection
                        done = true
                        group.cancelAll()  // the other racers close their connections
                    } else {
                        connection.close()
                    }
                case .failed(let endpoint, let error, let fast):
                    open -= 1
                    guard !done else { break }  // a loser, cancelled
                    lastError = error
                    if fast { self.penalize(endpoint) }
                    // A refusal frees its place for an endpoint not tried yet in this attempt.
                    if fast, started < order.count, clock.now < deadline { start() }
                case .tick:
                    // (With every racer failed and every endpoint tried, `done` is already set.)
                    guard !done, clock.now < deadline else { break }
                    if open < settings.maximumRacers { start() }
                    scheduleTick()
                }
                if !done, open == 0, started >= order.count, lastError != nil {
                    // Every racer failed and every endpoint has been tried: the attempt failed.
                    done = true
                    group.cancelAll()
                }
            }
            if let winner {
                if started > 1 {
                    self.logger.debug("won a connection race", metadata: ["endpoint": "\(winner.endpoint)", "racers": "\(started)"])
                }
                return winner
            }
            throw lastError ?? TetherError(code: .notConnected, message: "no connection to \(first) within the connect timeout")
        }
    }

    /// The endpoints in the order an attempt starting at `first` tries them: the list from
    /// `first` on, those that refused recently last.
    private func racingOrder(from first: Endpoint) -> [Endpoint] {
        let now = self.clock.now
        return self.state.withLockedValue { $0.penalties.order(self.configuration.endpoints, from: first, at: now) }
    }

    private func penalize(_ endpoint: Endpoint) {
        guard self.configuration.endpoints.count > 1 else { return }
        let now = self.clock.now
        self.state.withLockedValue { $0.penalties.penalize(endpoint, at: now) }
    }

    /// Opens a transport connection to `endpoint` and completes the handshake; cancelling the
    /// task closes the connection.
    private func establish(_ endpoint: Endpoint) async throws -> ClientConnection {
        let token: ByteBuffer?
        var validFor: Duration?
        switch self.configuration.authentication {
        case .none: token = nil
        case .token(let value): token = value
        case .provider(let provider): token = try await provider()
        case .expiring(let provider):
            let credential = try await provider()
            token = credential.token
            validFor = credential.validFor
        }
        let connectionConfiguration = self.configuration.connection
        var hello = Frame.Hello(
            versions: Handshake.supportedVersions,
            features: connectionConfiguration.checksums ? [.checksum] : [],
            maxBodySize: UInt32(connectionConfiguration.maxBodySize),
            clientID: self.configuration.clientID,
            authToken: token,
            userAgent: self.configuration.userAgent
        )
        if let reliable = self.reliable {
            let fields = try await reliable.helloFields()
            hello.features.formUnion([.reliableDelivery, .messageAnswers])
            hello.outboxEpoch = fields.outboxEpoch
            hello.resume = fields.resume
        }
        let handlerConfiguration = ClientConnectionStateMachine.Configuration(
            hello: hello,
            handshakeTimeout: connectionConfiguration.handshakeTimeout,
            heartbeat: self.configuration.heartbeat.policy,
            reliability: self.configuration.reliability.map { .init(window: $0.window, retransmission: $0.retransmission) }
        )
        let callbacks = ClientConnectionHandler.Callbacks(
            push: { [weak self] push in self?.deliver(push) },
            goAway: { [weak self] goAway in self?.goAwayReceived(goAway) },
            reliable: self.reliable.map { engine in
                ReliableCallbacks(
                    acknowledged: { engine.acknowledged($0) },
                    sent: { engine.sent($0) },
                    delivery: { engine.receive($0, epoch: $1) }
                )
            },
            heartbeatPreference: { [weak self] in
                guard let self else { return .init(mode: .foreground) }
                return self.state.withLockedValue { state in
                    .init(mode: state.heartbeatMode, learnedInterval: state.natProber?.interval(for: state.network))
                }
            },
            idleProbe: { [weak self] probe, answered in self?.idleProbeSettled(probe, answered: answered) }
        )
        // Cancelling the task (a lost connection race) closes the channel, whatever stage it is at.
        let cancellation = NIOLockedValueBox<(cancelled: Bool, channel: (any Channel)?)>((false, nil))
        return try await withTaskCancellationHandler {
            try await self.establish(
                endpoint,
                handlerConfiguration: handlerConfiguration,
                callbacks: callbacks,
                cancellation: cancellation,
                credentialValidFor: validFor
            )
        } onCancel: {
            let channel = cancellation.withLockedValue { state -> (any Channel)? in
                state.cancelled = true
                return state.channel
            }
            channel?.close(promise: nil)
        }
    }

    private func establish(
        _ endpoint: Endpoint,
        handlerConfiguration: ClientConnectionStateMachine.Configuration,
        callbacks: ClientConnectionHandler.Callbacks,
        cancellation: NIOLockedValueBox<(cancelled: Bool, channel: (any Channel)?)>,
        credentialValidFor: Duration?
    ) async throws -> ClientConnection {
        let connectionConfiguration = self.configuration.connection
        let established = self.eventLoop.makePromise(of: Handshake.Negotiated.self)
        let closed = self.eventLoop.makePromise(of: ConnectionClosure.self)
        let handlerBox = NIOLockedValueBox<NIOLoopBound<ClientConnectionHandler>?>(nil)
        let logger = self.logger
        let clock = self.clock

        let channel: any Channel
        do {
            channel = try await self.transport.connect(
                to: endpoint,
                timeout: connectionConfiguration.connectTimeout,
                eventLoop: self.eventLoop
            ) { channel, framing in
                let cancelled = cancellation.withLockedValue { state in
                    state.channel = channel
                    return state.cancelled
                }
                if cancelled { throw CancellationError() }
                let handler = ClientConnectionHandler(
                    configuration: handlerConfiguration,
                    maxInboundBodySize: connectionConfiguration.maxBodySize,
                    framing: framing,
                    clock: clock,
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
                resume: handlerConfiguration.hello.resume,
                negotiated: negotiated,
                closeFuture: closed.futureResult,
                credentialValidFor: credentialValidFor
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
            if state.machine.goAwayReceived(retryAfter: goAway.retryAfter, alternate: alternate) {
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
        self.reliable?.finish()
    }

    private func failWaiters(with error: TetherError) {
        let waiters = self.state.withLockedValue { $0.takeWaiters() }
        waiters.resume(throwing: error)
    }
}
