import Foundation
public import NIOCore
import ServiceLifecycle
import TetherCore
import TetherNIO
import TetherNIOTransports

// How a gateway runs: accepting, serving connections, shutting down (gracefully or at once).
extension Gateway {
    /// Accepts connections until ``shutdown()`` (or the service group's graceful shutdown),
    /// then drains them and returns.
    ///
    /// Cancelling the calling task stops the gateway at once instead: connections are closed
    /// without GOAWAY and running handlers are cancelled.
    /// - Throws: ``GatewayError`` if the listener cannot be bound, or `run()` was already called.
    public func run() async throws {
        try await withGracefulShutdownHandler {
            try await self.serve()
        } onGracefulShutdown: {
            self.shutdown()
        }
    }

    /// Shuts down gracefully: stops accepting, sends GOAWAY to every client, lets requests in
    /// flight finish (up to ``GatewayConfiguration/Timeouts-swift.struct/shutdownGracePeriod``),
    /// closes the connections; then ``run()`` returns. Calling it again has no effect.
    public func shutdown() {
        guard self.stopAccepting() else { return }
        self.logger.info("shutting down", metadata: ["connections": "\(self.registry.established.count)"])
        let goAway = Frame.GoAway(
            reason: .shutdown,
            retryAfter: self.configuration.goAway.retryAfter,
            alternateEndpoint: self.configuration.goAway.alternateEndpoint?.description ?? self.cluster?.alternateEndpoint,
            message: "the gateway is shutting down"
        )
        for handler in self.registry.beginDraining(with: goAway) {
            ConnectionHandle(handler).execute { $0.drain(goAway) }
        }
        self.resolveAddresses(.failure(GatewayError(code: .notListening, message: "the gateway shut down before it was listening")))
    }

    /// Stops at once: no more accepting, every connection closed without GOAWAY (which settles
    /// its requests and so cancels their handlers).
    private func stopNow() {
        self.stopAccepting()
        for handler in self.registry.handlers { ConnectionHandle(handler).execute { $0.closeNow() } }
    }

    /// Marks the gateway as shutting down, closes its listener, and gives back the count `run()`
    /// holds on `activity` while it accepts.
    /// - Returns: Whether this call began the shutdown (`false` if it had already begun).
    @discardableResult
    private func stopAccepting() -> Bool {
        let stop: (began: Bool, servers: [any Channel], releases: Bool) = self.lifecycle.withLockedValue { lifecycle in
            defer {
                lifecycle.shuttingDown = true
                lifecycle.accepting = false
            }
            return (!lifecycle.shuttingDown, lifecycle.serverChannels, lifecycle.accepting)
        }
        for server in stop.servers { server.close(promise: nil) }
        if stop.releases { self.activity.leave() }
        return stop.began
    }

    /// Serves a connection that another transport accepted (an in-process pipe, a WebSocket
    /// upgrade, …). The channel's pipeline must read and write `ByteBuffer`s: a byte stream of
    /// Tether frames, or one frame per message, as `framing` says. The gateway adds its
    /// connection handler on top.
    ///
    /// - Important: Create the channel with `ChannelOptions.autoRead` off, so that nothing is
    ///   read before the gateway's handler is in place; the gateway turns reading on.
    /// - Parameters:
    ///   - channel: The connection.
    ///   - framing: How its pipeline delivers Tether frames.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/notRunning`` if the gateway shut down.
    public func accept(_ channel: any Channel, framing: Framing = .byteStream) async throws(GatewayError) {
        if self.lifecycle.withLockedValue({ $0.shuttingDown }) {
            channel.close(promise: nil)
            throw GatewayError(code: .notRunning, message: "the gateway is shut down")
        }
        do {
            try await channel.eventLoop.submit { try self.configure(channel, framing: framing, transport: .accepted) }.get()
            try await channel.setOption(ChannelOptions.autoRead, value: true).get()
        } catch {
            channel.close(promise: nil)
            throw GatewayError(code: .notRunning, message: "could not set up the connection: \(error)")
        }
    }

    // MARK: Serving

