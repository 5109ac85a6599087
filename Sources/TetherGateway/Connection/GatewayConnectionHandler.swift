import Foundation
import Logging
import NIOCore
import NIOSSL
import TetherCore
import TetherNIO
import X509

/// The gateway's one channel handler for one connection.
///
/// It sits on top of the transport and reads and writes bytes (a byte stream, or one frame per
/// message; see ``Framing``). It owns the codec (``FrameReader`` and ``FrameWriter``, as
/// values), one timer, and the connection's ``StateMachine``, turns channel events into machine
/// events and performs what the machine returns:
/// - HELLO: a task runs the handshake (authenticator, message store); then WELCOME, or the
///   refusal and a close.
/// - REQUEST: an inline handler (``Gateway/handleInline(_:_:)``) is called at once, and an
///   unknown method answered at once; otherwise a task runs the handler once a slot is free.
///   Deadlines and CANCELs settle the request here, on the event loop, which cancels its task.
/// - MESSAGE and DELIVERY_ACK: to the connection's ``ReliableSession``, whose two loops are the
///   only tasks that live as long as a connection, and only with reliable delivery.
///
/// An idle connection thus costs its channel and this handler, not a parked task. Everything
/// runs on the channel's event loop; the connection's tasks reach it through
/// ``ConnectionOutbound``, pushes through the ``ConnectionRegistry``.
final class GatewayConnectionHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    /// Requests that may wait for a handler slot before the channel stops reading. The client
    /// was told the limit in WELCOME, so only a client that ignores it gets here; reading on a
    /// little longer lets its CANCELs and PINGs through.
    static let maxWaiting = 16

    /// A deferred flush goes at once when this many frames wait for it: the responses to a long
    /// read leave in chunks, so the client can start on the first while the gateway answers
    /// the rest, and both sides work at once (as Netty's `FlushConsolidationHandler` caps its
    /// consolidation).
    static let maxUnflushedFrames = 64

    private var machine: StateMachine
    private var reader: FrameReader
    private var writer: FrameWriter
    private let services: GatewayServices
    private let id: UInt64
    /// Where the connection's tasks run: its event loop, or the global executor (`nil`).
    private let executor: (any TaskExecutor)?
    /// The batcher of this connection's event loop: pushes it holds go out before anything
    /// else this handler writes.
    private let pushes: PushBatcher?
    private let logger: Logger
    private var context: ChannelHandlerContext?
    private let eventLoop: any EventLoop
    /// The connection's one timer. It keeps running after the channel closed while handlers
    /// under a time limit still run.
    private var timer = DeadlineTimer()
    /// Between a read from the socket and its `channelReadComplete`: a flush waits for the end
    /// of the read, so that the answers given while reading leave in one write.
    private var reading = false
    /// A flush is owed: at the end of the read, or of the loop's current batch of work.
    private var flushPending = false
    /// Frames written since the last flush.
    private var unflushed = 0
    /// Whether the connection is in the registry (and counted by the gateway's activity).
    private var registered = false
    /// What every request of the established connection shares.
    private var scope: ConnectionScope?
    /// Set once the connection counts against the gateway's limits, until it closes.
    private var admitted: (address: String?, authenticated: Bool)?
    private var reliable: ReliableSession?
    private var pump: Task<Void, Never>?

    init(services: GatewayServices, id: UInt64, framing: Framing, eventLoop: any EventLoop, logger: Logger) {
        let configuration = services.configuration
        self.machine = StateMachine(
            configuration: .init(
                handshakeTimeout: TimeAmount(configuration.timeouts.handshake),
                handlerTimeout: TimeAmount(configuration.timeouts.handler),
                idleTimeout: TimeAmount(configuration.timeouts.idle),
                shutdownGracePeriod: TimeAmount(configuration.timeouts.shutdownGracePeriod),
                closeTimeout: TimeAmount(configuration.timeouts.closeTimeout),
                maxRunning: configuration.limits.maxConcurrentRequestsPerConnection,
                maxWaiting: Self.maxWaiting,
                requestsPerSecond: configuration.limits.requestsPerSecondPerConnection,
                messagesPerSecond: configuration.limits.messagesPerSecondPerConnection
            ),
            now: eventLoop.now
        )
        self.reader = FrameReader(framing: framing)
        self.writer = FrameWriter(framing: framing)
        self.services = services
        self.id = id
        self.executor = services.executor(for: eventLoop)
        self.pushes = services.pushBatchers[ObjectIdentifier(eventLoop)]
        self.eventLoop = eventLoop
        self.logger = logger
    }

    /// The connection's state, for tests.
    var state: StateMachine { self.machine }

    private var outbound: ConnectionOutbound? {
        self.context.map { ConnectionOutbound(handler: NIOLoopBound(self, eventLoop: $0.eventLoop)) }
    }

    // MARK: Lifecycle

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.writer = FrameWriter(framing: self.writer.framing, allocator: context.channel.allocator)
        if context.channel.isActive { self.register(context: context) }
        self.armTimer()
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.closed(context: context)
        self.context = nil
    }

    func channelActive(context: ChannelHandlerContext) {
        self.register(context: context)
        context.fireChannelActive()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.closed(context: context)
        self.logger.debug("connection closed")
        context.fireChannelInactive()
    }

    private func register(context: ChannelHandlerContext) {
        guard !self.registered else { return }
        self.registered = true
        self.services.activity.enter()
        let handler = NIOLoopBound(self, eventLoop: context.eventLoop)
        let remoteAddress = context.channel.remoteAddress?.description
        if let goAway = self.services.registry.add(self.id, channel: context.channel, handler: handler, remoteAddress: remoteAddress) {
            self.drain(goAway)
            return
        }
        let address = context.channel.remoteAddress?.ipAddress
        if let refusal = self.services.admission.admit(address, now: context.eventLoop.now) {
            self.services.refusalLog.log(
                self.logger,
                .warning,
                "refusing connections",
                metadata: ["reason": "\(refusal.message)", "remote": "\(address ?? "-")"]
            )
            self.writeAndClose(.error(refusal), context: context)
        } else {
            self.admitted = (address, authenticated: false)
        }
    }

    /// The channel closed: settle the requests (cancelling their handlers), stop reliable
    /// delivery, leave the registry.
    private func closed(context: ChannelHandlerContext) {
        guard let closed = self.machine.closed() else { return }
        if let admitted = self.admitted {
            self.services.admission.left(admitted.address, authenticated: admitted.authenticated)
            self.admitted = nil
        }
        for task in closed.cancel { task.cancel() }
        self.reliable?.finish()
        self.pump?.cancel()
        self.reliable = nil
        self.pump = nil
        guard self.registered else { return }
        self.services.registry.remove(self.id)
        if closed.done { self.services.activity.leave() }
    }

    /// One of the connection's tasks ended after the channel closed, and it was the last.
    private func taskEnded(done: Bool) {
        if done, self.registered { self.services.activity.leave() }
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let error = error as? ProtocolError {
            self.violation(error, context: context)
        } else {
            self.logger.debug("connection error", metadata: ["error": "\(error)"])
            self.closeNow(context: context)
        }
    }

    // MARK: Inbound

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
        self.armTimer()  // for the deadlines of the requests just read
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.reading = false
        self.reader.readComplete()
        if self.flushPending { self.flushNow(context: context) }
        context.fireChannelReadComplete()
    }

    private func receive(_ frame: Frame, context: ChannelHandlerContext) {
        switch self.machine.received(frame, now: context.eventLoop.now) {
        case .none:
            break
        case .startHandshake(let hello):
            self.startHandshake(hello, context: context)
        case .request(let request):
            self.dispatch(request, context: context)
        case .cancel(let task):
            task?.cancel()
        case .message(let message):
            self.reliable?.receive(message)
        case .deliveryAck(let ack):
            self.reliable?.acknowledged(upTo: ack.sequence)
        case .send(let payload):
            self.write(payload, context: context)
            self.scheduleFlush(context: context)
        case .rateLimited(let refusal):
            self.services.refusalLog.log(
                self.logger,
                .warning,
                "a connection is over its rate of requests or messages",
                metadata: ["client": "\(self.scope?.connection.clientID ?? "-")"]
            )
            if let refusal {
                self.write(refusal, context: context)
                self.scheduleFlush(context: context)
            }
        case .close(let report):
            self.logger.info("client reported an error", metadata: ["code": "\(report.code)", "message": "\(report.message)"])
            self.closeNow(context: context)
        case .sendErrorAndClose(let error):
            self.logger.info("client broke the protocol", metadata: ["error": "\(error)"])
            self.writeAndClose(.error(.init(code: error.code, message: error.message)), context: context)
        }
    }

    private func violation(_ error: ProtocolError, context: ChannelHandlerContext) {
        guard case .sendErrorAndClose(let error) = self.machine.violation(error) else { return }
        self.logger.info("client sent an invalid frame", metadata: ["error": "\(error)"])
        self.writeAndClose(.error(.init(code: error.code, message: error.message)), context: context)
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        if self.machine.writabilityChanged(context.channel.isWritable) { context.read() }
        context.fireChannelWritabilityChanged()
    }

    func read(context: ChannelHandlerContext) {
        if self.machine.readRequested() { context.read() }
    }

    // MARK: The handshake

    private func startHandshake(_ hello: Frame.Hello, context: ChannelHandlerContext) {
        guard let outbound = self.outbound else { return }
        let services = self.services
        let id = self.id
        let logger = self.logger
        let remoteAddress = context.channel.remoteAddress?.description
        let clientCertificate = Self.clientCertificate(of: context.channel)
        self.machine.taskStarted()
        self.spawn {
            let outcome = await services.handshake(
                hello,
                connectionID: id,
                remoteAddress: remoteAddress,
                clientCertificate: clientCertificate,
                logger: logger
            )
            outbound.execute { $0.handshakeFinished(outcome) }
        }
    }

    /// The certificate the client presented in its TLS handshake, if the connection is TLS.
    private static func clientCertificate(of channel: any Channel) -> Certificate? {
        guard let tls = try? channel.pipeline.syncOperations.handler(type: NIOSSLServerHandler.self),
            let certificate = tls.peerCertificate,
            let der = try? certificate.toDERBytes()
        else { return nil }
        return try? Certificate(derEncoded: der)
    }

    private func handshakeFinished(_ outcome: HandshakeOutcome) {
        defer { self.taskEnded(done: self.machine.taskEnded()) }
        guard let context else { return }
        switch outcome {
        case .accepted(let session):
            self.established(session, context: context)
        case .refused(let payload):
            self.writeAndClose(payload, context: context)
        case .gone:
            break
        }
    }

    /// The handshake succeeded: start reliable delivery if negotiated, then send WELCOME.
    private func established(_ session: EstablishedSession, context: ChannelHandlerContext) {
        self.pushes?.drain()
        // The WELCOME carries a checksum, whatever was negotiated.
        let flags = self.machine.outboundFlags
        // nil: the connection closed meanwhile.
        let credentialsDeadline = self.credentialsDeadline(of: session.info.identity)
        guard let held = self.machine.welcome(session.negotiated, credentialsDeadline: credentialsDeadline) else { return }
        if self.admitted != nil, self.admitted?.authenticated == false {
            self.admitted?.authenticated = true
            self.services.admission.authenticated()
        }
        self.write(.welcome(session.welcome), flags: flags, context: context)
        self.reader.maxBodySize = self.services.configuration.limits.maxBodySize
        self.scope = self.scope(of: session.info)
        for push in held { self.write(.push(push), context: context) }
        self.flushNow(context: context)
        self.armTimer()
        if let resume = session.resume, let outbox = session.outbox, let store = self.services.messageStore,
            let outbound = self.outbound
        {
            let reliable = ReliableSession(
                services: self.services,
                store: store,
                connection: session.info,
                outbox: outbox,
                answers: session.negotiated.features.contains(.messageAnswers),
                outbound: outbound,
                executor: self.executor,
                logger: self.logger
            )
            self.reliable = reliable
            // The processor is never cancelled: a batch whose handlers ran must still be
            // committed, or a retransmission would run them again. It ends after `finish()`,
            // once its current batch is done. The pump is cancelled when the connection closes.
            self.machine.taskStarted()
            self.spawn {
                await reliable.runProcessor()
                outbound.execute { $0.taskEnded(done: $0.machine.taskEnded()) }
            }
            self.machine.taskStarted()
            self.pump = self.spawn {
                await reliable.runPump(from: resume)
                outbound.execute { $0.taskEnded(done: $0.machine.taskEnded()) }
            }
        }
        self.logger.debug(
            "client connected",
            metadata: ["client": "\(session.info.clientID)", "remote": "\(session.info.remoteAddress ?? "-")"]
        )
    }

    // MARK: Requests

    /// Runs a request's handler: an inline one (or the `unknown method` answer) at once, a
    /// task's once a slot is free.
    private func dispatch(_ request: Frame.Request, context: ChannelHandlerContext) {
        guard let scope = self.scope else { return }  // requests come only once established
        if request.method == Self.refreshCredentialsMethod {
            // Runs the authenticator in a task, in a handler slot like any request.
            if case .start = self.machine.handlerNeeded(request) {
                self.startHandler(request, scope: scope)
            }
            return
        }
        if scope.checksAccess, !self.services.router.permits(.request(method: request.method), scope.connection) {
            let refusal = Frame.Response(id: request.id, status: .permissionDenied, message: "not allowed to call '\(request.method)'")
            self.respond(refusal, context: context)
            return
        }
        switch self.services.router.route(request.method) {
        case .task:
            if case .start = self.machine.handlerNeeded(request) {
                self.startHandler(request, scope: scope)
            }
        case .inline(let handler):
            self.respond(self.services.answerInline(request, handler: handler, scope: scope), context: context)
        case nil:
            self.respond(self.services.answerInline(request, handler: nil, scope: scope), context: context)
        }
    }

    /// Starts a request's handler in a task; its slot is taken. The request is one that
    /// ``dispatch(_:context:)`` gave a slot to, now or after it waited for one: `$auth`, or a
    /// method with a task handler.
    private func startHandler(_ request: Frame.Request, scope: ConnectionScope) {
        let handler: Gateway.Handler
        if request.method == Self.refreshCredentialsMethod {
            handler = self.refreshCredentials
        } else if case .task(let routed) = self.services.router.route(request.method) {
            handler = routed
        } else {
            // The routes are fixed while the gateway runs, so this does not happen; if it did,
            // the slot must still be given back, or the connection would never be done.
            self.handlerFinished(self.services.answerInline(request, handler: nil, scope: scope))
            return
        }
        guard let outbound = self.outbound else {
            self.handlerFinished(nil)  // the handler is gone from the pipeline: give the slot back
            return
        }
        let services = self.services
        let id = request.id
        // On the connection's loop, the handler starts at once, as an inline one would; its
        // task is queued only if it suspends.
        let task = self.spawn(immediately: self.executor != nil) {
            let response = await services.run(request, handler: handler, scope: scope)
            outbound.execute { $0.handlerFinished(response) }
        }
        if self.machine.handlerStarted(id, task: task) { task.cancel() }
    }

    // MARK: Credentials

    /// The request that replaces the connection's credentials (PROTOCOL.md, section 5.1).
    static let refreshCredentialsMethod = "$auth"

    /// The handler of `$auth`: checks the new token as a HELLO's, for the same client id.
    /// Accepted, it replaces the connection's identity (its expiry, rooms and topics); refused,
    /// the connection keeps the credentials it has until they run out. Without an authenticator
    /// there is nothing to replace: `ok`.
    private var refreshCredentials: Gateway.Handler {
        let services = self.services
        let outbound = self.outbound
        return { request, context in
            guard let authenticator = services.authenticator else { return ByteBuffer() }
            let connection = context.connection
            let info = HandshakeInfo(
                clientID: connection.clientID,
                authToken: request.body,
                userAgent: connection.userAgent,
                remoteAddress: connection.remoteAddress
            )
            switch await GatewayServices.authenticate(info, with: authenticator) {
            case .success(let identity):
                // Ordered before the RESPONSE, which goes through the loop after this returns.
                outbound?.execute { $0.credentialsReplaced(identity) }
                return ByteBuffer()
            case .failure(let refusal):
                context.logger.info("credentials refresh refused", metadata: ["error": "\(refusal)"])
                throw RequestError(refusal.status, refusal.message)
            }
        }
    }

    private func credentialsReplaced(_ identity: ClientIdentity) {
        guard let scope = self.scope else { return }
        var connection = scope.connection
        connection.identity = identity
        self.scope = self.scope(of: connection)
        self.services.registry.replaceIdentity(of: connection.id, with: identity)
        self.machine.credentialsReplaced(deadline: self.credentialsDeadline(of: identity))
        self.armTimer()
    }

    /// What the requests of `connection` share, with whether its accesses must be checked.
    private func scope(of connection: ConnectionInfo) -> ConnectionScope {
        ConnectionScope(
            connection: connection,
            logger: self.logger,
            gateway: self.services.gateway,
            checksAccess: self.services.router.checksAccess(of: connection)
        )
    }

    /// When the connection must end for `identity`'s credentials: their expiry plus the grace
    /// period. The expiry is on the wall clock; the connection's timer runs on the loop's.
    private func credentialsDeadline(of identity: ClientIdentity?) -> NIODeadline? {
        identity?.expiresAt.map { expiresAt in
            let remaining = Duration.seconds(max(0, expiresAt.timeIntervalSinceNow)) + self.services.configuration.timeouts.credentialGrace
            return self.eventLoop.now + TimeAmount(remaining)
        }
    }

    private func handlerFinished(_ response: Frame.Response?) {
        if let response, let context { self.respond(response, context: context) }
        let next = self.machine.handlerEnded()
        if let scope = self.scope {
            for request in next.start { self.startHandler(request, scope: scope) }
        }
        if next.resumeReading { self.context?.read() }
        self.taskEnded(done: next.done)
    }

    /// Sends a RESPONSE unless its request was already answered or cancelled. A reply larger
    /// than the client accepts is replaced by `resource exhausted`: sending it would make the
    /// client close the connection.
    private func respond(_ response: Frame.Response, context: ChannelHandlerContext) {
        self.pushes?.drain()
        guard self.machine.responseReady(response.id) else { return }
        let size = response.bodySize
        if let limit = self.machine.peerMaxBodySize, size > limit {
            self.logger.warning("a reply is larger than the client accepts", metadata: ["bytes": "\(size)", "limit": "\(limit)"])
            self.write(
                .response(
                    Frame.Response(
                        id: response.id,
                        status: .resourceExhausted,
                        message: "the reply is \(size) bytes; this client accepts at most \(limit)"
                    )
                ),
                context: context
            )
        } else if !self.write(.response(response), context: context) {
            self.write(
                .response(Frame.Response(id: response.id, status: .internalError, message: "the response could not be encoded")),
                context: context
            )
        }
        self.scheduleFlush(context: context)
    }

    // MARK: Writing, from the connection's tasks

    /// Writes a frame from one of the connection's tasks (a MESSAGE_ACK).
    func send(_ payload: Frame.Payload) {
        guard let context else { return }
        self.pushes?.drain()
        self.write(payload, context: context)
        self.scheduleFlush(context: context)
    }

    /// Writes frames in order, with one flush, and completes `promise` once the last was written.
    func send(contentsOf payloads: [Frame.Payload], promise: EventLoopPromise<Void>) {
        guard let context, !self.machine.closing else {
            promise.fail(ChannelError.ioOnClosedChannel)
            return
        }
        self.pushes?.drain()
        for payload in payloads { self.write(payload, context: context) }
        self.flushNow(context: context, promise: promise)
    }

    /// Holds a task to the handler time limit (see ``ConnectionOutbound/withTimeLimit(executor:_:)``).
    func startTimeLimit(_ cancel: @escaping @Sendable () -> Void) -> UInt64 {
        let token = self.machine.startTimeLimit(cancel, now: self.eventLoop.now)
        self.armTimer()
        return token
    }

    /// - Returns: Whether the task ran past its limit.
    func endTimeLimit(_ token: UInt64) -> Bool {
        self.machine.endTimeLimit(token)
    }

    // MARK: Pushes encoded once

    /// Sends pushes that were encoded once for many connections, and marks the connection for
    /// a flush without scheduling one.
    ///
    /// Call it on the event loop. It applies the checks of any push (size limit, slow consumer)
    /// and holds the pushes until the WELCOME if the handshake is not complete.
    /// - Returns: Whether the caller must call ``flushIfPending()`` at the end of its batch;
    ///   `false` if nothing was written, or a flush is already owed.
    func deliver(_ push: EncodedPush) -> Bool {
        guard let context, !self.machine.closing else { return false }
        if self.writer.framing == .byteStream, let limit = self.machine.peerMaxBodySize, push.largestBody <= limit {
            guard self.keepsUp(context: context) else { return false }
            if let joined = self.writer.take() { context.write(Self.wrapOutboundOut(joined), promise: nil) }
            let bytes = self.machine.outboundFlags.contains(.checksum) ? push.checksummed : push.plain
            context.write(Self.wrapOutboundOut(bytes), promise: nil)
            self.unflushed += 1
        } else {
            // Before the WELCOME, with a push over this client's limit, or one frame per
            // message: each push on its own.
            var wrote = false
            for frame in push.pushes where self.admit(frame, context: context) {
                self.write(.push(frame), context: context)
                wrote = true
            }
            guard wrote else { return false }
        }
        guard !self.flushPending else { return false }
        self.flushPending = true
        return true
    }

    /// Flushes what ``deliver(_:)`` wrote, unless something flushed it meanwhile.
    func flushIfPending() {
        guard self.flushPending, let context = self.context else { return }
        self.flushNow(context: context)
    }

    /// Whether a push may go out now (before the WELCOME it is held, and sent right after it).
    private func admit(_ push: Frame.Push, context: ChannelHandlerContext) -> Bool {
        switch self.machine.admitPush(push) {
        case .write:
            return self.keepsUp(context: context)
        case .held, .closing:
            return false
        case .tooLarge(let limit):
            self.logger.warning(
                "dropping a push larger than the client accepts",
                metadata: ["topic": "\(push.topic)", "bytes": "\(push.bodySize)", "limit": "\(limit)"]
            )
            return false
        }
    }

    /// Whether the client reads what it is sent; if not (its outbound buffer is over the
    /// limit), closes the connection.
    private func keepsUp(context: ChannelHandlerContext) -> Bool {
        // Reading the buffered byte count costs more than the push; a channel is writable
        // until its buffer passes the (lower) high-water mark, so look only when it is not.
        let limit = self.services.configuration.limits.maxBufferedOutboundBytes
        if !self.machine.writable, let buffered = try? context.channel.syncOptions?.getOption(.bufferedWritableBytes), buffered > limit {
            self.logger.warning(
                "closing a connection whose client does not read its pushes (slow consumer)",
                metadata: ["buffered": "\(buffered)", "limit": "\(limit)"]
            )
            // Behind what is buffered; should the client catch up, it learns why.
            let report = Frame.ErrorReport(
                code: .resourceExhausted,
                message: "slow consumer: \(buffered) bytes waited for the client to read them, over the limit of \(limit)"
            )
            self.writeAndClose(.error(report), context: context)
            return false
        }
        return true
    }

    // MARK: Time

    /// Makes the timer fire at the machine's next deadline, if that is earlier than it fires now.
    private func armTimer() {
        let next = self.machine.nextDeadline
        guard self.timer.needsArming(at: next) else { return }
        self.timer.arm(at: next, on: self.eventLoop) { [self] in
            self.timer.fired()
            self.timerFired()
        }
    }

    private func timerFired() {
        let due = self.machine.timerFired(now: self.eventLoop.now)
        for cancel in due.cancel { cancel() }
        defer { self.armTimer() }
        guard let context = self.context else { return }  // closed: only time limits were due
        if !due.responses.isEmpty {
            self.pushes?.drain()
            for response in due.responses { self.write(.response(response), context: context) }
            self.flushNow(context: context)
        }
        if let payload = due.sendAndClose {
            if case .goAway(let goAway) = payload {
                self.logger.info("closing an idle connection", metadata: ["reason": "\(goAway.message)"])
            }
            self.writeAndClose(payload, context: context)
        } else if due.close {
            if due.lastFrameStuck {
                self.logger.info("the client does not read its last frame; closing the connection")
            } else {
                self.logger.info("grace period over; closing the connection", metadata: ["requests": "\(self.machine.requestsInFlight)"])
            }
            self.closeNow(context: context)
        }
        if let goAway = due.drain {
            self.logger.info("the client's credentials expired; draining the connection")
            self.drain(goAway)
        }
    }

    // MARK: Draining

    /// Sends GOAWAY, refuses new requests, and closes once the client has its answers (or the
    /// grace period ends). Called on the event loop, by the gateway or the registry.
    func drain(_ goAway: Frame.GoAway) {
        guard let context else { return }
        self.pushes?.drain()
        switch self.machine.drain(now: context.eventLoop.now) {
        case .sendGoAway:
            self.write(.goAway(goAway), context: context)
            self.flushNow(context: context)
            self.armTimer()
        case .sendGoAwayAndClose:
            self.writeAndClose(.goAway(goAway), context: context)
        case .none:
            break
        }
    }

    // MARK: Writing

    /// Writes a frame with the negotiated flags (or `flags`), without flushing.
    /// - Returns: `false` if it cannot be encoded (a field over its size limit); nothing is written.
    @discardableResult
    private func write(_ payload: Frame.Payload, flags: FrameFlags? = nil, context: ChannelHandlerContext) -> Bool {
        do {
            if let bytes = try self.writer.append(Frame(payload, flags: flags ?? self.machine.outboundFlags)) {
                context.write(Self.wrapOutboundOut(bytes), promise: nil)
            }
            self.unflushed += 1
            return true
        } catch {
            self.logger.error("cannot encode a frame", metadata: ["type": "\(payload.type)", "error": "\(error)"])
            return false
        }
    }

    private func scheduleFlush(context: ChannelHandlerContext) {
        // The writes of the application's tasks go out with the end of the current read, or
        // else once the tasks already queued on the loop (the other handlers of the batch) ran.
        // With no request left in flight, no other handler's answer can join this write: the
        // flush goes now, saving a pass of the loop. It goes now too once
        // `maxUnflushedFrames` wait for it.
        if self.unflushed >= Self.maxUnflushedFrames || (!self.reading && self.machine.requestsInFlight == 0) {
            self.flushNow(context: context)
            return
        }
        guard !self.flushPending else { return }
        self.flushPending = true
        if self.reading { return }
        context.eventLoop.assumeIsolated().execute {
            guard self.flushPending, let context = self.context else { return }  // flushed meanwhile
            self.flushNow(context: context)
        }
    }

    /// Flushes what was written; a flush that was pending is no longer owed.
    private func flushNow(context: ChannelHandlerContext, promise: EventLoopPromise<Void>? = nil) {
        self.flushPending = false
        self.unflushed = 0
        if let bytes = self.writer.take() {
            context.write(Self.wrapOutboundOut(bytes), promise: promise)
        } else {
            promise?.succeed()
        }
        context.flush()
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        // What was written (or pushed) before the close goes out first.
        self.pushes?.drain()
        if self.flushPending || self.unflushed > 0 { self.flushNow(context: context) }
        context.close(mode: mode, promise: promise)
    }

    /// Writes a frame, flushes, and closes the channel once that write completed.
    private func writeAndClose(_ payload: Frame.Payload, context: ChannelHandlerContext) {
        guard self.machine.startClosing(writingLastFrameAt: context.eventLoop.now) else { return }
        self.armTimer()  // a client that does not read would hold the connection open
        self.pushes?.drain()
        self.write(payload, context: context)
        let written = context.eventLoop.makePromise(of: Void.self)
        self.flushNow(context: context, promise: written)
        written.futureResult.assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }

    private func closeNow(context: ChannelHandlerContext) {
        _ = self.machine.startClosing()
        self.close(context: context, mode: .all, promise: nil)
    }

    // MARK: Tasks

    /// Starts one of the connection's tasks on its executor.
    /// - Parameter immediately: Run it on this thread until it first suspends (`Task.immediate`);
    ///   only when the executor is this loop's.
    @discardableResult
    private func spawn(immediately: Bool = false, _ body: @escaping @Sendable () async -> Void) -> Task<Void, Never> {
        #if compiler(>=6.2)
            if immediately, #available(macOS 26.0, iOS 26.0, tvOS 26.0, watchOS 26.0, *) {
                return Task.immediate(executorPreference: self.executor) { await body() }
            }
        #endif
        return Task(executorPreference: self.executor) { await body() }
    }
}

@available(*, unavailable)
extension GatewayConnectionHandler: Sendable {}
