import Crypto
package import NIOCore
package import NIOHTTP1
package import TetherNIO

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

    enum Mode {
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

    struct Post {
        var token: String
        /// Its `Tether-Proof`.
        var proof: String
        var body: ByteBuffer
        var keepAlive: Bool
        var version: HTTPVersion
        /// Another node forwarded it: it is not forwarded again.
        var forwarded: Bool
    }

    struct Stream {
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
    struct Pending {
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

    let settings: Settings
    let sessions: HTTPStreamSessions
    let admit: (any Channel, Purpose) -> Admission
    let served: () -> Void
    /// The loop's watch over bodies in progress and the memory budget; `nil`: none.
    let intake: IntakeMonitor?
    /// What this connection's POST bodies hold of the budget.
    var account: BudgetAccount?
    /// Reads are paused until the budget has room; the pipeline's read waits.
    var pausedRead = false
    var mode = Mode.idle
    var context: ChannelHandlerContext?
    var idleTimer: Scheduled<Void>?
    var servedOnce = false
    /// The connection's POSTs were admitted (its first one asked).
    var postsAdmitted = false

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
    func hold(_ bytes: Int, inProgress: Bool) {
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

    func received(_ head: HTTPRequestHead, context: ChannelHandlerContext, data: NIOAny) {
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
    static let budgetFull = HTTPRefusal(
        status: .serviceUnavailable,
        message: "the gateway's memory budget is full; try again later",
        retryAfter: .seconds(5)
    )

    var tooLarge: String { "a POST body may have at most \(self.settings.maxPostBodySize) bytes" }

    func refuse(_ status: HTTPResponseStatus, _ message: String, _ head: HTTPRequestHead) {
        self.mode = .refusing(status: status, message: message, keepAlive: head.isKeepAlive, version: head.version)
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
