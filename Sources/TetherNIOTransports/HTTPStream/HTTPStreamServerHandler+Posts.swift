import NIOCore
import NIOHTTP1
import TetherNIO

// The HTTP stream's POSTs once their bodies are read (handed to their session's stream, or
// forwarded to the node that holds it), the answers, and the memory budget's calls.
extension HTTPStreamServerHandler {
    // MARK: POSTs

    func deliver(_ post: Post, context: ChannelHandlerContext) {
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

    var unknownSession: String { "no such session: open a stream with GET \(self.settings.path) first" }
    var endedSession: String { "the session's stream has ended: open a new stream" }

    /// Passes on the answer of the node that holds the stream of a forwarded POST.
    func answerForwarded(_ answer: HTTPStreamSessions.Forwarding.Answer?, post: Post, context: ChannelHandlerContext) {
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

    func answer(_ delivery: HTTPStreamSession.Delivery, post: Post, context: ChannelHandlerContext) {
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

    func respond(
        _ status: HTTPResponseStatus,
        _ message: String,
        keepAlive: Bool,
        version: HTTPVersion,
        context: ChannelHandlerContext
    ) {
        self.respond(HTTPRefusal(status: status, message: message), keepAlive: keepAlive, version: version, context: context)
    }

    /// Writes `refusal`'s status, its reason as the body, and `Retry-After` if it has one.
    func respond(_ refusal: HTTPRefusal, keepAlive: Bool, version: HTTPVersion, context: ChannelHandlerContext) {
        var (head, body) = refusal.response(version: version, keepAlive: keepAlive, allocator: context.channel.allocator)
        if refusal.status == .methodNotAllowed { head.headers.add(name: "Allow", value: "GET, POST") }
        context.write(Self.wrapOutboundOut(.head(head)), promise: nil)
        context.write(Self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        self.finish(keepAlive: keepAlive, context: context)
    }

    func respondAndClose(_ status: HTTPResponseStatus, _ message: String, _ version: HTTPVersion, _ context: ChannelHandlerContext) {
        self.refuseAndClose(HTTPRefusal(status: status, message: message), version, context)
    }

    /// Answers with `refusal`, then closes the connection (an HTTP/2 stream: the stream).
    func refuseAndClose(_ refusal: HTTPRefusal, _ version: HTTPVersion, _ context: ChannelHandlerContext) {
        self.mode = .closing
        self.hold(0, inProgress: false)
        self.respond(refusal, keepAlive: false, version: version, context: context)
    }

    /// Ends a response; closes the connection after it unless it is kept alive, in which case
    /// it closes after ``Settings/postIdleTimeout`` without a request.
    func finish(keepAlive: Bool, context: ChannelHandlerContext) {
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

    func markServed() {
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
