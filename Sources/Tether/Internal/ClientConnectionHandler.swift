import Logging
import NIOCore
import TetherCore
import TetherNIO

/// How an established connection ended.
struct ConnectionClosure: Sendable {
    var reason: DisconnectReason
    /// How long the connection was established; zero if the handshake never completed.
    var uptime: Duration
}

/// The client's protocol handler for one connection: handshake, request correlation and
/// timeouts, heartbeat, pushes, GOAWAY and protocol errors.
///
/// It keeps no more requests on the wire than the gateway's `max concurrent requests` (from
/// WELCOME) and queues the rest, each under its own deadline. So the gateway never has to stop
/// reading the connection, and PINGs and CANCELs keep flowing however busy it is. A queued
/// request never reached the gateway: if the connection goes away, it is sent again on the next.
///
/// It sits on top of the transport's framing and lives on the channel's event loop. The
/// protocol rules are in ``ClientSessionStateMachine`` and ``HeartbeatStateMachine``; this
/// handler performs their actions. The client calls ``sendRequest(_:deadline:waiter:)``,
/// ``cancelRequest(id:)`` and ``drain()`` on the event loop.
final class ClientConnectionHandler: ChannelInboundHandler, RemovableChannelHandler, FrameReceiver {
    typealias InboundIn = Frame
    typealias OutboundOut = Frame

    struct Configuration: Sendable {
        var hello: Frame.Hello
        var handshakeTimeout: TimeAmount
        /// The application's heartbeat settings.
        var heartbeat: ClientConfiguration.Heartbeat
        var maxInboundBodySize: Int
        /// With reliable messaging: the window and retransmission bounds.
        var reliability: (window: Int, retransmission: RTTEstimator)?
    }

    struct Callbacks: Sendable {
        var push: @Sendable (Frame.Push) -> Void
        var goAway: @Sendable (Frame.GoAway) -> Void
        var reliable: ReliableCallbacks?
        /// The heartbeat mode the app wants now; read when the heartbeat starts and on
        /// ``ClientConnectionHandler/refreshHeartbeatMode()``.
        var heartbeatMode: @Sendable () -> HeartbeatMode = { .foreground }
        /// With NAT-timeout probing: the longest interval the network is known (or being tested)
        /// to keep an idle connection; read with the mode.
        var learnedInterval: @Sendable () -> Duration? = { nil }
        /// An idle probe was answered (`true`) or the link died while it waited (`false`).
        var idleProbe: @Sendable (HeartbeatStateMachine.IdleProbe, _ answered: Bool) -> Void = { _, _ in }
    }

    /// A request to send, its deadline, and who waits for its response.
    typealias RequestSubmission = (request: Frame.Request, deadline: NIODeadline, waiter: ResponseWaiter)

    private struct PendingRequest {
        var method: String
        var deadline: NIODeadline
        var waiter: ResponseWaiter
        /// The request while it waits for a slot; `nil` once sent.
        var unsent: Frame.Request?

        /// The request to send; it is marked sent.
        mutating func takeUnsent() -> Frame.Request? {
            defer { self.unsent = nil }
            return self.unsent
        }
    }

    let configuration: Configuration
    let callbacks: Callbacks
    let logger: Logger
    /// Succeeds with the negotiated parameters when WELCOME arrives; fails if the handshake does not complete.
    private let established: EventLoopPromise<Handshake.Negotiated>
    /// Succeeds once the channel is closed.
    private let closed: EventLoopPromise<ConnectionClosure>

