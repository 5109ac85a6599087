import Logging
import NIOCore
import TetherCore
import TetherNIO

// Establishing a connection: racing endpoints, the transport, the handshake.
extension TetherClient {
    /// One connection attempt, racing connections as ``ClientConfiguration/Connection-swift.struct/raceDelay``
    /// says: the first to complete the handshake wins, the others are closed.
    ///
    /// A new racer starts every `raceDelay` while none has answered, fewer than `maximumRacers`
    /// are open and the connect timeout has not passed since the attempt began; one that fails
    /// fast (refused) makes room for the next endpoint at once. Endpoints that refused recently
    /// go last. The attempt fails when every racer failed and no more may start.
    func race(from first: Endpoint) async throws -> ClientConnection {
        let settings = self.configuration.connection
        let order = self.racingOrder(from: first)
        // One connection at a time: still not to an endpoint that failed recently, if another is there.
        guard let raceDelay = settings.raceDelay else {
            let endpoint = order.first ?? first
            do {
                return try await self.establish(endpoint)
            } catch {
                self.noteFailure(of: endpoint, error)
                throw error
            }
        }
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
                    self.noteFailure(of: endpoint, error)
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

    /// Notes that the network (not the gateway's answer) failed a connection to `endpoint`:
    /// if another endpoint then connects, this one is reported blocked.
    private func noteFailure(of endpoint: Endpoint, _ error: any Error) {
        let error = TransportErrors.connectFailure(error, endpoint: endpoint)
        switch error.code {
        case .notConnected, .timedOut, .tlsFailed, .webSocketUpgradeFailed, .proxyFailed, .httpStreamFailed:
            self.state.withLockedValue { $0.failedSinceConnected[endpoint] = error }
        default:
            break  // a refusal by the gateway, a pin mismatch, a bad configuration: not a blocked path
        }
    }

    /// The endpoints in the order an attempt starting at `first` tries them: the list from
    /// `first` on, those that refused recently last.
    private func racingOrder(from first: Endpoint) -> [Endpoint] {
        let now = self.clock.now
        return self.state.withLockedValue { $0.penalties.order(self.configuration.endpoints, from: first, at: now) }
    }

    func penalize(_ endpoint: Endpoint) {
        guard self.configuration.endpoints.count > 1 else { return }
        let now = self.clock.now
        self.state.withLockedValue { $0.penalties.penalize(endpoint, at: now) }
    }

    /// Opens a transport connection to `endpoint` and completes the handshake; cancelling the
    /// task closes the connection.
    /// - Parameters:
    ///   - probe: A connection that only checks that the gateway answers there: no reliable
    ///     delivery or resume in its HELLO, its pushes and GOAWAY ignored; the caller closes it
    ///     at once.
    ///   - limit: A shorter connect and handshake timeout than the configured ones, if any.
    func establish(_ endpoint: Endpoint, probe: Bool = false, limit: Duration? = nil) async throws -> ClientConnection {
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
        func limited(_ timeout: Duration) -> Duration { limit.map { min($0, timeout) } ?? timeout }
        var hello = Frame.Hello(
            versions: Handshake.supportedVersions,
            features: connectionConfiguration.checksums ? [.checksum] : [],
            maxBodySize: UInt32(connectionConfiguration.maxBodySize),
            clientID: self.configuration.clientID,
            authToken: token,
            userAgent: self.configuration.userAgent
        )
        if connectionConfiguration.compression != nil { hello.features.insert(.compression) }
        hello.features.insert(.traceContext)
        if !probe { hello.features.insert(.channels) }
        if !probe, let reliable = self.reliable {
            let fields = try await reliable.helloFields()
            hello.features.formUnion([.reliableDelivery, .messageAnswers, .sharedDeliveries])
            hello.outboxEpoch = fields.outboxEpoch
            hello.resume = fields.resume
        }
        let handlerConfiguration = ClientConnectionStateMachine.Configuration(
            hello: hello,
            handshakeTimeout: limited(connectionConfiguration.handshakeTimeout),
            heartbeat: self.configuration.heartbeat.policy,
            reliability: probe ? nil : self.configuration.reliability.map { .init(window: $0.window, retransmission: $0.retransmission) },
            // With one endpoint there is nowhere else to go: the heartbeat still guards the link.
            failingLink: !probe && self.configuration.endpoints.count > 1 ? try connectionConfiguration.failingLink?.policy : nil
        )
        let callbacks: ClientConnectionHandler.Callbacks
        if probe {
            callbacks = ClientConnectionHandler.Callbacks(push: { _ in }, goAway: { _ in }, reliable: nil)
        } else {
            callbacks = ClientConnectionHandler.Callbacks(
                push: { [weak self] push in self?.deliver(push) },
                goAway: { [weak self] goAway in self?.goAwayReceived(goAway) },
                channel: { [weak self] payload in self?.channels.received(payload) },
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
                idleProbe: { [weak self] probe, answered in self?.idleProbeSettled(probe, answered: answered) },
                statistics: self.recorder,
                alert: { [weak self] alert in self?.eventBroadcaster.yield(.alert(alert)) }
            )
        }
        // Cancelling the task (a lost connection race) closes the channel, whatever stage it is at.
        let cancellation = TetherLock<(cancelled: Bool, channel: (any Channel)?)>((false, nil))
        return try await withTaskCancellationHandler {
            try await self.establish(
                endpoint,
                handlerConfiguration: handlerConfiguration,
                callbacks: callbacks,
                cancellation: cancellation,
                credentialValidFor: validFor,
                connectTimeout: limited(connectionConfiguration.connectTimeout)
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
        cancellation: TetherLock<(cancelled: Bool, channel: (any Channel)?)>,
        credentialValidFor: Duration?,
        connectTimeout: Duration
    ) async throws -> ClientConnection {
        let established = self.eventLoop.makePromise(of: Handshake.Negotiated.self)
        let closed = self.eventLoop.makePromise(of: ConnectionClosure.self)
        let handlerBox = TetherLock<NIOLoopBound<ClientConnectionHandler>?>(nil)
        let logger = self.logger
        let clock = self.clock

        let channel: any Channel
        do {
            channel = try await self.transport.connect(
                to: endpoint,
                timeout: connectTimeout,
                eventLoop: self.eventLoop
            ) { channel, framing in
                let cancelled = cancellation.withLockedValue { state in
                    state.channel = channel
                    return state.cancelled
                }
                if cancelled { throw CancellationError() }
                let handler = ClientConnectionHandler(
                    configuration: handlerConfiguration,
                    maxInboundBodySize: self.configuration.connection.maxBodySize,
                    compression: self.configuration.connection.compression,
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
}
