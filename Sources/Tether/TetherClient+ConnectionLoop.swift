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

            case .revoked:
                let error = self.state.withLockedValue { state in
                    let error = TetherError(
                        code: .notConnected,
                        message:
                            "the gateway revoked this client's access (GOAWAY revoked: \(state.revocation ?? "")); it no longer connects"
                    )
                    state.terminalError = error
                    return error
                }
                self.failWaiters(with: error)
                self.logger.error("the gateway revoked this client's access; no longer connecting")
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
                if path.identity != state.network { state.failedSinceConnected = [:] }  // failures elsewhere say nothing here
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
        self.recorder.attemptStarted()
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
            self.recorder.attemptFailed()
            return self.state.withLockedValue { state in
                state.lastError = error
                return state.machine.connectFailed(after: elapsed)
            }
        }

        let (next, waiters, blocked) = self.state.withLockedValue { state in
            let next = state.machine.connectSucceeded(via: connection.endpoint)
            let blocked = state.failedSinceConnected.filter { $0.key != connection.endpoint }
            state.failedSinceConnected = [:]
            guard next == .serve else { return (next, State.Waiters(), blocked) }
            state.ready = connection
            state.current = connection
            return (next, state.takeWaiters(), blocked)
        }
        for (endpoint, error) in blocked.sorted(by: { "\($0.key)" < "\($1.key)" }) {
            self.logger.info("endpoint blocked on this network", metadata: ["endpoint": "\(endpoint)", "error": "\(error)"])
            self.eventBroadcaster.yield(.endpointBlocked(endpoint, error))
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
                reliable.attach(connection, deliveryEpoch: epoch, resume: connection.resume)
            } else {
                self.logger.warning("the gateway does not offer reliable delivery; messages wait in the outbox")
            }
        }
        self.channels.attach(connection)
        self.logger.info(
            "connected",
            metadata: [
                "endpoint": "\(connection.endpoint)", "connection": "\(negotiated.connectionID)", "version": "\(negotiated.version)",
            ]
        )
        self.eventBroadcaster.yield(.connected(connection.endpoint, version: negotiated.version, connectionID: negotiated.connectionID))
        if let alert = self.recorder.connected(over: connection.endpoint.transport) { self.eventBroadcaster.yield(.alert(alert)) }
        waiters.resume(returning: connection)

        let closure = await self.serve(connection)
        self.reliable?.detach(connection)
        self.channels.detach(connection)
        if case .linkFailing = closure.reason {
            // Up but failing: the next attempt tries the other endpoints first.
            self.penalize(connection.endpoint)
        }
        // Update the state before telling anyone, so that a subscriber reacting to the event
        // already sees the client as disconnected.
        let afterClose = self.state.withLockedValue { state in
            if state.ready === connection { state.ready = nil }
            state.current = nil
            return state.machine.connectionClosed(uptime: closure.uptime)
        }
        self.logger.info("disconnected", metadata: ["endpoint": "\(connection.endpoint)", "reason": "\(closure.reason)"])
        self.eventBroadcaster.yield(.disconnected(closure.reason))
        if let alert = self.recorder.disconnected(closure.reason) { self.eventBroadcaster.yield(.alert(alert)) }
        return afterClose
    }

    /// Waits until `connection` closes, keeping its credentials fresh meanwhile if they expire,
    /// and probing better endpoints if it serves a fallback.
    private func serve(_ connection: ClientConnection) async -> ConnectionClosure {
        await withTaskGroup { group in
            if let validFor = connection.credentialValidFor, case .expiring(let provider) = self.configuration.authentication {
                group.addTask { await self.keepCredentialsFresh(validFor: validFor, provider: provider) }
            }
            let endpoints = self.configuration.endpoints
            if let interval = self.configuration.connection.moveUpInterval, let index = endpoints.firstIndex(of: connection.endpoint),
                index > 0
            {
                group.addTask { await self.moveUp(from: connection, to: Array(endpoints[..<index]), every: interval) }
            }
            let closure = (try? await connection.closeFuture.get()) ?? ConnectionClosure(reason: .closedByPeer, uptime: .zero)
            group.cancelAll()
            return closure
        }
    }

    /// Until cancelled (the connection closed), probes `better` (in order) every `interval`;
    /// when one answers, drains `connection` so that the next one goes there.
    private func moveUp(from connection: ClientConnection, to better: [Endpoint], every interval: Duration) async {
        while !Task.isCancelled {
            do {
                try await self.clock.sleep(for: interval)
            } catch {
                return  // cancelled
            }
            for endpoint in better where !Task.isCancelled {
                // An endpoint that cannot answer within the interval is no better: give up on a
                // probe then, so that the next one (after a block is lifted) is not held up.
                guard await self.probe(endpoint, within: interval) else { continue }
                let moving = self.state.withLockedValue { state in
                    guard state.current === connection, state.machine.goAwayReceived(retryAfter: .zero, alternate: endpoint) else {
                        return false
                    }
                    if state.ready === connection { state.ready = nil }
                    state.penalties.forgive(endpoint)  // it answered: the next attempt starts there
                    return true
                }
                guard moving else { return }
                self.logger.info("a better endpoint answers; moving up", metadata: ["from": "\(connection.endpoint)", "to": "\(endpoint)"])
                connection.drain(for: .movingUp(to: endpoint))
                return
            }
        }
    }

    /// Whether a gateway answers at `endpoint` now: a probe connection completes the handshake
    /// there within `limit` (a port that accepts and then swallows everything, a proxy that
    /// buffers, do not pass), and is closed at once.
    private func probe(_ endpoint: Endpoint, within limit: Duration) async -> Bool {
        do {
            let connection = try await self.establish(endpoint, probe: true, limit: limit)
            connection.close()
            return true
        } catch {
            self.logger.debug("a better endpoint is still unreachable", metadata: ["endpoint": "\(endpoint)", "error": "\(error)"])
            return false
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

    /// The gateway sent GOAWAY: route new requests to the next connection.
    func goAwayReceived(_ goAway: Frame.GoAway) {
        let alternate = goAway.alternateEndpoint.flatMap { try? Endpoint(parsing: $0) }
        if goAway.alternateEndpoint != nil && alternate == nil {
            self.logger.warning("ignoring an invalid alternate endpoint in GOAWAY", metadata: ["endpoint": "\(goAway.alternateEndpoint!)"])
        }
        self.state.withLockedValue { state in
            let revoked = goAway.reason == .revoked
            if revoked { state.revocation = goAway.message }
            if state.machine.goAwayReceived(retryAfter: goAway.retryAfter, alternate: alternate, revoked: revoked) {
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
        self.channels.finish()
        self.eventBroadcaster.finish()
        self.reliable?.finish()
    }

    private func failWaiters(with error: TetherError) {
        let waiters = self.state.withLockedValue { $0.takeWaiters() }
        waiters.resume(throwing: error)
    }
}
