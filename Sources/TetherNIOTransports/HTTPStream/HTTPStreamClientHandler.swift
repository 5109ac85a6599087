import Crypto
import NIOCore
import NIOHTTP1
import TetherCore
import TetherNIO

/// The client's end of an HTTP stream (PROTOCOL.md, section 11.5), in the pipeline of the
/// connection that carries the stream, after NIOHTTP1's client handlers.
///
/// - It sends `GET <path>` once added, reads the session token and key from the first line of
///   the response's body, and passes the rest of the body up as a byte stream of Tether frames.
/// - What the Tether handler writes is sent in `POST <path>` bodies on a second connection
///   (``HTTPStreamPostHandler``), one POST at a time: writes made while a POST is out wait and
///   go together in the next one (at most ``HTTPStreamBinding/clientPostBodySize`` bytes each),
///   each with its proof (``HTTPStreamBinding/proof(key:post:body:)``).
///   A write's promise succeeds once the gateway has answered the POST that carried it.
/// - A POST answered with an error status, or whose connection closes before the answer, ends
///   the stream with a ``TransportError`` (code ``TransportError/Code/httpStreamFailed``); an
///   idle POST connection that closes (a proxy's keep-alive limit) is opened again when needed.
final class HTTPStreamClientHandler: ChannelDuplexHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = HTTPClientRequestPart

    /// Opens a connection that carries POSTs, with NIOHTTP1's handlers and an
    /// ``HTTPStreamPostHandler`` reporting to the given handler.
    typealias OpenPostConnection = @Sendable (NIOLoopBound<HTTPStreamClientHandler>) -> EventLoopFuture<any Channel>

    private enum Phase {
        /// The GET is sent; waiting for the response and its first line.
        case opening(line: ByteBuffer?)
        /// The session line is read; frames that arrive wait until the Tether handler is in place.
        case opened(Session, early: ByteBuffer?)
        /// Frames go up as they arrive.
        case streaming(Session)
        case ended
    }

    /// The stream's session: its token, its key, and how many POSTs it sent.
    private struct Session {
        var token: String
        var key: SymmetricKey
        var posts: UInt64 = 0
    }

    private let endpoint: Endpoint
    private let deadline: NIODeadline
    private let opened: EventLoopPromise<String>
    private let openPostConnection: OpenPostConnection
    private var phase = Phase.opening(line: nil)
    private var context: ChannelHandlerContext?
    private var timeout: Scheduled<Void>?

    /// Bytes written and not yet sent, and the promises of the writes they hold.
    private var pending: ByteBuffer?
    private var pendingPromises: [EventLoopPromise<Void>] = []
    /// The promises of the writes the POST being answered carried; `nil` while none is out.
    private var inFlight: [EventLoopPromise<Void>]?
    /// The connection (or HTTP/2 stream) the next POST goes on, and the one the POST out went on.
    private var post: (any Channel)?
    private var inFlightPost: (any Channel)?
    private var openingPost = false
    /// Whether a POST connection carries one POST only (an HTTP/2 stream) rather than one after
    /// another (an HTTP/1.1 connection kept alive).
    private let onePOSTPerConnection: Bool

    /// - Parameters:
    ///   - endpoint: The stream's endpoint (host, port and path).
    ///   - deadline: When the stream must have started.
    ///   - opened: Succeeded with the session token once the stream started; failed with a
    ///     ``TransportError`` if it does not.
    ///   - onePOSTPerConnection: Whether each POST needs a connection of its own (an HTTP/2 stream).
    ///   - openPostConnection: Opens a connection (or an HTTP/2 stream) for POSTs.
    init(
        endpoint: Endpoint,
        deadline: NIODeadline,
        opened: EventLoopPromise<String>,
        onePOSTPerConnection: Bool,
        openPostConnection: @escaping OpenPostConnection
    ) {
        self.endpoint = endpoint
        self.deadline = deadline
        self.opened = opened
        self.onePOSTPerConnection = onePOSTPerConnection
        self.openPostConnection = openPostConnection
    }

    private var path: String { self.endpoint.path ?? Endpoint.defaultHTTPStreamPath }

    func handlerAdded(context: ChannelHandlerContext) {
        self.context = context
        let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
        self.timeout = context.eventLoop.scheduleTask(deadline: self.deadline) {
            let (handler, context) = loopBound.value
            guard case .opening = handler.phase else { return }
            handler.fail(
                TransportError(code: .timedOut, message: "the HTTP stream from \(handler.endpoint) did not start in time"),
                context: context
            )
        }
        if context.channel.isActive { self.sendGET(context: context) }
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        if case .opening = self.phase {
            self.opened.fail(TransportError(code: .httpStreamFailed, message: "the HTTP stream from \(self.endpoint) was given up"))
        }
        self.phase = .ended
        self.context = nil
        self.timeout?.cancel()
    }

    func channelActive(context: ChannelHandlerContext) {
        self.sendGET(context: context)
        context.fireChannelActive()
    }

    private func sendGET(context: ChannelHandlerContext) {
        var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: self.path)
        head.headers.add(name: "Host", value: self.endpoint.authority)
        head.headers.add(name: "Accept", value: HTTPStreamBinding.contentType)
        head.headers.add(name: "Cache-Control", value: "no-cache")
        context.write(Self.wrapOutboundOut(.head(head)), promise: nil)
        context.writeAndFlush(Self.wrapOutboundOut(.end(nil)), promise: nil)
    }

    /// The Tether handler is in place and the first POST connection open: frames go up from now on.
    func start(post: any Channel, context: ChannelHandlerContext) {
        self.post = post
        guard case .opened(let session, let early) = self.phase else {
            post.close(promise: nil)
            return
        }
        self.phase = .streaming(session)
        if let early, early.readableBytes > 0 {
            context.fireChannelRead(Self.wrapInboundOut(early))
            context.fireChannelReadComplete()
        }
        self.sendIfPossible()
    }

    // MARK: The stream

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch Self.unwrapInboundIn(data) {
        case .head(let head):
            guard case .opening = self.phase else { return }
            guard head.status == .ok else {
                self.fail(
                    TransportError(
                        code: .httpStreamFailed,
                        message: "\(self.endpoint) answered the stream's GET with \(head.status.code) \(head.status.reasonPhrase)"
                    ),
                    context: context
                )
                return
            }
        case .body(var bytes):
            switch self.phase {
            case .opening(var line):
                self.phase = .ended  // no copy of the line while it grows
                line.setOrWriteBuffer(&bytes)
                self.phase = .opening(line: line)
                self.readToken(context: context)
            case .opened(let session, var early):
                self.phase = .ended
                early.setOrWriteBuffer(&bytes)
                self.phase = .opened(session, early: early)
            case .streaming:
                context.fireChannelRead(Self.wrapInboundOut(bytes))
            case .ended:
                break
            }
        case .end:
            // The gateway ended the stream (after a GOAWAY or an ERROR, or it closed).
            if case .opening = self.phase {
                self.fail(
                    TransportError(code: .httpStreamFailed, message: "\(self.endpoint) ended the HTTP stream before its session token"),
                    context: context
                )
            } else {
                context.close(promise: nil)
            }
        }
    }

    /// Reads `token key\n` from the start of the stream.
    private func readToken(context: ChannelHandlerContext) {
        guard case .opening(var line?) = self.phase else { return }
        guard let newline = line.readableBytesView.firstIndex(of: UInt8(ascii: "\n")) else {
            if line.readableBytes > HTTPStreamBinding.maximumTokenLineLength { self.fail(self.notAStream, context: context) }
            return
        }
        let length = newline - line.readerIndex
        let text = line.readString(length: length) ?? ""
        line.moveReaderIndex(forwardBy: 1)
        guard let (token, key) = HTTPStreamBinding.parseSessionLine(text), let keyBytes = HTTPStreamBinding.symmetricKey(key) else {
            self.fail(self.notAStream, context: context)
            return
        }
        self.timeout?.cancel()
        self.phase = .opened(Session(token: token, key: keyBytes), early: line.readableBytes > 0 ? line : nil)
        self.opened.succeed(token)
    }

    private var notAStream: TransportError {
        TransportError(code: .httpStreamFailed, message: "\(self.endpoint) is not a Tether HTTP stream (no session line: token and key)")
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        if case .streaming = self.phase { context.fireChannelReadComplete() }
    }

    func channelInactive(context: ChannelHandlerContext) {
        if case .opening = self.phase {
            self.opened.fail(
                TransportError(code: .httpStreamFailed, message: "\(self.endpoint) closed the connection before the HTTP stream started")
            )
        }
        self.phase = .ended
        self.failWrites(ChannelError.ioOnClosedChannel)
        self.closePostConnections()
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        if case .opening = self.phase {
            self.fail(error, context: context)
            return
        }
        context.fireErrorCaught(error)
    }

    private func fail(_ error: any Error, context: ChannelHandlerContext) {
        if case .opening = self.phase { self.opened.fail(error) }
        self.phase = .ended
        context.fireErrorCaught(error)
        context.close(promise: nil)
    }

    func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        self.closePostConnections()
        context.close(mode: mode, promise: promise)
    }

    private func closePostConnections() {
        let connections = [self.post, self.inFlightPost]
        self.post = nil
        self.inFlightPost = nil
        for connection in connections { connection?.close(promise: nil) }
    }

    // MARK: POSTs

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        switch self.phase {
        case .opened, .streaming:
            break  // the Tether handler writes its HELLO as it is added, before start(post:)
        case .opening, .ended:
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        var bytes = Self.unwrapOutboundIn(data)
        self.pending.setOrWriteBuffer(&bytes)
        if let promise { self.pendingPromises.append(promise) }
    }

    func flush(context: ChannelHandlerContext) {
        self.sendIfPossible()
    }

    /// Sends what is pending in a POST, unless one is out.
    private func sendIfPossible() {
        guard case .streaming(var session) = self.phase, self.inFlight == nil, var pending = self.pending, pending.readableBytes > 0 else {
            return
        }
        guard let post = self.post, post.isActive else {
            self.reopenPostConnection()
            return
        }
        let size = min(pending.readableBytes, HTTPStreamBinding.clientPostBodySize)
        let body = pending.readSlice(length: size)!
        if pending.readableBytes == 0 {
            self.pending = nil
            self.inFlight = self.pendingPromises
            self.pendingPromises = []
        } else {
            self.pending = pending
            self.inFlight = []  // the writes complete with the POST that carries their last byte
        }
        var head = HTTPRequestHead(version: .http1_1, method: .POST, uri: self.path)
        head.headers.add(name: "Host", value: self.endpoint.authority)
        head.headers.add(name: HTTPStreamBinding.sessionHeader, value: session.token)
        head.headers.add(
            name: HTTPStreamBinding.proofHeader,
            value: HTTPStreamBinding.proof(key: session.key, post: session.posts, body: body)
        )
        session.posts += 1
        self.phase = .streaming(session)
        head.headers.add(name: "Content-Type", value: HTTPStreamBinding.contentType)
        head.headers.add(name: "Content-Length", value: "\(size)")
        self.inFlightPost = post
        if self.onePOSTPerConnection { self.post = nil }
        post.write(HTTPClientRequestPart.head(head), promise: nil)
        post.write(HTTPClientRequestPart.body(.byteBuffer(body)), promise: nil)
        post.writeAndFlush(HTTPClientRequestPart.end(nil), promise: nil)
    }

    private func reopenPostConnection() {
        guard !self.openingPost, let context else { return }
        self.openingPost = true
        self.post = nil
        let loopBound = NIOLoopBound(self, eventLoop: context.eventLoop)
        self.openPostConnection(loopBound).assumeIsolated().whenComplete { result in
            let handler = loopBound.value
            handler.openingPost = false
            switch result {
            case .success(let post):
                guard case .streaming = handler.phase else {
                    post.close(promise: nil)
                    return
                }
                handler.post = post
                handler.sendIfPossible()
            case .failure(let error):
                handler.broke(
                    TransportError(
                        code: .httpStreamFailed,
                        message: "cannot open a connection for POSTs to \(handler.endpoint)",
                        cause: error
                    )
                )
            }
        }
    }

    /// The gateway answered the POST that is out.
    func postAnswered(status: HTTPResponseStatus, message: String) {
        guard let promises = self.inFlight else { return }
        guard (200..<300).contains(status.code) else {
            let detail = message.isEmpty ? "" : ": \(message)"
            self.broke(
                TransportError(
                    code: .httpStreamFailed,
                    message: "\(self.endpoint) answered a POST with \(status.code) \(status.reasonPhrase)\(detail)"
                )
            )
            return
        }
        self.inFlight = nil
        self.inFlightPost = nil
        for promise in promises { promise.succeed() }
        self.sendIfPossible()
    }

    /// The connection that carries POSTs closed.
    func postConnectionClosed(_ channel: any Channel) {
        guard let post = self.post, post === channel else { return }
        self.post = nil
        if self.inFlight != nil {
            self.broke(
                TransportError(
                    code: .httpStreamFailed,
                    message: "the connection carrying POSTs to \(self.endpoint) closed before the answer"
                )
            )
        }
    }

    /// The stream cannot go on: reports why and closes it.
    private func broke(_ error: TransportError) {
        guard let context else { return }
        self.failWrites(error)
        self.fail(error, context: context)
    }

    private func failWrites(_ error: any Error) {
        let promises = (self.inFlight ?? []) + self.pendingPromises
        self.inFlight = nil
        self.pendingPromises = []
        self.pending = nil
        for promise in promises { promise.fail(error) }
    }
}

