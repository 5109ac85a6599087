import Logging
import NIOCore
import TetherCompression
import TetherCore
import TetherNIO

/// The gateway's one channel handler for one connection.
///
/// It sits on top of the transport (TCP, TLS, a WebSocket framer) and reads and writes bytes
/// through its ``FrameConnection``. Everything the connection knows is its
/// ``GatewayConnectionStateMachine``, one value; the handler turns channel events, timer
/// callbacks and the ends of its tasks into machine events, and carries out what the machine
/// returns. It holds only I/O resources: the channel, the timer, and the tasks the machine
/// asks for (a handshake, request handlers, reliable batches and store reads).
///
/// - HELLO: a task authenticates the client (``GatewayServices/handshake(_:connectionID:remoteAddress:clientCertificate:logger:)``);
///   then WELCOME, or the refusal and a close.
/// - REQUEST: an inline handler answers at once; a task handler runs in a task once a slot is
///   free (`+Requests`).
/// - MESSAGE and DELIVERY_ACK: the machine's inbox hands batches to the outbox's lane, its
///   pump says what to read and send (`+Reliable`).
///
/// An idle connection costs its channel and this handler, not a task. Everything runs on the
/// channel's event loop; the connection's tasks reach it through a ``ConnectionHandle``.
final class GatewayConnectionHandler: ChannelDuplexHandler, NIOScheduledCallbackHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Requests that may wait (for a handler slot, or the rate's next token) before the channel
    /// stops reading. The client was told the slot limit in WELCOME, so only a client that
    /// ignores it, or sends faster than its rate, gets here; reading on a little longer lets
    /// its CANCELs and PINGs through.
    static let maxWaiting = 16

    var machine: GatewayConnectionStateMachine
    let io: FrameConnection
    let services: GatewayServices
    let id: UInt64
    /// How the connection reached the gateway (a label of its metrics).
    let transport: ConnectionTransport
    /// What the connection's last frame said (a status or GOAWAY reason), for the metrics of
    /// closed connections; `nil` while none was written.
    var closeCode: String?
    /// The gateway's logger; ``logger`` adds the connection's id when it is used, so that an
    /// idle connection holds no copy of it.
    let baseLogger: Logger
    /// The channel's loop; the timer keeps running on it after the channel closed, while a
    /// reliable batch of the connection still runs under its time limit.
    let eventLoop: any EventLoop
    /// Where the connection's tasks run: its event loop, or the global executor (`nil`).
    let executor: (any TaskExecutor)?
    /// The batcher of this connection's event loop: pushes it holds go out before anything
    /// else this handler writes.
    let pushes: PushBatcher?
    var context: ChannelHandlerContext?
    /// What every request of the established connection shares.
    var scope: ConnectionScope?
    /// The tasks running request handlers, by request id: cancelled when their request is
    /// settled (answered at its deadline, cancelled, the connection closed).
    var handlerTasks: [UInt64: Task<Void, Never>] = [:]
    /// The request whose handler is being started, and one whose handler ended inside that
    /// call (it answered before it first suspended): its task is not recorded.
    var starting: UInt64?
    var finishedWhileStarting: UInt64?
    /// Reliable batches held to the handler time limit, by token.
    var limitedTasks: [UInt64: Task<Void, Never>] = [:]
    /// With reliable delivery: the client's outbox and its lane.
    var lane: (outbox: OutboxID, lane: ReliableLanes.Lane)?
    /// The connection's place in the admission limits, while it counts there.
    var admitted: ConnectionAdmission.Ticket?
    /// Admitted before the handler was added (an HTTP stream's GET, a WebSocket upgrade: their
    /// refusals are HTTP answers): it is not asked again.
    private let preadmitted: Bool
    /// Whether the connection is in the registry (and counted by the gateway's activity).
    var registered = false
    /// Frames are being handled (``decodeFrames(now:)`` is under way).
    private var decoding = false
    /// The connection's share of the gateway's memory budget; `nil` on a loop without one.
    var account: BudgetAccount?
    /// Reads are paused until the memory budget has room.
    var budgetPaused = false
    /// Inflates stored deliveries that were compressed, for a client that did not negotiate
    /// compression; made on first use.
    var deliveryInflater: PayloadInflater?
    /// The connection subscribed to a channel once: it leaves the hub when it closes.
    var subscribesToChannels = false
    /// The channels whose live publications this connection writes: those published after
    /// the sequence given, but for those up to a position the subscriber had already (see
    /// ``ChannelHub``).
    var liveChannels: [String: LiveChannel] = [:]
    /// Channel recoveries whose next page waits for the connection to drain.
    var recoveries: [ChannelHub.Continuation] = []
    var recoveryScheduled = false
    /// The SUBSCRIBEs waiting for the store to answer where their channel's stream is, by
    /// channel: a later SUBSCRIBE or UNSUBSCRIBE of the channel voids the answer.
    var subscribing: [String: UInt64] = [:]
    /// Whether a page of a recovery is being read from the store.
    var readingStore = false
    /// The subscriptions that get presence events, by channel: how far their members' pages
    /// reached.
    var presenceCursors: [String: PresenceCursor] = [:]
    /// The channels whose members' pages wait for the connection to drain, in order.
    var presenceSnapshots: [String] = []

    init(
        services: GatewayServices,
        id: UInt64,
        framing: Framing,
        transport: ConnectionTransport = .accepted,
        eventLoop: any EventLoop,
        pushes: PushBatcher?,
        admitted: ConnectionAdmission.Ticket? = nil,
        logger: Logger
    ) {
        self.admitted = admitted
        self.preadmitted = admitted != nil
        self.machine = GatewayConnectionStateMachine(configuration: services.connectionConfiguration, now: services.clock.now)
        self.io = FrameConnection(framing: framing, holdsReadsWhileUnwritable: true)
        let metrics = services.metrics.transport(transport)
        self.io.countBytes = { read, written in
            if read > 0 { metrics.bytesReceived.increment(by: read) }
            if written > 0 { metrics.bytesSent.increment(by: written) }
        }
        self.services = services
        self.id = id
        self.transport = transport
        self.eventLoop = eventLoop
        self.executor = services.executor(for: eventLoop)
        self.pushes = pushes
        self.baseLogger = logger
    }

    /// The logger of this connection: the gateway's, with the connection's id as metadata.
    var logger: Logger {
        var logger = self.baseLogger
        logger[metadataKey: "tether.connection"] = "\(self.id)"
        return logger
    }

    /// This handler, for its tasks and other loops.
    var handle: ConnectionHandle {
        ConnectionHandle(NIOLoopBound(self, eventLoop: self.eventLoop))
    }

    // MARK: Lifecycle

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.io.handlerAdded(context: context)
        self.account = self.services.intakeMonitor(for: context.eventLoop)?.account(for: self)
        if context.channel.isActive { self.register(context: context) }
        self.armTimer(now: self.services.clock.now)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.closed()
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        self.register(context: context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.closed()
        self.logger.debug("connection closed")
        context.fireChannelInactive()
    }

    private func register(context: ChannelHandlerContext) {
        guard !self.registered else { return }
        self.registered = true
        self.services.activity.enter()
        let metrics = self.services.metrics.transport(self.transport)
        metrics.accepted.increment()
        metrics.open.increment()
        if let goAway = self.services.registry.add(self.id, handler: NIOLoopBound(self, eventLoop: context.eventLoop)) {
            self.drain(goAway)
            return
        }
        guard !self.preadmitted else { return }
        let address = context.channel.remoteAddress?.ipAddress
        switch self.services.admission.admit(address, now: self.services.clock.now) {
        case .success(let ticket):
            self.admitted = ticket
        case .failure(let refusal):
            self.services.refusalLog.log(
                self.logger,
                .warning,
                "refusing connections",
                metadata: ["reason": "\(refusal.report.message)", "remote": "\(address ?? "-")"]
            )
            self.services.metrics.refused(refusal.limit)
            self.writeAndClose(
                .error(refusal.report),
                settle: self.machine.startClosing(writingLastFrame: true, now: self.services.clock.now)
            )
        }
    }

    /// The channel closed: settle the requests (cancelling their handlers), leave the registry
    /// and the admission counts. Reliable batches under way still commit.
    private func closed() {
        self.account?.close()
        guard let closed = self.machine.channelClosed() else { return }
        self.cancelHandlers(closed.settled)
        for task in self.handlerTasks.values { task.cancel() }
        self.handlerTasks.removeAll()
        if let admitted = self.admitted {
            self.services.admission.left(admitted)
            self.admitted = nil
        }
        self.leaveChannels()
        if self.registered {
            let info = self.services.registry.remove(self.id)
            self.io.tellByteCounts()
            self.services.metrics.transport(self.transport).open.decrement()
            self.services.metrics.closed(self.transport, code: self.closeCode ?? "none")
            if let info, let hook = self.services.router.disconnected { hook(info, self.closeCode ?? "none") }
        }
        if closed.done { self.done() }
    }

    /// Closed, and the last task ended.
    func done() {
        self.io.timer.cancel()
        if let lane = self.lane {
            self.services.reliable?.lanes.checkIn(lane.outbox)
            self.lane = nil
        }
        if self.registered { self.services.activity.leave() }
    }

    /// One of the connection's tasks ended.
    func taskEnded() {
        if self.machine.taskEnded() { self.done() }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let error = error as? ProtocolError {
            self.perform(self.machine.violation(error, now: self.services.clock.now), now: self.services.clock.now)
        } else {
            self.logger.debug("connection error", metadata: ["error": "\(error)"])
            self.closeNow()
        }
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.io.channelRead(Self.unwrapInboundIn(data))
        self.decodeFrames(now: self.services.clock.now)
    }

    /// Handles the frames read so far, until reads are held: what waits (requests, reliable
    /// messages) is at its limit. The rest of the read waits, undecoded, for room.
    private func decodeFrames(now: TetherInstant) {
        // A handler that answers before it suspends ends inside this loop, and may make room:
        // the loop goes on, rather than a nested one per request.
        guard !self.decoding else { return }
        self.decoding = true
        defer { self.decoding = false }
        while !self.machine.holdsReads, let inbound = self.io.next() {
            switch inbound {
            case .frame(let frame):
                self.perform(self.machine.received(frame, now: now), now: now)
            case .violation(let error):
                self.perform(self.machine.violation(error, now: now), now: now)
            }
            self.chargeCompression(now: now)  // past its rate, the next frame waits
        }
        self.armTimer(now: now)  // for the deadlines of the requests just read
    }

    /// Charges what the connection's compression inflated and deflated since it was last
    /// charged to its rate (the machine then holds reads while it pays for it).
    private func chargeCompression(now: TetherInstant) {
        guard self.io.compression != nil else { return }
        let work = self.io.takeCompressionWork()
        if work > 0 { self.machine.compressed(work, now: now) }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.pushes?.drain()
        self.io.channelReadComplete(context: context)
        if self.io.compression != nil {
            // What the replies written during the read deflated.
            self.chargeCompression(now: self.services.clock.now)
            self.armTimer(now: self.services.clock.now)
        }
        self.publishHoldings()
        context.fireChannelReadComplete()
    }

    /// Whether reads are held: requests or messages wait at their limits, or the memory budget
    /// is exhausted while the connection holds bytes.
    private var holdsReads: Bool { self.machine.holdsReads || self.budgetPaused }

    func perform(_ action: GatewayConnectionStateMachine.OnFrame, now: TetherInstant) {
        switch action {
        case .none:
            break
        case .authenticate(let hello):
            self.startHandshake(hello)
        case .route(let request):
            self.route(request, directly: true, now: now)
        case .cancelHandler(let id):
            self.handlerTasks.removeValue(forKey: id)?.cancel()
        case .write(let payload):
            if case .response(let refusal) = payload {
                // The connection answered without routing it: draining, or over its limits.
                self.services.notRoutedMetrics.ended(refusal.status, nanoseconds: nil)
            }
            self.write(payload)
            self.flushSoon()
        case .processBatch(let batch):
            self.startBatch(batch)
        case .pump(let actions):
            self.pump(actions)
        case .subscribe(let request):
            self.subscribe(request)
        case .unsubscribe(let channel):
            self.unsubscribe(from: channel)
        case .close(let report, let settle):
            self.logger.info("client reported an error", metadata: ["code": "\(report.code)", "message": "\(report.message)"])
            self.closeCode = self.closeCode ?? "client_\(report.code.metricLabel)"
            self.cancelHandlers(settle)
            self.closeNow()
        case .writeAndClose(let payload, let settle):
            if case .error(let error) = payload {
                self.logger.info("client broke the protocol", metadata: ["code": "\(error.code)", "error": "\(error.message)"])
            }
            self.writeAndClose(payload, settle: settle)
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        let writable = self.io.writabilityChanged(context: context, ownerHolds: self.holdsReads)
        if let actions = self.machine.writabilityChanged(writable) { self.pump(actions) }
        if writable { self.scheduleRecoveries() }
        self.publishHoldings()
        context.fireChannelWritabilityChanged()
    }

    func read(context: ChannelHandlerContext) {
        _ = self.pausesForBudget()
        self.io.read(context: context, ownerHolds: self.holdsReads)
    }

    /// Reading may resume: something that held it (requests or messages waiting) is gone. What
    /// was read and not decoded is handled first.
    func resumeReading() {
        guard let context = self.context, !self.decoding, !self.machine.holdsReads, !self.machine.isClosing else { return }
        if self.io.hasBufferedBytes {
            self.decodeFrames(now: self.services.clock.now)
            self.flushSoon()
            self.publishHoldings()
        }
        self.io.resumeReading(context: context, ownerHolds: self.holdsReads)
    }

    // MARK: Time

    /// Makes the timer fire at the machine's next deadline, if that is earlier than it fires now.
    func armTimer(now: TetherInstant) {
        let next = self.machine.nextDeadline(now: now)
        guard self.io.timer.needsArming(at: next), !self.machine.isDone else { return }
        self.io.timer.arm(at: next, clock: self.services.clock, on: self.eventLoop, handler: self)
    }

    func handleScheduledCallback(eventLoop: some EventLoop) {
        self.io.timerFired()
        let now = self.services.clock.now
        let due = self.machine.timerFired(now: now)
        for token in due.cancelTimeLimited { self.limitedTasks[token]?.cancel() }
        defer { self.armTimer(now: now) }
        guard self.context != nil else { return }  // closed: only time limits were due
        if !due.responses.isEmpty {
            self.pushes?.drain()
            for response in due.responses { self.write(.response(response)) }
            self.flushSoon()
        }
        self.cancelHandlers(due.cancel)
        for request in due.route { self.route(request, directly: false, now: now) }
        if let batch = due.batch { self.startBatch(batch) }
        if let pump = due.pump { self.pump(pump) }
        switch due.end {
        case .writeAndClose(let payload, let settle)?:
            if case .goAway(let goAway) = payload {
                self.logger.info("closing an idle connection", metadata: ["reason": "\(goAway.message)"])
            }
            self.writeAndClose(payload, settle: settle)
        case .close(let settle, let lastFrameStuck)?:
            if lastFrameStuck {
                self.logger.info("the client does not read its last frame; closing the connection")
            } else {
                self.logger.info("grace period over; closing the connection", metadata: ["requests": "\(settle.count)"])
            }
            self.cancelHandlers(settle)
            self.closeNow()
        case .drain(let goAway)?:
            self.logger.info("the client's credentials expired; draining the connection")
            self.drain(goAway)
        case nil:
            break
        }
        self.resumeReading()  // paced requests and messages may have left
    }

}

@available(*, unavailable)
extension GatewayConnectionHandler: Sendable {}
