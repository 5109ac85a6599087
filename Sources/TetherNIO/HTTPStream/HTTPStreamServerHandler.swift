package import NIOCore
package import NIOHTTP1

/// The gateway's end of the HTTP stream (PROTOCOL.md, section 11.5), one per connection of the
/// HTTP listener, after NIOHTTP1's server handlers.
///
/// - `GET <path>` opens a stream: `200` with headers that keep proxies from buffering or
///   transforming it, a first chunk holding the session token and a line feed, then Tether
///   frames as the connection's handler writes them, for as long as the connection lives. The
///   connection becomes a Tether connection: `startConnection` adds the gateway's handler
///   above this one, which reads the session's POST bodies as one byte stream.
/// - `POST <path>` with `Tether-Session: <token>` carries frames up: the body goes to the
///   stream's connection, and `204` answers once that connection has read it, so a gateway that
///   stops reading (its limits pace a client) holds the POST and the client waits. One POST per
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

        package init(path: String, maxPostBodySize: Int, postIdleTimeout: TimeAmount) {
            self.path = path
            self.maxPostBodySize = maxPostBodySize
            self.postIdleTimeout = postIdleTimeout
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
        var body: ByteBuffer
        var keepAlive: Bool
        var version: HTTPVersion
        /// Another node forwarded it: it is not forwarded again.
        var forwarded: Bool
    }

    private struct Stream {
        var token: String
        var ended = false
        /// The handler above asked to read, and has not been given anything since.
        var readRequested = false
        /// A POST's body the handler above has not read yet, and who waits for it.
        var pending: (body: ByteBuffer, promise: EventLoopPromise<HTTPStreamSession.Delivery>)?
    }

    private let settings: Settings
    private let sessions: HTTPStreamSessions
    private let startConnection: (any Channel) throws -> Void
    private let served: () -> Void
    private var mode = Mode.idle
    private var context: ChannelHandlerContext?
    private var idleTimer: Scheduled<Void>?
    private var servedOnce = false

    /// - Parameters:
    ///   - settings: The path and the limits.
    ///   - sessions: The gateway's sessions, shared by its HTTP connections.
    ///   - startConnection: Adds the gateway's connection handler at the end of the pipeline
    ///     (this handler is then the last one before it); runs once, when a GET opens a stream.
    ///   - served: Called once, when the connection first serves the stream (a GET that opened
    ///     one, or a POST that reached one): it is no longer an unidentified HTTP connection.
    package init(
        settings: Settings,
        sessions: HTTPStreamSessions,
        startConnection: @escaping (any Channel) throws -> Void,
        served: @escaping () -> Void
    ) {
        self.settings = settings
        self.sessions = sessions
        self.startConnection = startConnection
        self.served = served
    }

    package func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
    }

    package func handlerRemoved(context: ChannelHandlerContext) {
        self.context = nil
        self.idleTimer?.cancel()
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
            if let length = head.headers.first(name: "Content-Length").flatMap(Int.init), length > self.settings.maxPostBodySize {
                self.respondAndClose(.payloadTooLarge, self.tooLarge, head.version, context)
                return
            }
            self.mode = .post(
                Post(
                    token: token,
                    body: context.channel.allocator.buffer(capacity: 0),
                    keepAlive: head.isKeepAlive,
                    version: head.version,
                    forwarded: head.headers.contains(name: HTTPStreamBinding.forwardedHeader)
                )
            )
        default:
            self.refuse(.methodNotAllowed, "\(self.settings.path) takes GET (the stream) and POST (frames for it)", head)
        }
    }

    private var tooLarge: String { "a POST body may have at most \(self.settings.maxPostBodySize) bytes" }

    private func refuse(_ status: HTTPResponseStatus, _ message: String, _ head: HTTPRequestHead) {
        self.mode = .refusing(status: status, message: message, keepAlive: head.isKeepAlive, version: head.version)
    }

    // MARK: The stream

    /// Opens a stream on this connection.
    private func open(_ request: HTTPRequestHead, context: ChannelHandlerContext) {
        let token = self.sessions.makeToken()
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: HTTPStreamBinding.contentType)
        headers.add(name: "Cache-Control", value: "no-store, no-transform")
        headers.add(name: "X-Accel-Buffering", value: "no")
        headers.add(name: HTTPStreamBinding.sessionHeader, value: token)
        if request.version == .http1_0 {
            // No chunked encoding in HTTP/1.0: the body ends when the connection does.
            headers.add(name: "Connection", value: "close")
        }
        self.mode = .stream(Stream(token: token))
        do {
            try self.startConnection(context.channel)
        } catch {
            context.close(promise: nil)
            return
        }
        self.sessions.register(HTTPStreamSession(token: token, handler: NIOLoopBound(self, eventLoop: context.eventLoop)))
        self.markServed()
        context.write(Self.wrapOutboundOut(.head(HTTPResponseHead(version: request.version, status: .ok, headers: headers))), promise: nil)
        var first = context.channel.allocator.buffer(capacity: token.utf8.count + 1)
        first.writeString(token + "\n")
        context.writeAndFlush(Self.wrapOutboundOut(.body(.byteBuffer(first))), promise: nil)
    }

    /// A POST's body for this stream: read it when the handler above asks.
    func deliver(_ body: ByteBuffer, on eventLoop: any EventLoop) -> EventLoopFuture<HTTPStreamSession.Delivery> {
        guard let context, case .stream(var stream) = self.mode, !stream.ended else {
            return eventLoop.makeSucceededFuture(.ended)
        }
        guard stream.pending == nil else { return context.eventLoop.makeSucceededFuture(.busy) }
        let promise = context.eventLoop.makePromise(of: HTTPStreamSession.Delivery.self)
        stream.pending = (body, promise)
        self.mode = .stream(stream)
        self.deliverPending(context: context)
        return promise.futureResult
    }

    private func deliverPending(context: ChannelHandlerContext) {
        guard case .stream(var stream) = self.mode, stream.readRequested, let pending = stream.pending else { return }
        stream.readRequested = false
        stream.pending = nil
        self.mode = .stream(stream)
        context.fireChannelRead(Self.wrapInboundOut(pending.body))
        context.fireChannelReadComplete()
        pending.promise.succeed(.accepted)
        // As a socket with autoRead asks again after each read: the handler above decides.
        if context.channel.isActive { context.channel.read() }
    }

    package func read(context: ChannelHandlerContext) {
        if case .stream(var stream) = self.mode {
            stream.readRequested = true
            self.mode = .stream(stream)
            self.deliverPending(context: context)
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
        switch self.sessions.lookup(post.token) {
        case .unknown:
            guard !post.forwarded, let forward = self.sessions.forwarder(for: post.token) else {
                self.respondAndClose(.notFound, self.unknownSession, post.version, context)
                return
            }
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            let body = post.body
            context.eventLoop.makeFutureWithTask { await forward(body) }.whenComplete { result in
                let (handler, context) = loopBound.value
                handler.answerForwarded((try? result.get()) ?? nil, post: post, context: context)
            }
        case .ended:
            self.answer(.ended, post: post, context: context)
        case .live(let session):
            self.markServed()
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            session.deliver(post.body).hop(to: context.eventLoop).whenComplete { result in
                let (handler, context) = loopBound.value
                handler.answer((try? result.get()) ?? .ended, post: post, context: context)
            }
        }
    }

    private var unknownSession: String { "no such session: open a stream with GET \(self.settings.path) first" }

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
            self.respondAndClose(.gone, "the session's stream has ended: open a new stream", post.version, context)
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
        var body = context.channel.allocator.buffer(capacity: message.utf8.count + 1)
        body.writeString(message + "\n")
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: "text/plain; charset=utf-8")
        headers.add(name: "Content-Length", value: "\(body.readableBytes)")
        headers.add(name: "Cache-Control", value: "no-store")
        if status == .methodNotAllowed { headers.add(name: "Allow", value: "GET, POST") }
        if !keepAlive { headers.add(name: "Connection", value: "close") }
        context.write(Self.wrapOutboundOut(.head(HTTPResponseHead(version: version, status: status, headers: headers))), promise: nil)
        context.write(Self.wrapOutboundOut(.body(.byteBuffer(body))), promise: nil)
        self.finish(keepAlive: keepAlive, context: context)
    }

    private func respondAndClose(_ status: HTTPResponseStatus, _ message: String, _ version: HTTPVersion, _ context: ChannelHandlerContext)
    {
        self.mode = .closing
        self.respond(status, message, keepAlive: false, version: version, context: context)
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

@available(*, unavailable)
extension HTTPStreamServerHandler: Sendable {}

extension HTTPRequestHead {
    /// The request's path: its URI without the query.
    package var pathWithoutQuery: String {
        self.uri.split(separator: "?", maxSplits: 1).first.map(String.init) ?? self.uri
    }
}
