import Logging
import NIOCore
import TetherCore
import TetherNIO

/// Events the gateway sends down a connection's pipeline.
enum GatewayConnectionEvent: Sendable {
    /// Send GOAWAY, refuse new requests, close when those in flight are answered.
    case drain(Frame.GoAway)
}

/// The gateway's protocol handler for one connection.
///
/// It enforces the rules of ``GatewaySessionStateMachine`` on the event loop: handshake timeout,
/// frames allowed per state, checksums, PING → PONG, idle reaping, request deadlines, refusing
/// requests while draining, and ERROR-then-close on violations. Only HELLO, REQUEST, MESSAGE and
/// DELIVERY_ACK travel on, to the ``ConnectionDispatcher`` above it.
///
/// Deadlines and cancellation are enforced here, on the event loop, so that a busy application
/// layer cannot delay them: when a request's deadline passes, this handler answers `deadline
/// exceeded` itself; on a deadline or a CANCEL it settles the request in the connection's
/// ``RequestRegistry``, which stops the handler; a late answer is dropped.
///
/// Outbound, it stamps the negotiated flags on every frame, notices the WELCOME (the
/// connection is established) and the RESPONSEs (requests answered), and closes the channel
/// after an ERROR, or after the last response of a draining connection.
final class GatewayConnectionHandler: ChannelDuplexHandler, RemovableChannelHandler, FrameReceiver {
    typealias InboundIn = Frame
    typealias InboundOut = Frame
    typealias OutboundIn = Frame
    typealias OutboundOut = Frame

    struct Configuration: Sendable {
        var handshakeTimeout: TimeAmount
        /// The longest a handler may take, whatever the client's timeout.
        var handlerTimeout: TimeAmount
        var idleTimeout: TimeAmount
        var shutdownGracePeriod: TimeAmount
        var maxInboundBodySize: Int
        var maxBufferedOutboundBytes: Int
    }

    private let configuration: Configuration
    private let logger: Logger
    private let requests: RequestRegistry
    private var session = GatewaySessionStateMachine()
    private var hello: Frame.Hello?
    private var negotiated: Handshake.Negotiated?
    /// Frames the application wrote before the WELCOME went out; sent right after it.
    private var heldUntilWelcome: [(Frame.Payload, EventLoopPromise<Void>?)] = []
    private var lastInbound = NIODeadline.uptimeNanoseconds(0)
    private var handshakeTimer: Scheduled<Void>?
    private var idleTimer: Scheduled<Void>?
    private var graceTimer: Scheduled<Void>?
    /// The deadlines of the requests in flight, served by one timer (`deadlineTimer`).
    private var deadlines = DeadlineQueue<UInt64, NIODeadline>()
    private var methods: [UInt64: String] = [:]
    private var deadlineTimer = DeadlineTimer()
    /// A flush from the application is deferred to the end of the loop's current batch of
    /// work, so that the responses to a batch of requests leave in one write.
    private var flushPending = false
    /// Frames written since the last flush.
    private var unflushed = 0
    /// A deferred flush goes at once when this many frames wait for it: the responses to a long
    /// read leave in chunks, so the client can start on the first while the gateway answers
    /// the rest, and both sides work at once (as Netty's `FlushConsolidationHandler` caps its
    /// consolidation).
    static let maxUnflushedFrames = 64
    /// Between a read from the socket and its `channelReadComplete`: a flush waits for the end
    /// of the read, so that the answers given while reading (inline handlers, refusals, PONGs)
    /// leave in one write.
    private var reading = false
    private var closing = false
    /// Set while the handler is in a pipeline, for pushes that arrive outside a pipeline event.
    private var context: ChannelHandlerContext?
    /// Tether's encoder right below this handler, if the channel uses it (the gateway's TCP
    /// listener does): frames are handed to it directly rather than wrapped in `NIOAny`, and
    /// pushes encoded once for many connections as bytes.
    private var encoder: FrameEncodingHandler?
    /// Tether's decoder right below this handler, if the channel uses it: it calls
    /// ``receive(_:context:)`` directly rather than passing frames wrapped in `NIOAny`.
    private var decoder: FrameDecodingHandler?
    /// Where forwarded frames go: the ``ConnectionDispatcher`` right above, or up the pipeline.
    private var link = FrameReceiverLink()
    /// The channel's writability, as its events tell it: asking the channel costs a pointer
    /// chase per connection, which a push to a large room pays thousands of times.
    private var writable = true
    /// The batcher of this connection's event loop: pushes it holds go out before anything
    /// else this handler writes.
    private let pushes: PushBatcher?

