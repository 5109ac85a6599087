import NIOCore
import TetherCore
import TetherNIO

extension GatewayConnectionHandler {
    // MARK: Draining and closing

    /// Sends GOAWAY, refuses new requests, and closes once the client has its answers (or the
    /// grace period ends). Called on the event loop, by the gateway or the registry.
    func drain(_ goAway: Frame.GoAway) {
        guard self.context != nil else { return }
        switch self.machine.drain(now: self.services.clock.now) {
        case .sendGoAway:
            // The client closes once it has its answers: the close is the GOAWAY's, not `none`
            // (the metrics' close code, the disconnect hook's reason).
            if self.closeCode == nil { self.closeCode = Frame.Payload.goAway(goAway).closeCode }
            self.pushes?.drain()
            self.write(.goAway(goAway))
            self.flushNow()
            self.armTimer(now: self.services.clock.now)
        case .sendGoAwayAndClose:
            self.writeAndClose(.goAway(goAway), settle: [])
        case .none:
            break
        }
    }

    /// Closes at once, without a last frame (the gateway stops, a peer's error).
    func closeNow() {
        if let settle = self.machine.startClosing(writingLastFrame: false, now: self.services.clock.now) { self.cancelHandlers(settle) }
        guard let context = self.context else { return }
        self.pushes?.drain()
        self.io.close(context: context)
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        // What was written (or pushed) before the close goes out first.
        self.pushes?.drain()
        self.io.closing(context: context)
        context.close(mode: mode, promise: promise)
    }

    /// Writes a last frame and closes the channel once it is written (the machine gives it the
    /// close timeout); cancels the handlers of the requests `settle` names.
    func writeAndClose(_ payload: Frame.Payload, settle: [UInt64]?) {
        self.cancelHandlers(settle ?? [])
        if self.closeCode == nil {
            self.closeCode = payload.closeCode
            if case .error(let report) = payload, report.code == .handshakeTimeout { self.services.metrics.handshake("handshake_timeout") }
        }
        guard let context = self.context else { return }
        self.pushes?.drain()
        self.io.writeAndClose(Frame(payload, flags: self.machine.outboundFlags), context: context)
        self.armTimer(now: self.services.clock.now)  // a client that does not read would hold it open
    }

    func cancelHandlers(_ ids: [UInt64]) {
        for id in ids { self.handlerTasks.removeValue(forKey: id)?.cancel() }
    }

    // MARK: Writing

    /// Writes a frame with the negotiated flags (or `flags`), without flushing.
    /// - Returns: `false` if it cannot be encoded (a field over its size limit); nothing is written.
    @discardableResult
    func write(_ payload: Frame.Payload, flags: FrameFlags? = nil) -> Bool {
        guard let context = self.context, !self.machine.isClosing else { return false }
        do {
            try self.io.write(Frame(payload, flags: flags ?? self.machine.outboundFlags), context: context)
            return true
        } catch {
            // The one policy of both sides: sizes are checked before a frame gets here, so a frame
            // that cannot be encoded is a bug, and the connection closes (the client sees it and
            // reconnects) rather than leaving its peer waiting for a frame that never comes.
            self.logger.error("cannot encode a frame; closing the connection", metadata: ["type": "\(payload.type)", "error": "\(error)"])
            self.closeNow()
            return false
        }
    }

    /// Flushes by the frame core's policy: now when nothing else can join this write (no
    /// request is in flight), else at the end of the read or of the loop's batch of work.
    func flushSoon() {
        guard let context = self.context else { return }
        if self.io.flushSoon(context: context, alone: self.machine.requestsInFlight == 0) == .queueEndOfBatch {
            context.eventLoop.assumeIsolated().execute { self.flushAtEndOfBatch() }
        }
    }

    private func flushAtEndOfBatch() {
        guard let context = self.context else { return }
        self.pushes?.drain()
        self.io.flushAtEndOfBatch(context: context)
    }

    func flushNow() {
        guard let context = self.context else { return }
        self.io.flush(context: context)
    }
}
