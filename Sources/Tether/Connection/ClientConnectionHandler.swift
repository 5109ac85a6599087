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

/// The client's one channel handler for one connection.
///
/// It sits on top of the transport (right on a TCP socket; on TLS; on a WebSocket framer) and
/// reads and writes bytes: as a byte stream, or one frame per message (``Framing``). It owns
/// the codec (``FrameReader`` and ``FrameWriter``, as values), one timer, and the connection's
/// ``StateMachine``; it turns channel events and the client's calls into machine events and
/// performs what the machine returns. Everything runs on the channel's event loop.
///
/// The client calls ``sendRequest(_:deadline:waiter:)``, ``sendRequests(_:)``,
/// ``cancelRequest(id:)``, ``drain()`` and the reliable-messaging entry points on the event
/// loop, through ``ClientConnection``.
final class ClientConnectionHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

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
        /// What the app wants of the heartbeat now: its mode, and with NAT-timeout probing the
        /// longest interval the network is known (or being tested) to keep an idle connection.
        /// Read when the heartbeat starts and on ``ClientConnectionHandler/refreshHeartbeatMode()``.
        var heartbeatPreference: @Sendable () -> StateMachine.HeartbeatPreference = { .init(mode: .foreground) }
        /// An idle probe was answered (`true`) or the link died while it waited (`false`).
        var idleProbe: @Sendable (HeartbeatStateMachine.IdleProbe, _ answered: Bool) -> Void = { _, _ in }
    }

    /// A request to send, its deadline, and who waits for its response.
    typealias RequestSubmission = (request: Frame.Request, deadline: NIODeadline, waiter: ResponseWaiter)

    /// A request written from a caller on the event loop waits for the end of the loop's current
    /// batch to be flushed only while fewer than this many are written and not flushed: a long
    /// batch leaves in chunks, so the gateway can start on the first while the client writes the
    /// rest, and both sides work at once.
    static let maxUnflushedRequests = 64

    private var machine: StateMachine
    private var reader: FrameReader
    private var writer: FrameWriter
    private let maxInboundBodySize: Int
    let callbacks: Callbacks
    let logger: Logger
    /// Succeeds with the negotiated parameters when WELCOME arrives; fails if the handshake does not complete.
    private let established: EventLoopPromise<Handshake.Negotiated>
    /// Succeeds once the channel is closed.
    private let closed: EventLoopPromise<ConnectionClosure>
    private var context: ChannelHandlerContext?
    /// The connection's one timer, armed at the machine's next deadline.
    private var timer = DeadlineTimer()
    /// Between a read and its `channelReadComplete`: what is written meanwhile is flushed then.
    private var reading = false
    /// Frames are written and not flushed (at the end of the read, or of the loop's batch).
    private var flushOwed = false
    /// A flush is queued on the event loop (``flushAtEndOfBatch(context:)``).
    private var flushScheduled = false
    /// Requests written since the last flush.
    private var unflushedRequests = 0
    /// Writing can fire a writability change that lands in ``pumpMessages(context:)`` again.
    private var pumping = false

    init(
        configuration: Configuration,
        framing: Framing,
        callbacks: Callbacks,
        established: EventLoopPromise<Handshake.Negotiated>,
        closed: EventLoopPromise<ConnectionClosure>,
        logger: Logger
    ) {
        self.machine = StateMachine(
            configuration: .init(
                hello: configuration.hello,
                handshakeTimeout: configuration.handshakeTimeout,
                heartbeat: configuration.heartbeat,
                reliability: configuration.reliability
            )
        )
        self.reader = FrameReader(framing: framing)
        self.writer = FrameWriter(framing: framing)
        self.maxInboundBodySize = configuration.maxInboundBodySize
        self.callbacks = callbacks
        self.established = established
        self.closed = closed
        self.logger = logger
    }

    /// The connection's state, for tests.
    var state: StateMachine { self.machine }

    // MARK: Channel events

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.writer = FrameWriter(framing: self.writer.framing, allocator: context.channel.allocator)
        if context.channel.isActive { self.start(context: context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.finish(context: context)
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        self.start(context: context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.finish(context: context)
        context.fireChannelInactive()
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if context.channel.isWritable { self.pumpMessages(context: context) }
        context.fireChannelWritabilityChanged()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let error = error as? ProtocolError {
            self.violation(error, context: context)
        } else {
            self.machine.transportFailed("\(error)")
            self.close(context: context)
        }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.reading = true
        self.reader.append(Self.unwrapInboundIn(data))
        do {
            while let frame = try self.reader.next() {
                self.receive(frame, context: context)
            }
        } catch {
            self.violation(error, context: context)
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.reading = false
        self.reader.readComplete()
        if self.flushOwed { self.flushNow(context: context) }
        context.fireChannelReadComplete()
    }

    private func start(context: ChannelHandlerContext) {
        guard let hello = self.machine.start(now: context.eventLoop.now) else { return }
        self.write(.hello(hello), context: context)
        self.flushNow(context: context)
        self.armTimer(context: context)
    }

    // MARK: Frames

    private func receive(_ frame: Frame, context: ChannelHandlerContext) {
        let action = self.machine.received(frame, now: context.eventLoop.now, preference: self.callbacks.heartbeatPreference())
        switch action {
        case .none:
            break

        case .established(let negotiated):
            self.reader.maxBodySize = self.maxInboundBodySize
            self.armTimer(context: context)
            self.established.succeed(negotiated)

        case .complete(let waiter, let result, let after):
            self.perform(after, context: context)
            if after.send != nil { self.scheduleFlush(context: context) }
            waiter.resume(with: result)

        case .push(let push):
            self.callbacks.push(push)

        case .sendPong(let ping):
            self.write(.pong(ping), context: context)
            self.scheduleFlush(context: context)

        case .goAway(let goAway, let unsent, let closeNow):
            self.logger.info("gateway is going away", metadata: ["reason": "\(goAway.reason)", "message": "\(goAway.message)"])
            self.callbacks.goAway(goAway)
            let error = TetherError(
                code: .notDispatched,
                message: "the gateway is going away; the request will be sent on the next connection"
            )
            for waiter in unsent { waiter.fail(error) }
            if closeNow != nil { self.close(context: context) }

        case .refused(let error, _):
            self.logger.info("the gateway refused the connection", metadata: ["error": "\(error)"])
            self.established.fail(error)
            self.close(context: context)

        case .close(let reason):
            self.logger.warning("gateway reported an error", metadata: ["reason": "\(reason)"])
            self.close(context: context)

        case .sendErrorAndClose(let error):
            self.logger.warning("gateway broke the protocol", metadata: ["error": "\(error)"])
            self.sendErrorAndClose(error, context: context)

        case .messagesAcknowledged(let entries):
            self.callbacks.reliable?.acknowledged(entries)
            self.pumpMessages(context: context)

        case .delivery(let delivery, let epoch):
            guard let verdict = self.callbacks.reliable?.delivery(delivery, epoch), case .gap(let expected) = verdict else { break }
            self.logger.warning("the gateway skipped a delivery", metadata: ["expected": "\(expected)", "got": "\(delivery.sequence)"])
            self.violation(
                ProtocolError(code: .protocolError, message: "delivery \(delivery.sequence) skips \(expected)"),
                context: context
            )
        }
        self.reportIdleProbe()
    }

    private func violation(_ error: ProtocolError, context: ChannelHandlerContext) {
        guard case .sendErrorAndClose(let error) = self.machine.violation(error) else { return }
        self.logger.warning("gateway sent an invalid frame", metadata: ["error": "\(error)"])
        self.sendErrorAndClose(error, context: context)
    }

    /// Writes the request that a freed slot let go (the caller flushes), and closes a
    /// connection that drained.
    private func perform(_ after: StateMachine.AfterSettle, context: ChannelHandlerContext) {
        if let request = after.send {
            self.write(.request(request), context: context)
        }
        if after.close != nil { self.close(context: context) }
    }

    private func reportIdleProbe() {
        guard let report = self.machine.takeIdleProbeReport() else { return }
        self.callbacks.idleProbe(report.probe, report.answered)
    }

    // MARK: Requests, called by the client on the event loop

    /// Sends a request; `waiter` gets the response body or a ``TetherError``, at the latest when
    /// `deadline` passes. A callback waiter runs here, on the event loop, and may send requests.
    ///
    /// For callers that run on the event loop, one request each: if other requests are on the
    /// wire, the flush waits for the end of the loop's current batch of work (or read), so that
    /// the requests of every caller resumed in that batch leave in one write. Alone, it leaves
    /// at once.
    func sendRequest(_ request: Frame.Request, deadline: NIODeadline, waiter: ResponseWaiter) {
        guard let context else {
            waiter.fail(TetherError(code: .notDispatched, message: "the connection no longer accepts requests"))
            return
        }
        guard self.submit(request, deadline: deadline, waiter: waiter, context: context) else { return }
        self.armTimer(context: context)
        if self.reading || (self.machine.requestsOnWire > 1 && self.unflushedRequests < Self.maxUnflushedRequests) {
            self.scheduleFlush(context: context)
        } else {
            self.flushNow(context: context)
        }
    }

    /// Sends several requests, in one write as far as the gateway's slots allow.
    func sendRequests(_ requests: some Sequence<RequestSubmission>) {
        guard let context else {
            for (_, _, waiter) in requests {
                waiter.fail(TetherError(code: .notDispatched, message: "the connection no longer accepts requests"))
            }
            return
        }
        var wrote = false
        for (request, deadline, waiter) in requests {
            wrote = self.submit(request, deadline: deadline, waiter: waiter, context: context) || wrote
        }
        self.armTimer(context: context)
        if wrote { self.flushNow(context: context) }
    }

    /// - Returns: Whether the request was written.
    private func submit(_ request: Frame.Request, deadline: NIODeadline, waiter: ResponseWaiter, context: ChannelHandlerContext) -> Bool {
        switch self.machine.submit(request, deadline: deadline, waiter: waiter) {
        case .write(let request):
            self.write(.request(request), context: context)
            self.unflushedRequests += 1
            return true
        case .queued:
            return false
        case .fail(let waiter, let error):
            waiter.fail(error)
            return false
        }
    }

    /// Abandons a request: fails it with ``TetherError/Code/cancelled`` and, if it was sent, sends CANCEL.
    func cancelRequest(id: UInt64) {
        guard let context, case .cancelled(let waiter, let error, let sendCancel, let after) = self.machine.cancel(id) else { return }
        if sendCancel { self.write(.cancel(.init(requestID: id)), context: context) }
        self.perform(after, context: context)
        if self.flushOwed { self.flushNow(context: context) }  // a CANCEL does not wait
        waiter.fail(error)
    }

    /// Stops accepting requests and closes once those in flight are answered.
    func drain() {
        guard let context, self.machine.drain() != nil else { return }
        self.close(context: context)
    }

    /// Makes the heartbeat follow what the app wants now (called by the client, on the event
    /// loop). Reading the preference here, not passing it, means that calls queued in any order
    /// leave the latest in force.
    func refreshHeartbeatMode() {
        guard let context else { return }
        if let id = self.machine.heartbeatPreferenceChanged(self.callbacks.heartbeatPreference(), now: context.eventLoop.now) {
            self.write(.ping(.init(id: id)), context: context)
            self.flushNow(context: context)
        }
        self.armTimer(context: context)
    }

    /// The client is closing this connection on purpose (a network change, a shutdown).
    func closeAtClientRequest() {
        self.machine.closeRequested()
        if let context { self.close(context: context) }
    }

    // MARK: Reliable messages, called by the client on the event loop

    /// Queues messages to send on this connection.
    func enqueueMessages(_ records: [OutboxRecord]) {
        guard let context, self.machine.enqueueMessages(records) else { return }
        self.pumpMessages(context: context)
    }

    /// A message expired: its tombstone replaces it.
    func replaceMessage(with tombstone: OutboxRecord) {
        self.machine.replaceMessage(with: tombstone)
    }

    /// Tells the gateway that every delivery up to `sequence` was processed.
    func acknowledgeDeliveries(upTo sequence: UInt64) {
        guard let context, let ack = self.machine.deliveryAck(upTo: sequence) else { return }
        self.write(.deliveryAck(ack), context: context)
        self.flushNow(context: context)
    }

    /// Sends messages while the window and the channel's buffer allow: messages never pile up
    /// in the channel, so PINGs, CANCELs and acknowledgements are not stuck behind them.
    private func pumpMessages(context: ChannelHandlerContext) {
        guard !self.pumping else { return }
        self.pumping = true
        defer { self.pumping = false }
        let now = context.eventLoop.now
        let wallClock = WallClock.milliseconds()
        var firstTransmissions: [UInt64] = []
        var wrote = false
        while context.channel.isWritable, let (message, first) = self.machine.nextMessage(now: now, wallClock: wallClock) {
            self.write(.message(message), context: context)
            if first { firstTransmissions.append(message.id) }
            wrote = true
        }
        if wrote {
            self.flushNow(context: context)
            self.armTimer(context: context)
        }
        if !firstTransmissions.isEmpty { self.callbacks.reliable?.sent(firstTransmissions) }
    }

    // MARK: Time

    /// Makes the timer fire at the machine's next deadline, if that is earlier than it fires now.
    private func armTimer(context: ChannelHandlerContext) {
        let next = self.machine.nextDeadline
        guard self.timer.needsArming(at: next) else { return }
        self.timer.arm(at: next, on: context.eventLoop) { [self] in
            self.timer.fired()
            guard let context = self.context else { return }
            self.timerFired(context: context)
        }
    }

    private func timerFired(context: ChannelHandlerContext) {
        let due = self.machine.timerFired(now: context.eventLoop.now)
        if let error = due.handshakeTimedOut {
            self.established.fail(error)
        }
        for id in due.cancels { self.write(.cancel(.init(requestID: id)), context: context) }
        for request in due.send { self.write(.request(request), context: context) }
        switch due.heartbeat {
        case .sendPing(let id):
            self.write(.ping(.init(id: id)), context: context)
        case .linkDead(let silence):
            self.logger.warning("no sign of life from the gateway; closing the connection", metadata: ["silent": "\(silence)"])
        case .none:
            break
        }
        if self.flushOwed { self.flushNow(context: context) }
        if due.pumpMessages { self.pumpMessages(context: context) }
        for (waiter, error) in due.expired { waiter.fail(error) }
        self.reportIdleProbe()
        if due.close != nil {
            self.close(context: context)
        } else {
            self.armTimer(context: context)
        }
    }

    // MARK: Writing

    /// Writes a frame with the negotiated flags, without flushing.
    private func write(_ payload: Frame.Payload, context: ChannelHandlerContext) {
        do {
            if let bytes = try self.writer.append(Frame(payload, flags: self.machine.outboundFlags)) {
                context.write(Self.wrapOutboundOut(bytes), promise: nil)
            }
            self.flushOwed = true
        } catch {
            // The client checks sizes before it gets here: a frame it cannot encode is a bug.
            self.logger.error("cannot encode a frame; closing the connection", metadata: ["error": "\(error)"])
            self.machine.transportFailed("cannot encode \(payload.type): \(error)")
            self.close(context: context)
        }
    }

    /// Flushes at the end of the current read, or else of the loop's current batch of work
    /// (at once once ``maxUnflushedRequests`` requests wait for it).
    private func scheduleFlush(context: ChannelHandlerContext) {
        if self.unflushedRequests >= Self.maxUnflushedRequests {
            self.flushNow(context: context)
        } else if !self.reading {
            self.flushAtEndOfBatch(context: context)
        }
    }

    private func flushNow(context: ChannelHandlerContext) {
        if let bytes = self.writer.take() {
            context.write(Self.wrapOutboundOut(bytes), promise: nil)
        }
        self.flushOwed = false
        self.unflushedRequests = 0
        context.flush()
        self.machine.flushed(now: context.eventLoop.now)
    }

    /// Flushes once the event loop has run the work queued so far: however many callers write
    /// meanwhile, they share one flush (one `writev`).
    private func flushAtEndOfBatch(context: ChannelHandlerContext) {
        guard !self.flushScheduled else { return }
        self.flushScheduled = true
        context.eventLoop.assumeIsolated().execute {
            self.flushScheduled = false
            guard self.flushOwed, let context = self.context else { return }  // flushed meanwhile, or closed
            self.flushNow(context: context)
        }
    }

    // MARK: Closing

    private func sendErrorAndClose(_ error: ProtocolError, context: ChannelHandlerContext) {
        self.write(.error(.init(code: error.code, message: error.message)), context: context)
        let written = context.eventLoop.makePromise(of: Void.self)
        context.write(Self.wrapOutboundOut(self.writer.take() ?? ByteBuffer()), promise: written)
        context.flush()
        written.futureResult.assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }

    /// Closes the channel after what was written so far. The machine knows why.
    private func close(context: ChannelHandlerContext) {
        if let bytes = self.writer.take() {
            context.write(Self.wrapOutboundOut(bytes), promise: nil)
            context.flush()
        }
        context.close(promise: nil)
    }

    /// Settles everything when the channel goes away: pending requests, promises, the timer.
    private func finish(context: ChannelHandlerContext) {
        self.timer.cancel()
        guard let closed = self.machine.closed(now: context.eventLoop.now) else { return }
        if let error = closed.handshakeFailed { self.established.fail(error) }
        for (waiter, error) in closed.failed { waiter.fail(error) }
        self.reportIdleProbe()
        self.closed.succeed(closed.closure)
    }
}

@available(*, unavailable)
extension ClientConnectionHandler: Sendable {}
