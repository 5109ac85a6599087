import Crypto
package import NIOCore
package import NIOHTTP1

/// The gateway's end of the HTTP stream (PROTOCOL.md, section 11.5), one per connection of the
/// HTTP listener, after NIOHTTP1's server handlers.
///
/// - `GET <path>` opens a stream once the gateway admits it (``Hooks/admit``; a refusal is
///   answered with its status, `503` or `429` with `Retry-After`, and a close): `200` with
///   headers that keep proxies from buffering or transforming it, a first chunk holding the
///   session token and a line feed, then Tether frames as the connection's handler writes them,
///   for as long as the connection lives. The connection becomes a Tether connection: the
///   admission's `start` adds the gateway's handler above this one (after the response's head
///   is written, so that whatever it writes goes in the body), which reads the session's POST
///   bodies as one byte stream.
/// - `POST <path>` with `Tether-Session: <token>` carries frames up: the body goes to the
///   stream's connection, and `204` answers once that connection has read it (it asked for more
///   after taking the body), so a gateway that stops reading (its limits pace a client) holds
///   the POST and the client waits. A connection's first POST is admitted like a connection. One POST per
///   session at a time (`409` for a second); `404` for an unknown session, `410` for one that
///   ended, `413` for a body over the limit, `400` without a well-formed token. In a
///   cluster, a POST for a session another node holds is forwarded to that node, whose answer
///   is passed back (`502` if it does not answer).
/// - Requests for other paths go on unchanged, to the handlers after this one.
package final class HTTPStreamServerHandler: ChannelDuplexHandler, RemovableChannelHandler {
    package typealias InboundIn = HTTPServerRequestPart
    package typealias InboundOut = ByteBuffer
    package typealias OutboundIn = ByteBuffer
    package typealias OutboundOut = HTTPServerResponsePart

    /// The stream's settings.
    package struct Settings: Sendable {
        package var path: String
        package var maxPostBodySize: Int
        package var postIdleTimeout: TimeAmount
        /// What a peer may still send while this handler pauses its reads: an HTTP/2 stream's
        /// flow-control window (its bytes wait in the HTTP/2 handler); 0 over HTTP/1.1 (they
        /// wait in the kernel).
        package var bytesInFlightWhilePaused: Int

        package init(path: String, maxPostBodySize: Int, postIdleTimeout: TimeAmount, bytesInFlightWhilePaused: Int = 0) {
            self.path = path
            self.maxPostBodySize = maxPostBodySize
            self.postIdleTimeout = postIdleTimeout
            self.bytesInFlightWhilePaused = bytesInFlightWhilePaused
        }
    }

    private enum Mode {
        /// Between requests.
        case idle
        /// A request for another path: its parts go on.
        case passing
        /// Reading a POST's body.
        case post(Post)
        /// Waiting for the stream to read a POST's body.
        case delivering(keepAlive: Bool, version: HTTPVersion)
        /// Answering a request with an error; the rest of it is ignored.
        case refusing(status: HTTPResponseStatus, message: String, keepAlive: Bool, version: HTTPVersion)
        /// An error was answered and the connection closes: what follows is ignored.
        case closing
        /// This connection carries a stream.
        case stream(Stream)
    }

    private struct Post {
        var token: String
        /// Its `Tether-Proof`.
        var proof: String
        var body: ByteBuffer
        var keepAlive: Bool
        var version: HTTPVersion
        /// Another node forwarded it: it is not forwarded again.
        var forwarded: Bool
    }

    private struct Stream {
        var token: String
        /// The session key: only the stream's reader has it, and POSTs prove they do.
        var key: SymmetricKey
        /// POSTs accepted so far: the number the next one's proof covers.
        var posts: UInt64 = 0
        var ended = false
        /// The handler above asked to read, and has not been given anything since.
        var readRequested = false
        /// A POST's body the handler above has not read yet, and who waits for it.
        var pending: Pending?
    }

    /// A POST's body handed to the stream's connection.
    private struct Pending {
        var body: ByteBuffer
        var promise: EventLoopPromise<HTTPStreamSession.Delivery>
        /// Passed up: it is read once the handler above asks for more.
        var passedUp = false
    }

    /// What a request asks the gateway to admit.
    package enum Purpose: Sendable, Hashable {
        /// A GET that opens a stream: a Tether connection.
        case stream
        /// A connection's first POST: the connection carries POSTs from now on.
        case posts
    }

    /// Whether the gateway takes a request (``Purpose``).
    package enum Admission {
        /// Admitted: `start` runs once the response's head is written (for a stream, it adds
        /// the gateway's connection handler at the end of the pipeline).
        case admitted(start: () throws -> Void)
        /// Refused: the request gets this answer, and the connection closes.
        case refused(HTTPRefusal)
    }

    private let settings: Settings
    private let sessions: HTTPStreamSessions
    private let admit: (any Channel, Purpose) -> Admission
    private let served: () -> Void
    /// The loop's watch over bodies in progress and the memory budget; `nil`: none.
    private let intake: IntakeMonitor?
    /// What this connection's POST bodies hold of the budget.
    private var account: BudgetAccount?
    /// Reads are paused until the budget has room; the pipeline's read waits.
    private var pausedRead = false
    private var mode = Mode.idle
    private var context: ChannelHandlerContext?
    private var idleTimer: Scheduled<Void>?
    private var servedOnce = false
    /// The connection's POSTs were admitted (its first one asked).
    private var postsAdmitted = false

    /// - Parameters:
    ///   - settings: The path and the limits.
    ///   - sessions: The gateway's sessions, shared by its HTTP connections.
    ///   - admit: Asked before a GET opens a stream, and before a connection's first POST is
    ///     read; a refusal is answered with its status and the connection closes.
    ///   - served: Called once, when the connection first serves the stream (a GET that opened
    ///     one, or a POST admitted): it is no longer an unidentified HTTP connection.
    ///   - intake: The loop's monitor: POST bodies count against the gateway's memory budget
    ///     (reads pause while it is exhausted) and must arrive within its body timeout.
    package init(
        settings: Settings,
        sessions: HTTPStreamSessions,
        admit: @escaping (any Channel, Purpose) -> Admission,
        served: @escaping () -> Void,
        intake: IntakeMonitor? = nil
    ) {
        self.settings = settings
        self.sessions = sessions
        self.admit = admit
        self.served = served
        self.intake = intake
    }

    package func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    package func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        self.idleTimer?.cancel()
        self.account?.close()
    }

    /// Tells the budget what the POST being read (or handed to its stream) holds; over HTTP/2,
    /// with what its peer may still send while its body arrives (the stream's window).
    private func hold(_ bytes: Int, inProgress: Bool) {
        guard let account = self.account else { return }
        account.hold(bytes + (inProgress ? self.settings.bytesInFlightWhilePaused : 0), inProgress: inProgress)
        account.publish()
    }

    // MARK: Requests

    package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let part = Self.unwrapInboundIn(data)
        switch (self.mode, part) {
        case (.idle, .head(let head)):
            self.idleTimer?.cancel()
            self.idleTimer = nil
            self.received(head, context: context, data: data)
        case (.passing, .end):
            self.mode = .idle
            context.fireChannelRead(data)
        case (.passing, _):
            context.fireChannelRead(data)
        case (.post(var post), .body(var chunk)):
            guard post.body.readableBytes + chunk.readableBytes <= self.settings.maxPostBodySize else {
                self.respondAndClose(.payloadTooLarge, self.tooLarge, post.version, context)
                return
            }
            self.mode = .idle  // no copy of the body while it grows
            post.body.writeBuffer(&chunk)
            self.hold(post.body.readableBytes, inProgress: true)
            self.mode = .post(post)
        case (.post(let post), .end):
            self.deliver(post, context: context)
        case (.refusing(let status, let message, let keepAlive, let version), .end):
            self.mode = .idle
            self.respond(status, message, keepAlive: keepAlive, version: version, context: context)
        case (.refusing, _), (.delivering, _), (.closing, _):
            break
        case (.stream, _):
            // A stream's client sends nothing more on its GET's connection: its frames go in POSTs.
            break
        case (.idle, _), (.post, .head):
            break
        }
    }

    private func received(_ head: HTTPRequestHead, context: ChannelHandlerContext, data: NIOAny) {
        guard head.pathWithoutQuery == self.settings.path else {
            self.mode = .passing
            context.fireChannelRead(data)
            return
        }
        let token = head.headers.first(name: HTTPStreamBinding.sessionHeader)
        switch head.method {
        case .GET:
            guard let token else {
                self.open(head, context: context)
                return
            }
            let status: HTTPResponseStatus
            switch self.sessions.lookup(token) {
            case .live: status = .conflict
            case .ended: status = .gone
            case .unknown: status = .notFound
            }
            self.refuse(status, "a session has one stream, opened by a GET without \(HTTPStreamBinding.sessionHeader)", head)
        case .POST:
            guard let token, HTTPStreamBinding.isWellFormedToken(token) else {
                self.refuse(.badRequest, "a POST names its stream's session in \(HTTPStreamBinding.sessionHeader)", head)
                return
            }
            guard let proof = head.headers.first(name: HTTPStreamBinding.proofHeader), HTTPStreamBinding.isWellFormedKey(proof) else {
                self.refuse(
                    .badRequest,
                    "a POST proves it comes from the stream's reader in \(HTTPStreamBinding.proofHeader): the HMAC of its body with the session key",
                    head
                )
                return
            }
            let declared = head.headers.first(name: "Content-Length").flatMap(Int.init)
            if let declared, declared > self.settings.maxPostBodySize {
                self.respondAndClose(.payloadTooLarge, self.tooLarge, head.version, context)
                return
            }
            if !self.postsAdmitted {
                switch self.admit(context.channel, .posts) {
                case .refused(let refusal):
                    self.refuseAndClose(refusal, head.version, context)
                    return
                case .admitted(let start):
                    self.postsAdmitted = true
                    do {
                        try start()
                    } catch {
                        context.close(promise: nil)
                        return
                    }
                    self.markServed()
                }
            }
            // A session this gateway knows has ended, or knows nothing of (and cannot forward):
            // answered now, without reading (and holding) the body.
            let forwarded = head.headers.contains(name: HTTPStreamBinding.forwardedHeader)
            switch self.sessions.lookup(token) {
            case .ended:
                self.respondAndClose(.gone, self.endedSession, head.version, context)
                return
            case .unknown where forwarded || self.sessions.forwarder(for: token) == nil:
                self.respondAndClose(.notFound, self.unknownSession, head.version, context)
                return
            case .live, .unknown:
                break
            }
            if self.account == nil, let intake = self.intake { self.account = intake.account(for: self) }
            // Over HTTP/2 the peer may send a window's worth whether this stream reads or not:
            // with the budget exhausted, a new POST is refused rather than paused.
            if self.settings.bytesInFlightWhilePaused > 0, let account = self.account, account.budget.isExhausted {
                self.refuseAndClose(Self.budgetFull, head.version, context)
                return
            }
            self.hold(0, inProgress: true)  // the body timeout runs from the head
            self.mode = .post(
                Post(
                    token: token,
                    proof: proof,
                    // Room for the whole declared body at once: no copies as it grows.
                    body: context.channel.allocator.buffer(capacity: declared ?? 0),
                    keepAlive: head.isKeepAlive,
                    version: head.version,
                    forwarded: forwarded
                )
            )
        default:
            self.refuse(.methodNotAllowed, "\(self.settings.path) takes GET (the stream) and POST (frames for it)", head)
        }
    }

    /// A POST refused because the gateway's memory budget is full.
    private static let budgetFull = HTTPRefusal(
        status: .serviceUnavailable,
        message: "the gateway's memory budget is full; try again later",
        retryAfter: .seconds(5)
    )

    private var tooLarge: String { "a POST body may have at most \(self.settings.maxPostBodySize) bytes" }

    private func refuse(_ status: HTTPResponseStatus, _ message: String, _ head: HTTPRequestHead) {
        self.mode = .refusing(status: status, message: message, keepAlive: head.isKeepAlive, version: head.version)
    }

    // MARK: The stream

    /// Opens a stream on this connection, if the gateway admits it.
    private func open(_ request: HTTPRequestHead, context: ChannelHandlerContext) {
        let start: () throws -> Void
        switch self.admit(context.channel, .stream) {
        case .refused(let refusal):
            self.refuseAndClose(refusal, request.version, context)
            return
        case .admitted(let admitted):
            start = admitted
        }
        let token = self.sessions.makeToken()
        let key = HTTPStreamBinding.makeKey()
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: HTTPStreamBinding.contentType)
        headers.add(name: "Cache-Control", value: "no-store, no-transform")
        headers.add(name: "X-Accel-Buffering", value: "no")
        headers.add(name: HTTPStreamBinding.sessionHeader, value: token)
        if request.version == .http1_0 {
            // No chunked encoding in HTTP/1.0: the body ends when the connection does.
            headers.add(name: "Connection", value: "close")
        }
        // The head and the token line first: what the connection's handler writes as it is
        // added (a refusal's ERROR, a GOAWAY while the gateway drains) goes in the body.
        self.mode = .stream(Stream(token: token, key: HTTPStreamBinding.symmetricKey(key)!))
        context.write(Self.wrapOutboundOut(.head(HTTPResponseHead(version: request.version, status: .ok, headers: headers))), promise: nil)
        let line = HTTPStreamBinding.sessionLine(token: token, key: key) + "\n"
        var first = context.channel.allocator.buffer(capacity: line.utf8.count)
        first.writeString(line)
        context.write(Self.wrapOutboundOut(.body(.byteBuffer(first))), promise: nil)
        do {
            try start()
        } catch {
            context.close(promise: nil)
            return
        }
        self.sessions.register(HTTPStreamSession(token: token, handler: NIOLoopBound(self, eventLoop: context.eventLoop)))
        self.markServed()
        context.flush()
    }

    /// A POST's body for this stream: read it when the handler above asks.
    func deliver(_ body: ByteBuffer, proof: String, on eventLoop: any EventLoop) -> EventLoopFuture<HTTPStreamSession.Delivery> {
        guard let context, case .stream(var stream) = self.mode, !stream.ended else {
            return eventLoop.makeSucceededFuture(.ended)
        }
        // Only the stream's reader has the key: anyone else's POST is refused, and the stream
        // does not see it. The POST's number in the proof makes a replayed one fail too.
        let expected = HTTPStreamBinding.proof(key: stream.key, post: stream.posts, body: body)
        guard Self.constantTimeEqual(expected, proof) else {
            return context.eventLoop.makeSucceededFuture(.forbidden(post: stream.posts))
        }
        guard stream.pending == nil else { return context.eventLoop.makeSucceededFuture(.busy) }
        stream.posts += 1
        let promise = context.eventLoop.makePromise(of: HTTPStreamSession.Delivery.self)
        stream.pending = Pending(body: body, promise: promise)
        self.mode = .stream(stream)
        self.deliverPending(context: context)
        return promise.futureResult
    }

    /// Whether two proofs are equal, in a time that does not depend on where they differ.
    private static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let (x, y) = (Array(a.utf8), Array(b.utf8))
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for index in x.indices { difference |= x[index] ^ y[index] }
        return difference == 0
    }

    /// Passes the pending body up once the handler above asked to read.
    private func deliverPending(context: ChannelHandlerContext) {
        guard case .stream(var stream) = self.mode, stream.readRequested, var pending = stream.pending, !pending.passedUp else { return }
        stream.readRequested = false
        pending.passedUp = true
        let body = pending.body
        pending.body = ByteBuffer()  // the handler above owns it now
        stream.pending = pending
        self.mode = .stream(stream)
        context.fireChannelRead(Self.wrapInboundOut(body))
        context.fireChannelReadComplete()
        // As a socket with autoRead asks again after each read: the handler above decides, and
        // its next read says it has taken the body (``read(context:)``).
        if context.channel.isActive { context.channel.read() }
    }

    package func read(context: ChannelHandlerContext) {
        if case .post(let post) = self.mode, let account = self.account, account.isPaused || account.shouldPause {
            guard self.settings.bytesInFlightWhilePaused == 0 else {
                // HTTP/2: a paused stream's DATA waits in the HTTP/2 handler as slices of the
                // connection's reads, holding more than the window it counts. Refused instead.
                self.refuseAndClose(Self.budgetFull, post.version, context)
                return
            }
            // The budget is exhausted while this POST holds part of its body: wait for room.
            if !account.isPaused {
                account.paused()
                if case .post(let post) = self.mode { self.hold(post.body.readableBytes, inProgress: true) }
            }
            self.pausedRead = true
            return
        }
        if case .stream(var stream) = self.mode {
            if let pending = stream.pending, pending.passedUp {
                // The handler above took the last body and asks for more: it has read it.
                stream.pending = nil
                self.mode = .stream(stream)
                pending.promise.succeed(.accepted)
            }
            if case .stream(var stream) = self.mode {
                stream.readRequested = true
                self.mode = .stream(stream)
                self.deliverPending(context: context)
            }
        }
        context.read()
    }

    package func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard case .stream(let stream) = self.mode else {
            context.write(data, promise: promise)  // a response of the handlers after this one
            return
        }
        guard !stream.ended else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        context.write(Self.wrapOutboundOut(.body(.byteBuffer(Self.unwrapOutboundIn(data)))), promise: promise)
    }

    package func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if case .stream(var stream) = self.mode, !stream.ended {
            // The end of the chunked body, so that a proxy passes the end on as an end.
            stream.ended = true
            self.mode = .stream(stream)
            context.writeAndFlush(Self.wrapOutboundOut(.end(nil)), promise: nil)
        }
        context.close(mode: mode, promise: promise)
    }

    package func channelInactive(context: ChannelHandlerContext) {
        self.idleTimer?.cancel()
        if case .stream(var stream) = self.mode {
            stream.ended = true
            let pending = stream.pending
            stream.pending = nil
            self.mode = .stream(stream)
            self.sessions.end(stream.token)
            pending?.promise.succeed(.ended)
        }
        context.fireChannelInactive()
    }

    // MARK: POSTs

    private func deliver(_ post: Post, context: ChannelHandlerContext) {
        self.mode = .delivering(keepAlive: post.keepAlive, version: post.version)
        self.hold(post.body.readableBytes, inProgress: false)  // until its stream took it
        switch self.sessions.lookup(post.token) {
        case .unknown:
            guard !post.forwarded, let forward = self.sessions.forwarder(for: post.token) else {
                self.respondAndClose(.notFound, self.unknownSession, post.version, context)
                return
            }
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            let body = post.body
            let proof = post.proof
            context.eventLoop.makeFutureWithTask { await forward(body, proof) }.whenComplete { result in
                let (handler, context) = loopBound.value
                handler.answerForwarded((try? result.get()) ?? nil, post: post, context: context)
            }
        case .ended:
            self.answer(.ended, post: post, context: context)
        case .live(let session):
            self.markServed()
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            session.deliver(post.body, proof: post.proof).hop(to: context.eventLoop).whenComplete { result in
                let (handler, context) = loopBound.value
                handler.answer((try? result.get()) ?? .ended, post: post, context: context)
            }
        }
    }

    private var unknownSession: String { "no such session: open a stream with GET \(self.settings.path) first" }
    private var endedSession: String { "the session's stream has ended: open a new stream" }

    /// Passes on the answer of the node that holds the stream of a forwarded POST.
    private func answerForwarded(_ answer: HTTPStreamSessions.Forwarding.Answer?, post: Post, context: ChannelHandlerContext) {
        guard case .delivering = self.mode, context.channel.isActive else { return }
        guard let answer else {
            self.respondAndClose(.notFound, self.unknownSession, post.version, context)
            return
        }
        switch answer.status {
        case .noContent:
            self.markServed()
            self.answer(.accepted, post: post, context: context)
        case .conflict:
            self.answer(.busy, post: post, context: context)
        default:
            let message = answer.message.isEmpty ? "the node that holds this session answered \(answer.status.code)" : answer.message
            self.respondAndClose(answer.status, message, post.version, context)
        }
    }

    private func answer(_ delivery: HTTPStreamSession.Delivery, post: Post, context: ChannelHandlerContext) {
        guard case .delivering = self.mode, context.channel.isActive else { return }
        self.mode = .idle
        self.hold(0, inProgress: false)
        switch delivery {
        case .accepted:
            var headers = HTTPHeaders()
            headers.add(name: "Cache-Control", value: "no-store")
            if !post.keepAlive { headers.add(name: "Connection", value: "close") }
            let head = HTTPResponseHead(version: post.version, status: .noContent, headers: headers)
            context.write(Self.wrapOutboundOut(.head(head)), promise: nil)
            self.finish(keepAlive: post.keepAlive, context: context)
        case .busy:
            self.respond(
                .conflict,
                "the session's previous POST is still being read: send one at a time",
                keepAlive: post.keepAlive,
                version: post.version,
                context: context
            )
        case .ended:
            self.respondAndClose(.gone, self.endedSession, post.version, context)
        case .forbidden(let number):
            self.respondAndClose(
                .forbidden,
                "the POST's \(HTTPStreamBinding.proofHeader) does not prove it comes from the stream's reader "
                    + "(the HMAC of POST \(number) of the session, with the key of the stream's first line)",
                post.version,
                context
            )
        }
    }

    // MARK: Responses

    private func respond(
        _ status: HTTPResponseStatus,
        _ message: String,
        keepAlive: Bool,
        version: HTTPVersion,
        context: ChannelHandlerContext
    ) {
        self.respond(HTTPRefusal(status: status, message: message), keepAlive: keepAlive, version: version, context: context)
    }

    /// Writes `refusal`'s status, its reason as the body, and `Retry-After` if it has one.
    private func respond(_ refusal: HTTPRefusal, keepAlive: Bool, version: HTTPVersion, context: ChannelHandlerContext) {
        var (head, body) = refusal.response(version: version, keepAlive: keepAlive, allocator: context.channel.allocator)
        if refusal.status == .methodNotAllowed { head.headers.add(name: "Allow", value: "GET, POST") }
        context.write(Self.wrapOutboundOut(.head(head)), promise: nil)
        context.write(Self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        self.finish(keepAlive: keepAlive, context: context)
    }

    private func respondAndClose(_ status: HTTPResponseStatus, _ message: String, _ version: HTTPVersion, _ context: ChannelHandlerContext)
    {
        self.refuseAndClose(HTTPRefusal(status: status, message: message), version, context)
    }

    /// Answers with `refusal`, then closes the connection (an HTTP/2 stream: the stream).
    private func refuseAndClose(_ refusal: HTTPRefusal, _ version: HTTPVersion, _ context: ChannelHandlerContext) {
        self.mode = .closing
        self.hold(0, inProgress: false)
        self.respond(refusal, keepAlive: false, version: version, context: context)
    }

    /// Ends a response; closes the connection after it unless it is kept alive, in which case
    /// it closes after ``Settings/postIdleTimeout`` without a request.
    private func finish(keepAlive: Bool, context: ChannelHandlerContext) {
        let written = context.eventLoop.makePromise(of: Void.self)
        context.writeAndFlush(Self.wrapOutboundOut(.end(nil)), promise: written)
        guard keepAlive else {
            written.futureResult.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
            return
        }
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
        self.idleTimer = context.eventLoop.scheduleTask(in: self.settings.postIdleTimeout) {
            loopBound.value.close(promise: nil)
        }
    }

    private func markServed() {
        guard !self.servedOnce else { return }
        self.servedOnce = true
        self.served()
    }
}

extension HTTPStreamServerHandler: BudgetAccountOwner {
    package func budgetHasRoom() {
        guard let context, self.pausedRead else { return }
        self.pausedRead = false
        if case .post(let post) = self.mode { self.hold(post.body.readableBytes, inProgress: true) }
        self.read(context: context)
    }

    package func bodyTimedOut() {
        guard let context, case .post(let post) = self.mode else { return }
        let timeout = self.intake?.bodyTimeout ?? .zero
        if self.account?.isPaused == true {
            self.refuseAndClose(
                HTTPRefusal(
                    status: .serviceUnavailable,
                    message: "the gateway's memory budget stayed full for \(timeout) while this POST's body arrived; try again later",
                    retryAfter: .seconds(5)
                ),
                post.version,
                context
            )
        } else {
            self.refuseAndClose(
                HTTPRefusal(status: .requestTimeout, message: "the POST's body took longer than \(timeout) to arrive"),
                post.version,
                context
            )
        }
    }
}

@available(*, unavailable)
extension HTTPStreamServerHandler: Sendable {}

extension HTTPRequestHead {
    /// The request's path: its URI without the query.
    package var pathWithoutQuery: String {
        self.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? self.uri
    }
}