    private func serve() async throws {
        let start: (alreadyRunning: Bool, shuttingDown: Bool) = self.lifecycle.withLockedValue { lifecycle in
            defer { lifecycle.started = true }
            if !lifecycle.started && !lifecycle.shuttingDown {
                lifecycle.accepting = true
                self.activity.enter()  // left by shutdown() or stopNow()
            }
            return (lifecycle.started, lifecycle.shuttingDown)
        }
        if start.alreadyRunning {
            throw GatewayError(code: .alreadyRunning, message: "run() was already called on this gateway")
        }
        _ = self.services  // the routes are fixed from now on
        if self.authenticator == nil, let host = self.configuration.nonLoopbackHosts.first {
            self.logger.warning(
                "insecure: the gateway listens beyond loopback with no authenticator (insecureOpen); any client may claim any client id",
                metadata: ["host": "\(host)"]
            )
        }
        defer { self.resolveAddresses(.failure(GatewayError(code: .notListening, message: "the gateway stopped"))) }

        // Connections are served by their channel handlers, and tasks exist only while there is
        // work; `activity` counts both. Cancelling this task stops everything at once.
        try await withTaskCancellationHandler {
            var servers: [any Channel] = []
            var admin: (any Channel)?
            if !start.shuttingDown {
                do {
                    // First: it says "starting" until the others listen.
                    if let settings = self.configuration.admin { admin = try await self.bindAdmin(settings) }
                    // The store's usage first, so that the store-wide quota holds from the first message.
                    if let reliable = self.reliable { await reliable.quotas.refresh(from: reliable.store) }
                    servers = try await self.bindListeners()
                } catch {
                    try? await admin?.close()
                    self.stopNow()
                    throw error
                }
            }
            await withTaskGroup { group in
                group.addTask { await self.reportMemory() }
                if let reliable = self.reliable {
                    group.addTask { await self.forgetStaleOutboxes(in: reliable) }
                    group.addTask { await self.countStore(reliable) }
                }
                if let writer = self.pushes.channelWriter, let age = self.configuration.channels?.longestStoredAge {
                    group.addTask { await self.trimChannels(in: writer.store, olderThan: age) }
                }
                if let cluster = self.cluster {
                    let node = ClusterNode(
                        registry: self.registry,
                        pushes: self.pushes,
                        lanes: self.reliable?.lanes,
                        streamKey: self.streamKey,
                        streamURL: self.streamURL
                    )
                    group.addTask {
                        do {
                            try await cluster.run(node)
                        } catch  where !(error is CancellationError) {
                            self.logger.error("the gateway left its cluster", metadata: ["error": "\(error)"])
                        } catch {}
                    }
                }
                await self.activity.finished()
                group.cancelAll()
            }
            for server in servers { try? await server.closeFuture.get() }
            try? await admin?.close()
        } onCancel: {
            self.stopNow()
        }
        self.logger.info("stopped")
    }

    /// Until cancelled, reads the store's usage every second, for the store-wide quota.
    private func countStore(_ reliable: ReliableServices) async {
        while !Task.isCancelled {
            await reliable.quotas.refresh(from: reliable.store)
            try? await self.clock.sleep(for: .seconds(1))
        }
    }

    /// Until cancelled, samples what the connections hold of the memory budget into the metrics,
    /// every second (the connections publish to the budget per read, not to the metrics).
    private func reportMemory() async {
        self.metrics.memoryBudget.record(self.memoryBudget.limit)
        while !Task.isCancelled {
            self.sampleMemory()
            try? await self.clock.sleep(for: .seconds(1))
        }
    }

    /// Records what the connections hold of the memory budget now, and the channels' counts.
    func sampleMemory() {
        self.metrics.memoryHeld.record(self.memoryBudget.usedBytes)
        if let hub = self.pushes.channels {
            let (channels, historyBytes) = hub.counts
            self.metrics.channels.record(channels)
            self.metrics.historyBytes.record(historyBytes)
        }
    }

    /// Until cancelled, forgets the outboxes away for longer than the retention, every half
    /// retention (at most hourly); the connected ones count as seen now.
    private func forgetStaleOutboxes(in reliable: ReliableServices) async {
        let retention = self.configuration.timeouts.outboxRetention
        let interval = min(retention / 2, .seconds(3600))
        while !Task.isCancelled {
            let now = self.clock.wallClockDate
            do {
                try await reliable.store.touchOutboxes(reliable.lanes.inUse, at: now)
                let forgotten = try await reliable.store.forgetOutboxes(notSeenSince: now - retention.totalSeconds)
                if forgotten > 0 {
                    self.logger.info("forgot outboxes away for longer than the retention", metadata: ["outboxes": "\(forgotten)"])
                }
            } catch {
                self.logger.warning("could not forget stale outboxes; trying again later", metadata: ["error": "\(error)"])
            }
            try? await self.clock.sleep(for: interval)
        }
    }