    private(set) var session: ClientSessionStateMachine
    var heartbeat: HeartbeatStateMachine?
    private var heartbeatTimer: Scheduled<Void>?
    /// The gateway's heartbeat interval and the longest interval it allows (half its idle timeout).
    private var heartbeatBounds: (gateway: TimeAmount, ceiling: TimeAmount)?
    /// The heartbeat mode in force, to notice the return to the foreground.
    private var heartbeatMode = HeartbeatMode.foreground
    /// The client closed this connection on purpose: an idle probe waiting then did not fail.
    private var closedByClient = false
    private var handshakeTimer: Scheduled<Void>?
    private var pending: [UInt64: PendingRequest] = [:]
    /// The deadlines of `pending`, served by one timer (`deadlineTimer`).
    private var deadlines = DeadlineQueue<UInt64, NIODeadline>()
    private var deadlineTimer = DeadlineTimer()
    /// Ids of requests waiting for a slot, oldest first (some may have been settled meanwhile).
    private var waiting = CircularBuffer<UInt64>()
    /// Requests on the wire and not yet answered.
    private var sentCount = 0
    /// A flush is queued on the event loop (``flushAtEndOfBatch(context:)``).
    private var flushScheduled = false
    /// Requests written since the last flush (see ``FlushTiming/maxUnflushedRequests``).
    private var unflushed = 0
    private(set) var context: ChannelHandlerContext?
    /// Tether's encoder right below this handler, if the channel uses it (the transports do):
    /// frames are handed to it directly rather than wrapped in `NIOAny`.
    private var encoder: FrameEncodingHandler?
    /// Tether's decoder right below this handler, if the channel uses it: it calls
    /// ``receive(_:context:)`` directly rather than passing frames wrapped in `NIOAny`.
    private var decoder: FrameDecodingHandler?
    private var helloSent = false
    private var closeReason: DisconnectReason?
    private var establishedAt: NIODeadline?
    /// Reliable messaging on this connection, once negotiated.
    var reliable: ReliableConnectionState?

    init(
        configuration: Configuration,
        callbacks: Callbacks,
        established: EventLoopPromise<Handshake.Negotiated>,
        closed: EventLoopPromise<ConnectionClosure>,
        logger: Logger
    ) {
        self.configuration = configuration
        self.callbacks = callbacks
        self.established = established
        self.closed = closed
        self.logger = logger
        self.session = ClientSessionStateMachine(hello: configuration.hello)
    }

