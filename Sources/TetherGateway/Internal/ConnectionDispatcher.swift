import Logging
import NIOCore
import TetherCore
import TetherNIO

/// Starts the application's work for the frames the protocol handler lets through, and holds
/// no task while there is none.
///
/// It is the top of a connection's pipeline, above ``GatewayConnectionHandler``, and runs on
/// the connection's event loop:
/// - HELLO: a task runs the handshake (authenticator, message store); on success the
///   connection is established here, then WELCOME is sent.
/// - REQUEST: an inline handler (``Gateway/handleInline(_:_:)``) is called at once, and an
///   unknown method answered at once. Otherwise a task runs its handler, at most
///   `maxConcurrentRequests` at once. Beyond that,
///   requests wait here; once ``maxWaiting`` wait, the channel stops reading from the socket
///   (TCP backpressure, not refusals). Until then CANCELs and PINGs are still read, and
///   deadlines and CANCELs reach waiting requests through the ``RequestRegistry``.
/// - MESSAGE and DELIVERY_ACK: to the connection's ``ReliableSession``, whose two loops are
///   the only tasks that live as long as a connection, and only with reliable delivery.
///
/// It also stops reading while the channel is not writable, so that a client that does not
/// read its responses does not get more of its requests read.
///
/// An idle connection thus costs its channel and handlers, not a parked task: a task keeps the
/// stack of its deepest call for as long as it lives, which was most of an idle connection's
/// memory.
final class ConnectionDispatcher: ChannelDuplexHandler, FrameReceiver {
    typealias InboundIn = Frame
    typealias OutboundIn = Frame
    typealias OutboundOut = Frame

    /// What a completed handshake established.
    struct Session: Sendable {
        var info: ConnectionInfo
        var welcome: Frame.Welcome
        /// With reliable delivery: the last delivery the client already has.
        var resume: UInt64?
    }

    /// Requests that may wait for a handler slot before the channel stops reading. The client
    /// was told the limit in WELCOME, so only a client that ignores it gets here; reading on a
    /// little longer lets its CANCELs and PINGs through.
    static let maxWaiting = 16

    private let gateway: Gateway
    private let id: UInt64
    private let protocolHandler: GatewayConnectionHandler
    private let requests: RequestRegistry
    private let logger: Logger
    /// Where the connection's tasks run: its event loop, or the global executor (`nil`).
    private let executor: (any TaskExecutor)?
    private let maxRunning: Int

    private var context: ChannelHandlerContext?
    /// Whether the connection is in the gateway's registry (and counted by its activity tracker).
    private var registered = false
    private var scope: ConnectionScope?
    private var reliable: ReliableSession?
    private var pump: Task<Void, Never>?
    private var running = 0
    /// Requests read while every slot was taken. Made on first use: an empty `CircularBuffer`
    /// already reserves room for 16 requests, more than an idle connection needs in all.
    private var waiting: CircularBuffer<(Frame.Request, Gateway.Handler)>?
    /// A `read` from the channel was held back; it is passed on once reading may resume.
    private var readHeld = false

    init(
        gateway: Gateway,
        id: UInt64,
        protocolHandler: GatewayConnectionHandler,
        requests: RequestRegistry,
        executor: (any TaskExecutor)?,
        logger: Logger
    ) {
        self.gateway = gateway
        self.id = id
        self.protocolHandler = protocolHandler
        self.requests = requests
        self.executor = executor
        self.maxRunning = gateway.configuration.limits.maxConcurrentRequestsPerConnection
        self.logger = logger
    }