    /// Until cancelled, drops the channels' publications older than the longest retention of a
    /// rule that keeps them in the store, every tenth of it (at least every second, at most
    /// every 10 minutes). Reads skip what a channel's own retention no longer keeps meanwhile.
    private func trimChannels(in store: any ChannelHistoryStore, olderThan age: Duration) async {
        let interval = min(max(age / 10, .seconds(1)), .seconds(600))
        while !Task.isCancelled {
            let now = self.clock.wallClockDate
            do {
                _ = try await store.trimPublications(before: now - age.totalSeconds)
            } catch {
                self.logger.warning("could not trim the channels' history; trying again later", metadata: ["error": "\(error)"])
            }
            try? await self.clock.sleep(for: interval)
        }
    }

    /// Adds the connection handler to a channel whose pipeline reads and writes bytes. Runs on
    /// the channel's event loop.
    /// - Parameter admitted: The connection's ticket if the listener admitted it already (its
    ///   refusals are HTTP answers); `nil`: the handler asks as the connection becomes active.
    func configure(
        _ channel: any Channel,
        framing: Framing,
        transport: ConnectionTransport,
        admitted: ConnectionAdmission.Ticket? = nil
    )
        throws
    {
        let id = self.connectionIDs.loadThenWrappingIncrement(ordering: .relaxed)
        let handler = GatewayConnectionHandler(
            services: self.services,
            id: id,
            framing: framing,
            transport: transport,
            eventLoop: channel.eventLoop,
            pushes: self.pushBatchers[ObjectIdentifier(channel.eventLoop)],
            admitted: admitted,
            logger: self.logger
        )
        do {
            try channel.pipeline.syncOperations.addHandler(handler)
        } catch {
            if let admitted { self.admission.left(admitted) }  // the handler that would have given it back is not there
            throw error
        }
    }

    /// Admits a connection of the HTTP listener before it is answered: a GET that opens an HTTP
    /// stream, a WebSocket upgrade, a connection's first POST. The refusal is the HTTP answer:
    /// `503` (a count, or the gateway shutting down) or `429` (a rate), with `Retry-After`.
    func admitHTTP(_ channel: any Channel, kind: ConnectionAdmission.Kind) -> Result<ConnectionAdmission.Ticket, HTTPRefusal> {
        if self.lifecycle.withLockedValue({ $0.shuttingDown }) {
            return .failure(.shuttingDown(retryAfter: self.configuration.goAway.retryAfter))
        }
        let address = channel.remoteAddress?.ipAddress
        switch self.admission.admit(address, kind: kind, now: self.clock.now) {
        case .success(let ticket):
            return .success(ticket)
        case .failure(let refusal):
            self.refusalLog.log(
                self.logger,
                .warning,
                "refusing connections",
                metadata: ["reason": "\(refusal.report.message)", "remote": "\(address ?? "-")"]
            )
            self.metrics.refused(refusal.limit)
            return .failure(refusal.http)
        }
    }

    /// Settles the address of `listener` for those waiting for it (the first result stands).
    func resolveAddress(of listener: Listener, _ result: Result<SocketAddress, GatewayError>) {
        let (waiters, settled) = self.lifecycle.withLockedValue { lifecycle in
            let settled = lifecycle.addresses[listener] ?? result
            lifecycle.addresses[listener] = settled
            let waiting = lifecycle.addressWaiters.filter { $0.0 == listener }.map(\.1)
            lifecycle.addressWaiters.removeAll { $0.0 == listener }
            return (waiting, settled)
        }
        for waiter in waiters { waiter.resume(returning: settled) }
    }

    /// Settles every listener's address not settled yet with `result` (a failure).
    func resolveAddresses(_ result: Result<SocketAddress, GatewayError>) {
        for listener in Listener.allCases { self.resolveAddress(of: listener, result) }
    }
}

extension Gateway {
    /// The gateway's own listeners.
    enum Listener: CaseIterable, Hashable, Sendable {
        case tcp
        case webSocket
        case admin
    }

    struct Lifecycle {
        var started = false
        /// `run()` is accepting connections; it holds one count of `activity` meanwhile.
        var accepting = false
        var shuttingDown = false
        var serverChannels: [any Channel] = []
        var addresses: [Listener: Result<SocketAddress, GatewayError>] = [:]
        var addressWaiters: [(Listener, CheckedContinuation<Result<SocketAddress, GatewayError>, Never>)] = []
    }
}