    // MARK: Channel events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.encoder = try? context.pipeline.syncOperations.handler(type: FrameEncodingHandler.self)
        self.decoder = try? context.pipeline.syncOperations.handler(type: FrameDecodingHandler.self)
        self.decoder?.connect(self, context: context)
        if context.channel.isActive {
            self.sendHello(context: context)
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.finish(context: context)
        self.context = nil
        self.encoder = nil
        self.decoder?.disconnect(self)
        self.decoder = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        self.sendHello(context: context)
        context.fireChannelActive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { self.pumpMessages(context: context) }
        context.fireChannelWritabilityChanged()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.finish(context: context)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let error = error as? ProtocolError {
            self.logger.warning("gateway sent an invalid frame", metadata: ["error": "\(error)"])
            self.sendErrorAndClose(error, context: context)
        } else {
            self.close(reason: .transportError("\(error)"), context: context)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.receive(Self.unwrapInboundIn(data), context: context)
    }

    func receive(_ frame: Frame, context: ChannelHandlerContext) {
        if let probe = self.heartbeat?.frameReceived(at: context.eventLoop.now) {
            self.callbacks.idleProbe(probe, true)
        }

        switch self.session.received(frame) {
        case .established(let negotiated):
            self.handshakeCompleted(negotiated, context: context)

        case .response(let response):
            self.complete(response, context: context)

        case .push(let push):
            self.callbacks.push(push)

        case .replyPong(let ping):
            self.send(.pong(ping), context: context)

        case .pong(let ping):
            self.heartbeat?.pongReceived(id: ping.id, at: context.eventLoop.now)

        case .goAway(let goAway):
            self.logger.info("gateway is going away", metadata: ["reason": "\(goAway.reason)", "message": "\(goAway.message)"])
            self.closeReason = self.closeReason ?? .goingAway(goAway)
            if self.establishedAt == nil {
                self.established.fail(
                    TetherError(code: .handshakeFailed, message: "the gateway is going away (\(goAway.reason)): \(goAway.message)")
                )
                self.close(reason: .goingAway(goAway), context: context)
            } else {
                self.callbacks.goAway(goAway)
                self.failUnsent("the gateway is going away; the request will be sent on the next connection")
                self.closeIfDrained(context: context)
            }

        case .peerError(let report):
            self.logger.warning("gateway reported an error", metadata: ["code": "\(report.code)", "message": "\(report.message)"])
            if self.establishedAt == nil {
                self.established.fail(
                    TetherError(
                        code: .handshakeFailed,
                        message: "the gateway refused the connection: \(report.message)",
                        status: report.code
                    )
                )
            }
            self.close(reason: .gatewayError(code: report.code, message: report.message), context: context)

        case .violation(let error):
            self.logger.warning("gateway broke the protocol", metadata: ["error": "\(error)"])
            self.sendErrorAndClose(error, context: context)

        case .messageAck(let ack):
            self.messagesAcknowledged(ack, context: context)

        case .delivery(let delivery):
            self.deliveryReceived(delivery, context: context)

        case .ignore:
            break
        }
    }

    // MARK: Operations called by the client, on the event loop

    /// Sends a request; `waiter` gets the response body or a ``TetherError``, at the latest when
    /// `deadline` passes. A callback waiter runs here, on the event loop, and may send requests.
    ///
    /// For callers that run on the event loop, one request each: if other requests are on the
    /// wire, the flush waits for the end of the loop's current batch of work, so that the
    /// requests of every caller resumed in that batch leave in one write. Alone, it leaves at once.
    func sendRequest(_ request: Frame.Request, deadline: NIODeadline, waiter: ResponseWaiter) {
        self.sendRequests(CollectionOfOne((request: request, deadline: deadline, waiter: waiter)), flush: .coalescing)
    }

    /// When ``sendWaiting(context:flush:)`` flushes what it wrote.
    enum FlushTiming {
        /// At once.
        case now
        /// At once if nothing else is on the wire; else at the end of the loop's current batch.
        case coalescing

        /// A coalescing flush waits for the end of the batch only while fewer requests than this
        /// are written and not flushed: a long batch leaves in chunks, so the gateway can start on
        /// the first while the client writes the rest, and both sides work at once.
        static let maxUnflushedRequests = 64
    }

    /// Sends several requests, in one write as far as the gateway's slots allow.
    func sendRequests(_ requests: some Sequence<RequestSubmission>, flush: FlushTiming = .now) {
        guard let context, self.session.acceptsRequests, let negotiated = self.session.negotiated else {
            for (_, _, waiter) in requests {
                waiter.fail(TetherError(code: .notDispatched, message: "the connection no longer accepts requests"))
            }
            return
        }
        let limit = Self.requestLimit(negotiated)
        var wrote = 0
        for (request, deadline, waiter) in requests {
            let bodySize = request.bodySize
            guard bodySize <= negotiated.peerMaxBodySize else {
                waiter.fail(
                    TetherError(
                        code: .requestTooLarge,
                        message: "the request body is \(bodySize) bytes; the gateway accepts at most \(negotiated.peerMaxBodySize)"
                    )
                )
                continue
            }
            // A free slot and nobody waiting ahead: straight to the wire, without queueing.
            let direct = self.waiting.isEmpty && self.sentCount < limit
            let entry = PendingRequest(method: request.method, deadline: deadline, waiter: waiter, unsent: direct ? nil : request)
            if let previous = self.pending.updateValue(entry, forKey: request.id) {
                self.pending[request.id] = previous
                waiter.fail(TetherError(code: .invalidArgument, message: "request id \(request.id) is already in flight"))
                continue
            }
            self.deadlines.insert(request.id, deadline: deadline)
            if direct {
                self.sentCount += 1
                self.write(.request(request), context: context)
                wrote += 1
            } else {
                self.waiting.append(request.id)
            }
        }
        self.armDeadlineTimer(context: context)
        self.sendWaiting(context: context, flush: flush, written: wrote)
    }

    /// The most requests the gateway takes on the wire at once.
    private static func requestLimit(_ negotiated: Handshake.Negotiated) -> Int {
        negotiated.maxConcurrentRequests == 0 ? Int.max : Int(negotiated.maxConcurrentRequests)
    }

    /// Makes the deadline timer fire at the earliest deadline.
    private func armDeadlineTimer(context: ChannelHandlerContext) {
        guard self.deadlineTimer.needsArming(at: self.deadlines.earliest) else { return }
        self.deadlineTimer.arm(at: self.deadlines.earliest, on: context.eventLoop) {
            self.deadlineTimer.fired()
            for id in self.deadlines.popExpired(at: context.eventLoop.now) {
                self.requestTimedOut(id: id)
            }
            if self.context != nil { self.armDeadlineTimer(context: context) }
        }
    }

    /// Abandons a request: fails it with ``TetherError/Code/cancelled`` and, if it was sent, sends CANCEL.
    func cancelRequest(id: UInt64) {
        guard let request = self.settle(id) else { return }
        request.waiter.fail(TetherError(code: .cancelled, message: "request '\(request.method)' was cancelled"))
    }

    /// Stops accepting requests and closes once those in flight are answered.
    func drain() {
        guard let context else { return }
        self.session.drain()
        self.closeReason = self.closeReason ?? .shutdown
        if self.establishedAt == nil {
            self.close(reason: .shutdown, context: context)
        } else {
            self.closeIfDrained(context: context)
        }
    }

    // MARK: Internals

    private func sendHello(context: ChannelHandlerContext) {
        guard !self.helloSent else { return }
        self.helloSent = true
        self.send(.hello(self.configuration.hello), context: context)
        self.handshakeTimer = context.eventLoop.assumeIsolated().scheduleTask(in: self.configuration.handshakeTimeout) {
            self.handshakeTimedOut()
        }
    }

    private func handshakeTimedOut() {
        guard let context, self.establishedAt == nil else { return }
        let timeout = Duration(self.configuration.handshakeTimeout)
        self.established.fail(TetherError(code: .handshakeFailed, message: "no WELCOME within \(timeout.shortDescription)"))
        self.close(reason: .transportError("handshake timed out after \(timeout.shortDescription)"), context: context)
    }

    private func handshakeCompleted(_ negotiated: Handshake.Negotiated, context: ChannelHandlerContext) {
        self.handshakeTimer?.cancel()
        self.handshakeTimer = nil
        let now = context.eventLoop.now
        self.establishedAt = now
        context.triggerUserOutboundEvent(
            TetherChannelEvent.limitsNegotiated(maxInboundBodySize: self.configuration.maxInboundBodySize),
            promise: nil
        )
        let bounds = (
            gateway: TimeAmount(negotiated.heartbeatInterval),
            ceiling: TimeAmount.nanoseconds(TimeAmount(negotiated.idleTimeout).nanoseconds / 2)
        )
        self.heartbeatBounds = bounds
        if negotiated.features.contains(.reliableDelivery), let reliability = self.configuration.reliability {
            self.reliable = ReliableConnectionState(
                scheduler: MessageScheduler(window: reliability.window),
                retransmission: reliability.retransmission
            )
        }
        let settings = self.configuration.heartbeat
        self.heartbeatMode = self.callbacks.heartbeatMode()
        let pace = self.heartbeatPace(for: self.heartbeatMode, bounds: bounds)
        self.heartbeat = HeartbeatStateMachine(
            configuration: .init(
                interval: pace.interval,
                jitter: pace.jitter,
                timeout: RTTEstimator(
                    initialTimeout: settings.timeout,
                    minimumTimeout: min(settings.minimumTimeout, settings.timeout),
                    maximumTimeout: settings.timeout
                ),
                suspensionThreshold: settings.suspensionThreshold.map { TimeAmount($0) },
                probeTimeout: TimeAmount(settings.probeTimeout),
                stallInterval: settings.stallInterval.map { TimeAmount($0) }
            ),
            now: now
        )
        self.scheduleHeartbeat(context: context)
        self.established.succeed(negotiated)
    }

    /// The interval for `mode` (configured, or the default for the mode; never longer than the
    /// gateway's idle timeout allows) and its jitter.
    ///
    /// With NAT-timeout probing, the interval is never longer than the network is known (or
    /// being tested) to keep an idle connection. When that is what decides it, the interval is
    /// used exactly, without jitter: every idle probe then tests the interval it reports.
    private func heartbeatPace(
        for mode: HeartbeatMode,
        bounds: (gateway: TimeAmount, ceiling: TimeAmount)
    ) -> (interval: TimeAmount, jitter: Double) {
        let configured = self.configuration.heartbeat.interval(for: mode).map { TimeAmount($0) }
        let wanted = max(.milliseconds(1), min(configured ?? (mode == .foreground ? bounds.gateway : bounds.ceiling), bounds.ceiling))
        if let learned = self.callbacks.learnedInterval().map({ TimeAmount($0) }), learned <= wanted {
            return (learned, 0)
        }
        return (wanted, self.configuration.heartbeat.jitter)
    }

    /// Switches the heartbeat to the interval of the mode the app wants now, and of what the
    /// NAT-timeout prober learned (called by the client, on the event loop). Reading the mode
    /// here, not passing it, means that calls queued in any order leave the latest in force.
    ///
    /// Back in the foreground, the link is probed at once: the app is about to use it, and a
    /// connection that died in the background is found in one round trip, not one interval.
    func refreshHeartbeatMode() {
        guard let context, self.heartbeat != nil, let bounds = self.heartbeatBounds else { return }
        let mode = self.callbacks.heartbeatMode()
        let previous = self.heartbeatMode
        self.heartbeatMode = mode
        let pace = self.heartbeatPace(for: mode, bounds: bounds)
        if pace.interval != self.heartbeat!.interval || pace.jitter != self.heartbeat!.configuration.jitter {
            self.heartbeat!.setInterval(pace.interval, jitter: pace.jitter)
        }
        if mode == .foreground, previous != .foreground, case .sendPing(let id) = self.heartbeat!.probeNow(at: context.eventLoop.now) {
            self.send(.ping(.init(id: id)), context: context)
        }
        self.scheduleHeartbeat(context: context)
    }

    /// The client is closing this connection on purpose (a network change, a shutdown).
    func closeAtClientRequest() {
        self.closedByClient = true
        self.context?.close(promise: nil)
    }

    private func scheduleHeartbeat(context: ChannelHandlerContext) {
        guard let heartbeat = self.heartbeat else { return }
        self.heartbeatTimer?.cancel()
        self.heartbeatTimer = context.eventLoop.assumeIsolated().scheduleTask(deadline: heartbeat.nextDeadline) {
            self.heartbeatTimerFired()
        }
    }

    private func heartbeatTimerFired() {
        guard let context, self.heartbeat != nil else { return }
        switch self.heartbeat!.timerFired(at: context.eventLoop.now) {
        case .sendPing(let id):
            self.send(.ping(.init(id: id)), context: context)
        case .linkDead(let silence):
            self.logger.warning("no sign of life from the gateway; closing the connection", metadata: ["silent": "\(silence)"])
            self.reportFailedIdleProbe()
            self.close(reason: .heartbeatTimeout(silentFor: Duration(silence)), context: context)
            return
        case .none:
            break
        }
        self.scheduleHeartbeat(context: context)
    }

    private func requestTimedOut(id: UInt64) {
        guard let request = self.settle(id) else { return }
        let message =
            request.unsent == nil
            ? "no response to '\(request.method)' before its deadline"
            : "'\(request.method)' was still queued at its deadline (the gateway's \(self.sentCount) request slots were busy)"
        request.waiter.fail(TetherError(code: .timedOut, message: message))
    }

    /// Removes a request that ends before its response: frees its slot, sends CANCEL if it was
    /// on the wire, sends queued requests, and closes a drained connection.
    private func settle(_ id: UInt64) -> PendingRequest? {
        guard let request = self.pending.removeValue(forKey: id) else { return nil }
        self.deadlines.remove(id)
        if let context {
            if request.unsent == nil {
                self.sentCount -= 1
                self.send(.cancel(.init(requestID: id)), context: context)
            }
            self.sendWaiting(context: context)
            self.closeIfDrained(context: context)
        }
        return request
    }

    /// Sends queued requests while the gateway has free slots.
    /// - Parameter written: Requests the caller wrote just before, to flush with these.
    private func sendWaiting(context: ChannelHandlerContext, flush: FlushTiming = .now, written: Int = 0) {
        guard let negotiated = self.session.negotiated else { return }
        let limit = Self.requestLimit(negotiated)
        var wrote = written
        while self.sentCount < limit, let id = self.waiting.popFirst() {
            // In place: one lookup, and no copy of the request.
            guard let frame = self.pending[id]?.takeUnsent() else { continue }  // settled meanwhile
            self.sentCount += 1
            self.write(.request(frame), context: context)
            wrote += 1
        }
        guard wrote > 0 else { return }
        self.unflushed += wrote
        if flush == .coalescing, self.sentCount > wrote, self.unflushed < FlushTiming.maxUnflushedRequests {
            self.flushAtEndOfBatch(context: context)
        } else {
            self.flushNow(context: context)
        }
    }

    private func flushNow(context: ChannelHandlerContext) {
        self.unflushed = 0
        context.flush()
        self.heartbeat?.frameSent(at: context.eventLoop.now)
    }

    /// Flushes once the event loop has run the work queued so far: however many callers write
    /// meanwhile, they share one flush (one `writev`).
    private func flushAtEndOfBatch(context: ChannelHandlerContext) {
        guard !self.flushScheduled else { return }
        self.flushScheduled = true
        context.eventLoop.assumeIsolated().execute {
            self.flushScheduled = false
            guard let context = self.context else { return }  // closed meanwhile: its writes failed
            self.flushNow(context: context)
        }
    }

    /// Fails every queued request with ``TetherError/Code/notDispatched``: it never reached the
    /// gateway, so the client sends it again on its next connection.
    private func failUnsent(_ reason: String) {
        var unsent: [ResponseWaiter] = []
        for id in self.waiting {
            guard let request = self.pending[id], request.unsent != nil else { continue }
            self.pending[id] = nil
            self.deadlines.remove(id)
            unsent.append(request.waiter)
        }
        self.waiting.removeAll()
        // Last, once the handler is consistent: a callback may send a request.
        for waiter in unsent {
            waiter.fail(TetherError(code: .notDispatched, message: reason))
        }
    }

    private func complete(_ response: Frame.Response, context: ChannelHandlerContext) {
        guard let index = self.pending.index(forKey: response.id), self.pending.values[index].unsent == nil else {
            // Timed out or cancelled already (or never sent); PROTOCOL.md says to ignore it.
            return
        }
        let request = self.pending.remove(at: index).value
        self.sentCount -= 1
        self.deadlines.remove(response.id)
        defer { self.sendWaiting(context: context) }
        switch response.status {
        case .ok:
            request.waiter.succeed(response.body)
        case .unavailable:
            // The gateway is draining and did not run the handler: safe to send again elsewhere.
            request.waiter.fail(TetherError(code: .notDispatched, message: response.message, status: response.status))
        case .deadlineExceeded where context.eventLoop.now >= request.deadline:
            // The gateway enforced the caller's own deadline: to the caller, it timed out.
            request.waiter.fail(
                TetherError(code: .timedOut, message: "no response to '\(request.method)' before its deadline", status: response.status)
            )
        default:
            let message = response.message.isEmpty ? "'\(request.method)' failed" : response.message
            request.waiter.fail(TetherError(code: .serverError, message: message, status: response.status))
        }
        self.closeIfDrained(context: context)
    }

    private func closeIfDrained(context: ChannelHandlerContext) {
        if case .draining = self.session.phase, self.pending.isEmpty {
            self.close(reason: self.closeReason ?? .shutdown, context: context)
        }
    }

    func send(_ payload: Frame.Payload, context: ChannelHandlerContext) {
        self.write(payload, context: context)
        self.flushNow(context: context)
    }

    /// Writes a frame with the negotiated flags, without flushing.
    func write(_ payload: Frame.Payload, context: ChannelHandlerContext, promise: EventLoopPromise<Void>? = nil) {
        context.write(Frame(payload, flags: self.session.outboundFlags), through: self.encoder, promise: promise)
    }

    func sendErrorAndClose(_ error: ProtocolError, context: ChannelHandlerContext) {
        self.closeReason = self.closeReason ?? .protocolViolation(error)
        self.session.closed()
        let frame = Frame(.error(.init(code: error.code, message: error.message)), flags: self.session.outboundFlags)
        let written = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(Self.wrapOutboundOut(frame), promise: written)
        written.futureResult.assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }

    private func close(reason: DisconnectReason, context: ChannelHandlerContext) {
        self.closeReason = self.closeReason ?? reason
        context.close(promise: nil)
    }

    /// Tells the client that the idle probe waiting now went unanswered: the link died, or
    /// broke (a reset from a NAT that forgot the connection), while the probe waited.
    private func reportFailedIdleProbe() {
        guard !self.closedByClient, let probe = self.heartbeat?.outstandingIdleProbe else { return }
        self.callbacks.idleProbe(probe, false)
    }

    /// Settles everything when the channel goes away: pending requests, promises, timers.
    private func finish(context: ChannelHandlerContext) {
        switch self.closeReason {
        case nil, .closedByPeer, .transportError: self.reportFailedIdleProbe()
        default: break  // decided here (a heartbeat timeout reports itself), or by the gateway
        }
        self.session.closed()
        self.stopReliable()
        self.handshakeTimer?.cancel()
        self.heartbeatTimer?.cancel()
        self.heartbeat = nil
        let reason = self.closeReason ?? .closedByPeer
        self.closeReason = reason
        if self.establishedAt == nil {
            self.established.fail(TetherError(code: .handshakeFailed, message: "the connection closed during the handshake: \(reason)"))
        }
        self.failUnsent("the connection closed before the request was sent: \(reason)")
        let pending = self.pending
        self.pending.removeAll()
        self.sentCount = 0
        _ = self.deadlines.removeAll()
        self.deadlineTimer.cancel()
        for (_, request) in pending {
            request.waiter.fail(
                TetherError(code: .connectionLost, message: "the connection closed while '\(request.method)' was in flight: \(reason)")
            )
        }
        let uptime = self.establishedAt.map { Duration(context.eventLoop.now - $0) } ?? .zero
        self.closed.succeed(ConnectionClosure(reason: reason, uptime: uptime))
    }
}

@available(*, unavailable)
extension ClientConnectionHandler: Sendable {}
