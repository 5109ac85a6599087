import Logging
import NIOCore
import TetherCompression
import TetherCore
import TetherNIO

/// How an established connection ended.
struct ConnectionClosure: Sendable {
    var reason: DisconnectReason
    /// How long the connection was established; zero if the handshake never completed.
    var uptime: Duration
}

/// The client's one channel handler for one connection.
///
/// It sits on top of the transport (TCP, TLS, a WebSocket framer) and reads and writes bytes
/// through its ``FrameConnection``, the frame core the gateway's handler shares. Everything the
/// connection knows is its ``ClientConnectionStateMachine``, one value; the handler turns channel
/// events, timer callbacks and the client's calls into machine events and carries out what the
/// machine returns. It holds the I/O resources: the channel, the timer, and who waits for each
/// request (``pending``). Everything runs on the channel's event loop.
///
/// The client calls ``sendRequest(_:deadline:waiter:)``, ``cancelRequest(id:)``, ``drain()``
/// and the reliable-messaging entry points on the event loop, through ``ClientConnection``.
final class ClientConnectionHandler: ChannelInboundHandler, NIOScheduledCallbackHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    struct Callbacks: Sendable {
        var push: @Sendable (Frame.Push) -> Void
        var goAway: @Sendable (Frame.GoAway) -> Void
        /// SUBSCRIBED, PUBLICATION or UNSUBSCRIBE, for the client's channel subscriptions (on the
        /// connection's event loop).
        var channel: @Sendable (Frame.Payload) -> Void = { _ in }
        var reliable: ReliableCallbacks?
        /// What the app wants of the heartbeat now: its mode, and with NAT-timeout probing the
        /// longest interval the network is known (or being tested) to keep an idle connection.
        /// Read when the heartbeat starts and on ``ClientConnectionHandler/refreshHeartbeatMode()``.
        var heartbeatPreference: @Sendable () -> ClientConnectionStateMachine.HeartbeatPreference = { .init(mode: .foreground) }
        /// An idle probe was answered (`true`) or the link died while it waited (`false`).
        var idleProbe: @Sendable (HeartbeatStateMachine.IdleProbe, _ answered: Bool) -> Void = { _, _ in }
        /// The client's statistics and metrics (not for probes).
        var statistics: ClientStatisticsRecorder?
        /// An alert was raised.
        var alert: @Sendable (ClientAlert) -> Void = { _ in }
    }

    /// Who waits for a request, and what it called (for the errors it may get).
    struct Pending {
        var waiter: ResponseWaiter
        var method: String
    }

    var machine: ClientConnectionStateMachine
    let io: FrameConnection
    let clock: any TetherClock
    let maxInboundBodySize: Int
    /// How this client compresses what it sends, if the gateway accepts compression.
    let compression: Compression?
    let callbacks: Callbacks
    let logger: Logger
    /// Succeeds with the negotiated parameters when WELCOME arrives; fails if the handshake does not complete.
    private let established: EventLoopPromise<Handshake.Negotiated>
    /// Succeeds once the channel is closed.
    private let closed: EventLoopPromise<ConnectionClosure>
    var context: ChannelHandlerContext?
    /// Who waits for each request in the machine's table, by id.
    var pending: [UInt64: Pending] = [:]
    /// Writing can fire a writability change that lands in ``pumpMessages()`` again.
    var pumping = false
    /// Requests cancelled before their hop from another thread arrived: the next hop ends them
    /// (and forgets the rest: ids of requests that had ended already).
    var cancelledBeforeArrival: Set<UInt64> = []

    init(
        configuration: ClientConnectionStateMachine.Configuration,
        maxInboundBodySize: Int,
        compression: Compression? = nil,
        framing: Framing,
        clock: any TetherClock,
        callbacks: Callbacks,
        established: EventLoopPromise<Handshake.Negotiated>,
        closed: EventLoopPromise<ConnectionClosure>,
        logger: Logger
    ) {
        self.machine = ClientConnectionStateMachine(configuration: configuration)
        self.io = FrameConnection(framing: framing, holdsReadsWhileUnwritable: false)
        if let statistics = callbacks.statistics {
            self.io.countBytes = { read, written in statistics.bytes(read: read, written: written) }
        }
        self.clock = clock
        self.maxInboundBodySize = maxInboundBodySize
        self.compression = compression
        self.callbacks = callbacks
        self.established = established
        self.closed = closed
        self.logger = logger
    }

    // MARK: Channel events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.io.handlerAdded(context: context)
        if context.channel.isActive { self.start() }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.finish()
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        self.start()
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.io.tellByteCounts()
        self.finish()
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if self.io.writabilityChanged(context: context, ownerHolds: false) { self.pumpMessages() }
        context.fireChannelWritabilityChanged()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let error = error as? ProtocolError {
            self.callbacks.statistics?.protocolError()
            self.perform(self.machine.violation(error), now: self.clock.now)
        } else {
            self.machine.transportFailed("\(error)")
            self.close()
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let now = self.clock.now
        self.io.channelRead(Self.unwrapInboundIn(data))
        while let inbound = self.io.next() {
            switch inbound {
            case .frame(let frame):
                self.perform(self.machine.received(frame, now: now, preference: self.callbacks.heartbeatPreference()), now: now)
                if case .pong = frame.payload { self.heartbeatMeasured() }
            case .violation(let error):
                self.callbacks.statistics?.protocolError()
                self.perform(self.machine.violation(error), now: now)
            }
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        let flushed = self.io.flushOwed
        self.io.channelReadComplete(context: context)
        if flushed { self.machine.flushed(now: self.clock.now) }
        self.armTimer()
        context.fireChannelReadComplete()
    }

    private func start() {
        let now = self.clock.now
        guard let hello = self.machine.start(now: now) else { return }
        self.write(.hello(hello))
        self.flushNow()
        self.armTimer()
    }

    // MARK: Frames

    private func perform(_ action: ClientConnectionStateMachine.OnFrame, now: TetherInstant) {
        switch action {
        case .none:
            break
        case .established(let negotiated):
            self.io.maxInboundBodySize = self.maxInboundBodySize
            self.io.acceptsSharedDeliveries = negotiated.features.contains(.sharedDeliveries)
            if negotiated.features.contains(.compression) {
                do {
                    self.io.compression = try (self.compression ?? .defaults).makeCodecs()
                } catch {
                    // The gateway may now send COMPRESSED frames this side cannot read.
                    self.logger.error("cannot set up compression; closing the connection", metadata: ["error": "\(error)"])
                    self.established.fail(TetherError(code: .handshakeFailed, message: error.message))
                    self.close()
                    return
                }
            }
            self.established.succeed(negotiated)
        case .complete(let id, let response, let pastDeadline, let send, let close):
            if let send { self.write(.request(send)) }
            if let pending = self.pending.removeValue(forKey: id) {
                if response.status == .ok {
                    pending.waiter.resume(with: .success(response.body))
                } else {
                    pending.waiter.resume(with: Self.failure(of: response, method: pending.method, pastDeadline: pastDeadline))
                }
            }
            if close != nil { self.close() } else if send != nil { self.flushSoon() }
        case .push(let push):
            self.callbacks.push(push)
        case .channel(let payload):
            self.callbacks.channel(payload)
        case .sendPong(let ping):
            self.write(.pong(ping))
            self.flushSoon()
        case .goAway(let goAway, let unsent, let close):
            self.logger.info("gateway is going away", metadata: ["reason": "\(goAway.reason)", "message": "\(goAway.message)"])
            self.callbacks.goAway(goAway)
            let error = TetherError(
                code: .notDispatched,
                message: "the gateway is going away; the request will be sent on the next connection"
            )
            self.fail(unsent, with: { _ in error })
            if close != nil { self.close() }
        case .refused(let refusal):
            let error: TetherError
            switch refusal {
            case .goAway(let goAway):
                error = TetherError(code: .handshakeFailed, message: "the gateway is going away (\(goAway.reason)): \(goAway.message)")
            case .error(let report):
                error = TetherError(
                    code: .handshakeFailed,
                    message: "the gateway refused the connection: \(report.message)",
                    status: report.code
                )
            }
            self.logger.info("the gateway refused the connection", metadata: ["error": "\(error)"])
            self.established.fail(error)
            self.close()
        case .close(let reason):
            self.logger.warning("gateway reported an error", metadata: ["reason": "\(reason)"])
            self.close()
        case .sendErrorAndClose(let error):
            self.logger.warning("gateway broke the protocol", metadata: ["error": "\(error)"])
            guard let context = self.context else { return }
            self.io.writeAndClose(
                Frame(.error(.init(code: error.code, message: error.message)), flags: self.machine.outboundFlags),
                context: context
            )
        case .messagesAcknowledged(let entries):
            self.callbacks.reliable?.acknowledged(entries)
            self.pumpMessages()
        case .delivery(let delivery, let epoch):
            guard let verdict = self.callbacks.reliable?.delivery(delivery, epoch), case .gap(let expected) = verdict else { break }
            self.logger.warning("the gateway skipped a delivery", metadata: ["expected": "\(expected)", "got": "\(delivery.sequence)"])
            self.perform(
                self.machine.violation(ProtocolError(code: .protocolError, message: "delivery \(delivery.sequence) skips \(expected)")),
                now: now
            )
        }
        self.reportIdleProbe()
    }

    /// A RESPONSE other than ok, as the caller sees it.
    private static func failure(of response: Frame.Response, method: String, pastDeadline: Bool) -> Result<ByteBuffer, TetherError> {
        switch response.status {
        case .ok:
            return .success(response.body)
        case .unavailable:
            // The gateway is draining and did not run the handler: safe to send again elsewhere.
            return .failure(TetherError(code: .notDispatched, message: response.message, status: response.status))
        case .deadlineExceeded where pastDeadline:
            // The gateway enforced the caller's own deadline: to the caller, it timed out.
            return .failure(
                TetherError(code: .timedOut, message: "no response to '\(method)' before its deadline", status: response.status)
            )
        default:
            let message = response.message.isEmpty ? "'\(method)' failed" : response.message
            return .failure(TetherError(code: .serverError, message: message, status: response.status))
        }
    }

    /// Ends these requests with the error `error` makes of each method.
    func fail(_ ids: [UInt64], with error: (String) -> TetherError) {
        for id in ids {
            guard let pending = self.pending.removeValue(forKey: id) else { continue }
            pending.waiter.fail(error(pending.method))
        }
    }

    func reportIdleProbe() {
        guard let report = self.machine.takeIdleProbeReport() else { return }
        self.callbacks.idleProbe(report.probe, report.answered)
    }

    // MARK: Time

    /// Makes the timer fire at the machine's next deadline, if that is earlier than it fires now.
    /// Arms the timer for a deadline just added, unless it fires before it anyway: sending a
    /// request makes no other deadline earlier, so the machine need not be asked.
    func armTimer(forNew deadline: TetherInstant) {
        if let armed = self.io.timer.nextFire, armed <= deadline { return }
        self.armTimer()
    }

    func armTimer() {
        let next = self.machine.nextDeadline()
        guard self.io.timer.needsArming(at: next), let loop = self.context?.eventLoop else { return }
        self.io.timer.arm(at: next, clock: self.clock, on: loop, handler: self)
    }

    func handleScheduledCallback(eventLoop: some EventLoop) {
        self.io.timerFired()
        guard self.context != nil else { return }
        let now = self.clock.now
        let due = self.machine.timerFired(now: now)
        if due.handshakeTimedOut {
            self.established.fail(
                TetherError(
                    code: .handshakeFailed,
                    message: "no WELCOME within \(self.machine.configuration.handshakeTimeout.shortDescription)"
                )
            )
        }
        for (id, wasSent) in due.expired {
            if wasSent { self.write(.cancel(.init(requestID: id))) }
        }
        for request in due.send { self.write(.request(request)) }
        switch due.heartbeat {
        case .sendPing(let id):
            self.write(.ping(.init(id: id)))
            self.callbacks.statistics?.pingSent()
        case .linkDead(let silence):
            self.logger.warning("no sign of life from the gateway; closing the connection", metadata: ["silent": "\(silence)"])
        case .none:
            break
        }
        if case .linkFailing(let timedOut, let total)? = due.close {
            self.logger.warning(
                "requests time out on this connection; closing it to try another endpoint",
                metadata: ["timedOut": "\(timedOut)", "of": "\(total)"]
            )
        }
        if self.io.flushOwed { self.flushNow() }
        if due.pumpMessages { self.pumpMessages() }
        let onWire = self.machine.requestsOnWire
        for (id, wasSent) in due.expired {
            self.fail([id]) { method in
                TetherError(
                    code: .timedOut,
                    message: wasSent
                        ? "no response to '\(method)' before its deadline"
                        : "'\(method)' was still queued at its deadline (the gateway's \(onWire) request slots were busy)"
                )
            }
        }
        self.reportIdleProbe()
        if due.close != nil || due.handshakeTimedOut {
            self.close()
        } else {
            self.armTimer()
        }
    }

    /// A PONG arrived: the statistics take what the heartbeat measured; a slow one may raise an alert.
    private func heartbeatMeasured() {
        guard let statistics = self.callbacks.statistics, let reading = self.machine.heartbeatReading else { return }
        if let alert = statistics.heartbeat(roundTrip: reading.roundTrip, smoothed: reading.smoothed, interval: reading.interval) {
            self.callbacks.alert(alert)
        }
    }

    // MARK: Writing

    /// Writes a frame with the negotiated flags, without flushing.
    func write(_ payload: Frame.Payload) {
        guard let context = self.context else { return }
        do {
            try self.io.write(Frame(payload, flags: self.machine.outboundFlags), context: context)
        } catch {
            // The client checks sizes before it gets here: a frame it cannot encode is a bug.
            self.logger.error("cannot encode a frame; closing the connection", metadata: ["error": "\(error)"])
            self.machine.transportFailed("cannot encode \(payload.type): \(error)")
            self.close()
        }
    }

    /// Flushes by the frame core's policy (at the end of the read or of the loop's batch, or at
    /// once when nothing else can join this write).
    func flushSoon(alone: Bool = false) {
        guard let context = self.context else { return }
        switch self.io.flushSoon(context: context, alone: alone) {
        case .flushed: self.machine.flushed(now: self.clock.now)
        case .queueEndOfBatch: context.eventLoop.assumeIsolated().execute { self.flushAtEndOfBatch() }
        case .later: break
        }
    }

    private func flushAtEndOfBatch() {
        guard let context = self.context, self.io.flushAtEndOfBatch(context: context) else { return }
        self.machine.flushed(now: self.clock.now)
    }

    func flushNow() {
        guard let context = self.context else { return }
        self.io.flush(context: context)
        self.machine.flushed(now: self.clock.now)
    }

    // MARK: Closing

    /// Closes the channel after what was written so far. The machine knows why.
    func close() {
        guard let context = self.context else { return }
        self.io.close(context: context)
    }

    /// Settles everything when the channel goes away: pending requests, promises, the timer.
    private func finish() {
        self.io.timer.cancel()
        guard let closed = self.machine.closed(now: self.clock.now) else { return }
        let reason = closed.reason
        if closed.handshakeFailed {
            self.established.fail(TetherError(code: .handshakeFailed, message: "the connection closed during the handshake: \(reason)"))
        }
        self.fail(closed.unsent) { _ in
            TetherError(code: .notDispatched, message: "the connection closed before the request was sent: \(reason)")
        }
        self.fail(closed.lost) { method in
            TetherError(code: .connectionLost, message: "the connection closed while '\(method)' was in flight: \(reason)")
        }
        // Requests the machine never took (a race with the close) end too.
        let stragglers = Array(self.pending.keys)
        self.fail(stragglers) { _ in
            TetherError(code: .notDispatched, message: "the connection closed before the request was sent: \(reason)")
        }
        self.reportIdleProbe()
        self.closed.succeed(ConnectionClosure(reason: reason, uptime: closed.uptime))
    }
}

@available(*, unavailable)
extension ClientConnectionHandler: Sendable {}