    init(configuration: Configuration, requests: RequestRegistry, pushes: PushBatcher? = nil, logger: Logger) {
        self.configuration = configuration
        self.requests = requests
        self.pushes = pushes
        self.logger = logger
    }

    // MARK: Lifecycle

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        self.encoder = try? context.pipeline.syncOperations.handler(type: FrameEncodingHandler.self)
        self.decoder = try? context.pipeline.syncOperations.handler(type: FrameDecodingHandler.self)
        self.decoder?.connect(self, context: context)
        self.lastInbound = context.eventLoop.now
        self.handshakeTimer = context.eventLoop.assumeIsolated().scheduleTask(in: self.configuration.handshakeTimeout) {
            self.handshakeTimedOut(context: context)
        }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        self.encoder = nil
        self.decoder?.disconnect(self)
        self.decoder = nil
        self.link.disconnect()
        self.cancelTimers()
    }

    /// Hands the frames this handler forwards to `receiver` by a direct call from now on. Call
    /// it from the `handlerAdded` of the handler right above this one.
    func connect(_ receiver: any FrameReceiver, context: ChannelHandlerContext) {
        self.link.connect(receiver, context: context)
    }

    /// Forwards frames up the pipeline again, if `receiver` is the one connected.
    func disconnect(_ receiver: any FrameReceiver) {
        self.link.disconnect(receiver)
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.cancelTimers()
        self.session.closed()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if let error = error as? ProtocolError {
            self.logger.info("client sent an invalid frame", metadata: ["error": "\(error)"])
            self.sendErrorAndClose(error, context: context)
        } else {
            self.logger.debug("connection error", metadata: ["error": "\(error)"])
            self.closeNow(context: context)
        }
    }

    // MARK: Inbound

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        self.receive(Self.unwrapInboundIn(data), context: context)
    }

    func receive(_ frame: Frame, context: ChannelHandlerContext) {
        self.reading = true
        self.lastInbound = context.eventLoop.now
        switch self.session.received(frame) {
        case .forwardHello(let hello):
            self.hello = hello
            self.forward(frame, from: context)
        case .forwardRequest(var request):
            // The effective deadline is computed here, once, and passed up in the request.
            let timeout =
                request.timeout.map { min(TimeAmount($0), self.configuration.handlerTimeout) } ?? self.configuration.handlerTimeout
            request.timeout = Duration(timeout)
            let id = request.id
            let method = request.method
            self.requests.add(id)
            self.forward(Frame(.request(request), stream: frame.stream, flags: frame.flags), from: context)
            // An inline handler has answered by now: only a request still in flight needs its
            // deadline watched. Its answer cannot overtake this: it comes through the event loop.
            if self.session.isInFlight(id) {
                self.methods[id] = method
                self.deadlines.insert(id, deadline: context.eventLoop.now + timeout)
                self.armDeadlineTimer(context: context)
            }
        case .cancelRequest(let cancel):
            self.forgetDeadline(cancel.requestID)
            self.requests.settle(cancel.requestID)
        case .forwardMessage, .forwardDeliveryAck:
            self.forward(frame, from: context)
        case .refuseRequest(let refusal):
            self.write(.response(refusal), context: context, promise: nil)
            self.flush(context: context)
        case .replyPong(let ping):
            self.write(.pong(ping), context: context, promise: nil)
            self.flush(context: context)
        case .peerError(let report):
            self.logger.info("client reported an error", metadata: ["code": "\(report.code)", "message": "\(report.message)"])
            self.closeNow(context: context)
        case .violation(let error):
            self.logger.info("client broke the protocol", metadata: ["error": "\(error)"])
            self.sendErrorAndClose(error, context: context)
        case .ignore:
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        self.reading = false
        if self.flushPending { self.flushNow(context: context) }
        context.fireChannelReadComplete()
    }

    /// Passes a frame on to the dispatcher.
    private func forward(_ frame: Frame, from context: ChannelHandlerContext) {
        // A copy: the receiver may disconnect (be removed) while it handles the frame.
        let link = self.link
        link.forward(frame, from: context)
    }

    // MARK: Outbound

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        self.send(Self.unwrapOutboundIn(data), context: context, promise: promise)
    }

    /// Writes a frame from the gateway's tasks, as `channel.writeAndFlush` would, without the
    /// trip down the pipeline from its tail. Call it on the event loop.
    func writeAndFlush(_ frame: Frame) {
        guard let context = self.context else { return }
        self.send(frame, context: context, promise: nil)
        self.flush(context: context)
    }

    private func send(_ frame: Frame, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        self.pushes?.drain()
        guard !self.closing else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        switch frame.payload {
        case .welcome(let welcome):
            self.write(frame.payload, context: context, promise: promise)
            self.welcomeSent(welcome, context: context)
        case .response(let response):
            self.forgetDeadline(response.id)
            self.sendResponse(response, context: context, promise: promise)
        case .error(let report):
            self.sendErrorAndClose(ProtocolError(code: report.code, message: report.message), context: context, promise: promise)
        case .push(let push):
            guard self.admitPush(push, context: context, promise: promise) else { return }
            self.write(frame.payload, context: context, promise: promise)
        default:
            self.write(frame.payload, context: context, promise: promise)
        }
    }

    // MARK: Pushes encoded once

    /// Sends pushes that were encoded once for many connections, and marks the connection for
    /// a flush without scheduling one.
    ///
    /// Call it on the event loop. It applies the checks of a push written down the pipeline
    /// (size limit, slow consumer) and holds the pushes until the WELCOME if the handshake is
    /// not complete.
    /// - Returns: Whether the caller must call ``flushIfPending()`` at the end of its batch; `false` if
    ///   nothing was written, or a flush is already scheduled.
    func deliver(_ push: EncodedPush) -> Bool {
        guard let context = self.context, !self.closing else { return false }
        if let encoder = self.encoder, let limit = self.negotiated?.peerMaxBodySize, push.largestBody <= limit {
            guard self.keepsUp(context: context, promise: nil) else { return false }
            encoder.writeEncoded(self.session.outboundFlags.contains(.checksum) ? push.checksummed : push.plain, promise: nil)
        } else {
            // Before the WELCOME, with a push over this client's limit, or without Tether's
            // encoder below: each push on its own, down the pipeline.
            var wrote = false
            for frame in push.pushes where self.admitPush(frame, context: context, promise: nil) {
                self.write(.push(frame), context: context, promise: nil)
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

    /// Whether a push may go out now: after the WELCOME (before it, the push is held and sent
    /// right after it), within the client's body size limit, and to a client that reads (a slow
    /// consumer's connection is closed).
    private func admitPush(_ push: Frame.Push, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) -> Bool {
        guard let limit = self.negotiated?.peerMaxBodySize else {
            self.heldUntilWelcome.append((.push(push), promise))
            return false
        }
        let size = push.bodySize
        guard size <= limit else {
            self.logger.warning(
                "dropping a push larger than the client accepts",
                metadata: ["topic": "\(push.topic)", "bytes": "\(size)", "limit": "\(limit)"]
            )
            promise?.fail(PushTooLargeError(size: size, limit: limit))
            return false
        }
        return self.keepsUp(context: context, promise: promise)
    }

    /// Whether the client reads what it is sent; if not (its outbound buffer is over the
    /// limit), closes the connection and fails `promise`.
    private func keepsUp(context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) -> Bool {
        // Reading the buffered byte count costs more than the push; a channel is writable
        // until its buffer passes the (lower) high-water mark, so look only when it is not.
        if !self.writable,
            let buffered = try? context.channel.syncOptions?.getOption(.bufferedWritableBytes),
            buffered > self.configuration.maxBufferedOutboundBytes
        {
            self.logger.warning(
                "closing a connection whose client does not read its pushes (slow consumer)",
                metadata: ["buffered": "\(buffered)", "limit": "\(self.configuration.maxBufferedOutboundBytes)"]
            )
            promise?.fail(SlowConsumerError(buffered: buffered))
            self.closeNow(context: context)
            return false
        }
        return true
    }

    func channelWritabilityChanged(context: ChannelHandlerContext) {
        self.writable = context.channel.isWritable
        context.fireChannelWritabilityChanged()
    }

    // MARK: Flushing

    func flush(context: ChannelHandlerContext) {
        // Flushes come from the application layer; its writes go straight down, but the flush
        // waits for the end of the current read, or else for the tasks already queued on the
        // loop (the other handlers of the batch). With no request left in flight, no other
        // handler's answer can join this write: the flush goes now, saving the caller a pass of
        // the loop. It goes now too once `maxUnflushedFrames` wait for it.
        if self.unflushed >= Self.maxUnflushedFrames || (!self.reading && self.session.requestsInFlight == 0) {
            self.flushNow(context: context)
            return
        }
        guard !self.flushPending else { return }
        self.flushPending = true
        if self.reading { return }
        context.eventLoop.assumeIsolated().execute {
            guard self.flushPending else { return }  // flushed meanwhile
            self.flushNow(context: context)
        }
    }

    /// Flushes what was written; a flush that was pending is no longer owed.
    private func flushNow(context: ChannelHandlerContext) {
        self.flushPending = false
        self.unflushed = 0
        context.flush()
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        // What was written (or pushed) before the close goes out first.
        self.pushes?.drain()
        if self.flushPending { self.flushNow(context: context) }
        context.close(mode: mode, promise: promise)
    }

    func triggerUserOutboundEvent(context: ChannelHandlerContext, event: Any, promise: EventLoopPromise<Void>?) {
        guard case .drain(let goAway) = event as? GatewayConnectionEvent else {
            context.triggerUserOutboundEvent(event, promise: promise)
            return
        }
        promise?.succeed()
        self.pushes?.drain()
        self.drain(goAway, context: context)
    }

    // MARK: Internals

    private func write(_ payload: Frame.Payload, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        self.unflushed += 1
        context.write(Frame(payload, flags: self.session.outboundFlags), through: self.encoder, promise: promise)
    }

    /// Sends a RESPONSE unless its request was already answered or cancelled. A reply larger than
    /// the client accepts is replaced by `resource exhausted`: sending it would make the client
    /// close the connection.
    private func sendResponse(_ response: Frame.Response, context: ChannelHandlerContext, promise: EventLoopPromise<Void>?) {
        switch self.session.responseSent(id: response.id) {
        case .send:
            self.requests.settle(response.id)
            let size = response.bodySize
            if let limit = self.negotiated?.peerMaxBodySize, size > limit {
                self.logger.warning("a reply is larger than the client accepts", metadata: ["bytes": "\(size)", "limit": "\(limit)"])
                let refusal = Frame.Response(
                    id: response.id,
                    status: .resourceExhausted,
                    message: "the reply is \(size) bytes; this client accepts at most \(limit)"
                )
                self.write(.response(refusal), context: context, promise: promise)
                return
            }
            self.write(.response(response), context: context, promise: promise)
        case .drop:
            promise?.succeed()
        }
    }

    private func forgetDeadline(_ id: UInt64) {
        guard !self.deadlines.isEmpty else { return }  // the common case with inline handlers
        self.deadlines.remove(id)
        self.methods[id] = nil
    }

    /// Makes the deadline timer fire at the earliest deadline.
    private func armDeadlineTimer(context: ChannelHandlerContext) {
        guard self.deadlineTimer.needsArming(at: self.deadlines.earliest) else { return }
        self.deadlineTimer.arm(at: self.deadlines.earliest, on: context.eventLoop) {
            self.deadlineTimer.fired()
            self.deadlinesPassed(context: context)
        }
    }

    private func deadlinesPassed(context: ChannelHandlerContext) {
        var answered = false
        for id in self.deadlines.popExpired(at: context.eventLoop.now) {
            let method = self.methods.removeValue(forKey: id) ?? ""
            guard self.session.isInFlight(id) else { continue }
            self.sendResponse(
                Frame.Response(id: id, status: .deadlineExceeded, message: "'\(method)' did not finish in time"),
                context: context,
                promise: nil
            )
            answered = true
        }
        if answered { self.flushNow(context: context) }
        self.armDeadlineTimer(context: context)
    }

    private func welcomeSent(_ welcome: Frame.Welcome, context: ChannelHandlerContext) {
        guard let hello = self.hello else {
            self.sendErrorAndClose(
                ProtocolError(code: .protocolError, message: "the gateway sent WELCOME without a HELLO"),
                context: context
            )
            return
        }
        let negotiated = Handshake.gatewayParameters(welcome: welcome, hello: hello)
        self.session.welcomeSent(negotiated)
        self.negotiated = negotiated
        let held = self.heldUntilWelcome
        self.heldUntilWelcome.removeAll()
        for (payload, promise) in held {
            self.send(Frame(payload), context: context, promise: promise)
        }
        self.handshakeTimer?.cancel()
        self.handshakeTimer = nil
        context.triggerUserOutboundEvent(
            TetherChannelEvent.limitsNegotiated(maxInboundBodySize: self.configuration.maxInboundBodySize),
            promise: nil
        )
        self.scheduleIdleCheck(context: context)
    }

    private func drain(_ goAway: Frame.GoAway, context: ChannelHandlerContext) {
        switch self.session.drain() {
        case .sendGoAway:
            // The client closes once its requests are answered; the grace period bounds the wait.
            self.write(.goAway(goAway), context: context, promise: nil)
            self.flushNow(context: context)
            self.graceTimer = context.eventLoop.assumeIsolated().scheduleTask(in: self.configuration.shutdownGracePeriod) {
                self.logger.info(
                    "grace period over; closing the connection",
                    metadata: ["requests": "\(self.session.requestsInFlight)"]
                )
                self.closeNow(context: context)
            }
        case .sendGoAwayAndClose:
            self.writeAndClose(.goAway(goAway), context: context)
        case .none:
            break
        }
    }

    private func handshakeTimedOut(context: ChannelHandlerContext) {
        switch self.session.phase {
        case .awaitingHello, .negotiating:
            self.sendErrorAndClose(
                ProtocolError(
                    code: .handshakeTimeout,
                    message: "no completed handshake within \(Duration(self.configuration.handshakeTimeout).shortDescription)"
                ),
                context: context
            )
        case .established, .draining, .closed:
            break
        }
    }

    private func scheduleIdleCheck(context: ChannelHandlerContext) {
        self.idleTimer = context.eventLoop.assumeIsolated().scheduleTask(deadline: self.lastInbound + self.configuration.idleTimeout) {
            let silence = context.eventLoop.now - self.lastInbound
            guard silence >= self.configuration.idleTimeout else {
                self.scheduleIdleCheck(context: context)
                return
            }
            self.logger.info("closing an idle connection", metadata: ["silent": "\(Duration(silence).shortDescription)"])
            self.writeAndClose(
                .goAway(.init(reason: .idleTimeout, message: "nothing received for \(Duration(silence).shortDescription)")),
                context: context
            )
        }
    }

    private func sendErrorAndClose(_ error: ProtocolError, context: ChannelHandlerContext, promise: EventLoopPromise<Void>? = nil) {
        self.session.closed()
        self.writeAndClose(.error(.init(code: error.code, message: error.message)), context: context, promise: promise)
    }

    /// Writes a frame, flushes, and closes the channel once that write completed.
    private func writeAndClose(_ payload: Frame.Payload, context: ChannelHandlerContext, promise: EventLoopPromise<Void>? = nil) {
        guard !self.closing else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        self.closing = true
        let written = context.eventLoop.makePromise(of: Void.self)
        if let promise { written.futureResult.cascade(to: promise) }
        self.write(payload, context: context, promise: written)
        self.flushNow(context: context)
        written.futureResult.assumeIsolated().whenComplete { _ in
            context.close(promise: nil)
        }
    }

    private func closeNow(context: ChannelHandlerContext) {
        self.closing = true
        context.close(promise: nil)
    }

    private func cancelTimers() {
        self.requests.settleAll()
        _ = self.deadlines.removeAll()
        self.methods.removeAll()
        self.deadlineTimer.cancel()
        let held = self.heldUntilWelcome
        self.heldUntilWelcome.removeAll()
        for (_, promise) in held { promise?.fail(ChannelError.ioOnClosedChannel) }
        self.handshakeTimer?.cancel()
        self.idleTimer?.cancel()
        self.graceTimer?.cancel()
    }
}

@available(*, unavailable)
extension GatewayConnectionHandler: Sendable {}

/// A push found the connection's outbound buffer over its limit; the connection was closed.
struct SlowConsumerError: Error, CustomStringConvertible {
    var buffered: Int
    var description: String { "the client does not read: \(self.buffered) bytes are waiting; the connection was closed" }
}

/// A push exceeded the maximum body size its recipient negotiated; it was not sent.
struct PushTooLargeError: Error, CustomStringConvertible {
    var size: Int
    var limit: Int
    var description: String { "the push is \(self.size) bytes; the client accepts at most \(self.limit)" }
}