@available(*, unavailable)
extension HTTPStreamClientHandler: Sendable {}

/// Reads the answers to an HTTP stream's POSTs, on the connection that carries them, and
/// reports them to the stream's ``HTTPStreamClientHandler`` (on the same event loop).
final class HTTPStreamPostHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPClientResponsePart

    private let stream: NIOLoopBound<HTTPStreamClientHandler>
    private var status: HTTPResponseStatus?
    private var message = ""

    init(stream: NIOLoopBound<HTTPStreamClientHandler>) {
        self.stream = stream
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch Self.unwrapInboundIn(data) {
        case .head(let head):
            self.status = head.status
            self.message = ""
        case .body(var bytes):
            // An error's explanation, kept short.
            if self.message.utf8.count < 512, let text = bytes.readString(length: min(bytes.readableBytes, 512)) {
                self.message += text
            }
        case .end:
            guard let status = self.status else { return }
            self.status = nil
            self.stream.value.postAnswered(status: status, message: self.message.trimmingNewlines())
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.stream.value.postConnectionClosed(context.channel)
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        context.close(promise: nil)
    }
}

@available(*, unavailable)
extension HTTPStreamPostHandler: Sendable {}

extension String {
    fileprivate func trimmingNewlines() -> String {
        var text = Substring(self)
        while let last = text.last, last == "\n" || last == "\r" { text.removeLast() }
        return String(text)
    }
}