    // MARK: Lifecycle

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.protocolHandler.connect(self, context: context)
        if context.channel.isActive { self.register(context: context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.unregister()
        self.protocolHandler.disconnect(self)
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        self.register(context: context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.unregister()
        self.logger.debug("connection closed")
        context.fireChannelInactive()
    }

    private func register(context: ChannelHandlerContext) {
        guard !self.registered else { return }
        self.registered = true
        self.gateway.activity.enter()
        let handler = NIOLoopBound(self.protocolHandler, eventLoop: context.eventLoop)
        let remoteAddress = context.channel.remoteAddress?.description
        if let goAway = self.gateway.registry.add(self.id, channel: context.channel, handler: handler, remoteAddress: remoteAddress) {
            context.triggerUserOutboundEvent(GatewayConnectionEvent.drain(goAway), promise: nil)
        }
    }

    /// The connection closed: forget it, stop reliable delivery. The protocol handler, below,
    /// already settled its requests, which cancelled their handlers.
    private func unregister() {
        guard self.registered else { return }
        self.registered = false
        self.gateway.registry.remove(self.id)
        self.reliable?.finish()
        self.pump?.cancel()
        self.reliable = nil
        self.pump = nil
        self.waiting = nil
        self.gateway.activity.leave()
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.receive(Self.unwrapInboundIn(data), context: context)
    }

    func receive(_ frame: Frame, context: ChannelHandlerContext) {
        switch frame.payload {
        case .hello(let hello):
            self.startHandshake(hello, context: context)
        case .request(let request):
            self.dispatch(request, context: context)
        case .message(let message):
            self.reliable?.receive(message)
        case .deliveryAck(let ack):
            self.reliable?.acknowledged(upTo: ack.sequence)
        default:
            break
        }
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        self.resumeReadingIfPossible(context: context)
        context.fireChannelWritabilityChanged()
    }

    // MARK: Outbound

    func read(context: ChannelHandlerContext) {
        if self.mustHoldReads(context: context) {
            self.readHeld = true
        } else {
            context.read()
        }
    }

    private func mustHoldReads(context: ChannelHandlerContext) -> Bool {
        (self.waiting?.count ?? 0) >= Self.maxWaiting || !context.channel.isWritable
    }

    private func resumeReadingIfPossible(context: ChannelHandlerContext) {
        guard self.readHeld, !self.mustHoldReads(context: context) else { return }
        self.readHeld = false
        context.read()
    }

    // MARK: Work

    private func startHandshake(_ hello: Frame.Hello, context: ChannelHandlerContext) {
        let gateway = self.gateway
        let id = self.id
        let logger = self.logger
        let writer = self.writer(context: context)
        let remoteAddress = context.channel.remoteAddress?.description
        let this = NIOLoopBound(self, eventLoop: context.eventLoop)
        gateway.activity.spawn(on: self.executor) {
            let session: Session?
            do {
                session = try await gateway.handshake(
                    hello,
                    connectionID: id,
                    remoteAddress: remoteAddress,
                    outbound: writer,
                    logger: logger
                )
            } catch {
                logger.debug("the connection closed during the handshake", metadata: ["error": "\(error)"])
                session = nil
            }
            guard let session else {
                writer.close()  // after the ERROR or GOAWAY that refused the client
                return
            }
            this.execute { $0.established(session) }
        }
    }

    /// The handshake succeeded: start reliable delivery if negotiated, then send WELCOME.
    private func established(_ session: Session) {
        guard self.registered, let context = self.context else { return }  // closed meanwhile
        self.scope = ConnectionScope(connection: session.info, logger: self.logger, gateway: self.gateway)
        if let resume = session.resume, let store = self.gateway.messageStore {
            let reliable = ReliableSession(
                gateway: self.gateway,
                store: store,
                connection: session.info,
                outbound: self.writer(context: context),
                logger: self.logger
            )
            self.reliable = reliable
            // The processor is never cancelled: a batch whose handlers ran must still be
            // committed, or a retransmission would run them again. It ends after `finish()`,
            // once its current batch is done. The pump is cancelled when the connection closes.
            self.gateway.activity.spawn(on: self.executor) { await reliable.runProcessor() }
            self.pump = self.gateway.activity.spawn(on: self.executor) { await reliable.runPump(from: resume) }
        }
        self.logger.debug(
            "client connected",
            metadata: ["client": "\(session.info.clientID)", "remote": "\(session.info.remoteAddress ?? "-")"]
        )
        context.writeAndFlush(Self.wrapOutboundOut(Frame(.welcome(session.welcome))), promise: nil)
    }

    /// Runs a request's handler: an inline one (or the `unknown method` answer) at once, a
    /// task's once a slot is free.
    private func dispatch(_ request: Frame.Request, context: ChannelHandlerContext) {
        guard let scope = self.scope else { return }  // the protocol handler forwards requests only once established
        switch self.gateway.routes.withLockedValue({ $0[request.method] }) {
        case .task(let handler):
            if self.running < self.maxRunning {
                self.start(request, handler: handler, scope: scope, context: context)
            } else {
                if self.waiting == nil { self.waiting = CircularBuffer(initialCapacity: 4) }
                self.waiting!.append((request, handler))
            }
        case .inline(let handler):
            self.answerAtOnce(request, handler: handler, scope: scope)
        case nil:
            self.answerAtOnce(request, handler: nil, scope: scope)
        }
    }

    /// Answers a request on the event loop: an inline handler's reply, or `unknown method`.
    private func answerAtOnce(_ request: Frame.Request, handler: Gateway.InlineHandler?, scope: ConnectionScope) {
        let response = self.gateway.answerInline(request, handler: handler, scope: scope)
        self.protocolHandler.writeAndFlush(Frame(.response(response)))
    }

    private func start(
        _ request: Frame.Request,
        handler: @escaping Gateway.Handler,
        scope: ConnectionScope,
        context: ChannelHandlerContext
    ) {
        // Answered by its deadline, or cancelled, while it waited: do not run it.
        guard self.requests.isPending(request.id) else { return }
        self.running += 1
        let gateway = self.gateway
        let requests = self.requests
        let writer = self.writer(context: context)
        let this = NIOLoopBound(self, eventLoop: context.eventLoop)
        // On the connection's loop, the handler starts at once, as an inline one would; its
        // task is queued only if it suspends.
        gateway.activity.spawn(on: self.executor, immediately: self.executor != nil) {
            await gateway.execute(request, handler: handler, requests: requests, scope: scope, outbound: writer)
            this.execute { $0.requestFinished() }
        }
    }

    private func writer(context: ChannelHandlerContext) -> ConnectionWriter {
        ConnectionWriter(channel: context.channel, handler: NIOLoopBound(self.protocolHandler, eventLoop: context.eventLoop))
    }

    private func requestFinished() {
        self.running -= 1
        guard let context = self.context, let scope = self.scope else { return }
        while self.running < self.maxRunning, let (request, handler) = self.waiting?.popFirst() {
            self.start(request, handler: handler, scope: scope, context: context)
        }
        if self.waiting?.isEmpty == true { self.waiting = nil }
        self.resumeReadingIfPossible(context: context)
    }
}

@available(*, unavailable)
extension ConnectionDispatcher: Sendable {}

extension NIOLoopBound {
    /// Runs `body` with the value on its event loop: at once if called there, else queued.
    fileprivate func execute(_ body: @escaping @Sendable (Value) -> Void) where Value: AnyObject {
        if self.eventLoop.inEventLoop {
            body(self.value)
        } else {
            self.eventLoop.execute { body(self.value) }
        }
    }
}
