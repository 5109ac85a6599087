import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing
import TetherNIO
import TetherNIOTransports

/// Stands in for the gateway's connection handler above a stream: records what it reads, and
/// holds reads while told to (as the gateway does when its limits pace a client).
private final class Reader: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias OutboundIn = ByteBuffer
    var reads: [ByteBuffer] = []
    var holding = false
    var readHeld = false
    var context: ChannelHandlerContext?

    func handlerAdded(context: ChannelHandlerContext) { self.context = context }
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { self.reads.append(Self.unwrapInboundIn(data)) }
    func read(context: ChannelHandlerContext) {
        if self.holding {
            self.readHeld = true
        } else {
            context.read()
        }
    }

    func release() {
        self.holding = false
        if self.readHeld {
            self.readHeld = false
            self.context?.read()
        }
    }
}

/// Records the requests the stream's handler passes on (for other paths).
private final class Passed: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    var parts: [HTTPServerRequestPart] = []
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { self.parts.append(Self.unwrapInboundIn(data)) }
}

@Suite("HTTP stream server handler")
struct HTTPStreamServerHandlerTests {
    static let path = "/tether/stream"
    static let maxPostBodySize = 1000

    /// A connection of the HTTP listener: the stream's handler, then what a stream adds above it.
    private func connection(
        _ sessions: HTTPStreamSessions,
        reader: Reader = Reader(),
        passed: Passed = Passed(),
        refusing refusal: HTTPRefusal? = nil
    ) throws -> EmbeddedChannel {
        let channel = EmbeddedChannel()
        let handler = HTTPStreamServerHandler(
            settings: .init(path: Self.path, maxPostBodySize: Self.maxPostBodySize, postIdleTimeout: .seconds(60)),
            sessions: sessions,
            admit: { channel, purpose in
                if let refusal { return .refused(refusal) }
                switch purpose {
                case .posts:
                    return .admitted {}
                case .stream:
                    return .admitted {
                        // Whatever the connection's handler writes as it is added goes after the head.
                        try channel.pipeline.syncOperations.removeHandler(passed).wait()
                        try channel.pipeline.syncOperations.addHandler(reader)
                        channel.write(ByteBuffer(string: "written as added"), promise: nil)
                    }
                }
            },
            served: {}
        )
        try channel.pipeline.syncOperations.addHandler(handler)
        try channel.pipeline.syncOperations.addHandler(passed)
        try channel.connect(to: .init(ipAddress: "127.0.0.1", port: 1)).wait()
        return channel
    }

    private func request(
        _ method: HTTPMethod,
        _ uri: String = path,
        headers: [(String, String)] = [],
        body: String? = nil
    ) -> [HTTPServerRequestPart] {
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: uri)
        for (name, value) in headers { head.headers.add(name: name, value: value) }
        var parts: [HTTPServerRequestPart] = [.head(head)]
        if let body { parts.append(.body(ByteBuffer(string: body))) }
        parts.append(.end(nil))
        return parts
    }

    private func send(_ parts: [HTTPServerRequestPart], to channel: EmbeddedChannel) throws {
        for part in parts { try channel.writeInbound(part) }
    }

    /// The response written, as status, headers and body text (nil if none yet).
    private func response(of channel: EmbeddedChannel) throws -> (status: HTTPResponseStatus, headers: HTTPHeaders, body: String)? {
        guard case .head(let head)? = try channel.readOutbound(as: HTTPServerResponsePart.self) else { return nil }
        var body = ""
        while let part = try channel.readOutbound(as: HTTPServerResponsePart.self) {
            if case .body(.byteBuffer(let bytes)) = part { body += String(buffer: bytes) }
            if case .end = part { break }
        }
        return (head.status, head.headers, body)
    }

    /// An open stream as its reader knows it: the session line's token and key, and the POSTs
    /// sent so far.
    private final class OpenStream {
        let channel: EmbeddedChannel
        let token: String
        let key: String
        var posts: UInt64 = 0

        init(channel: EmbeddedChannel, token: String, key: String) {
            self.channel = channel
            self.token = token
            self.key = key
        }

        /// The headers of the session's next POST of `body`, with its proof.
        func headers(_ body: String) -> [(String, String)] {
            defer { self.posts += 1 }
            let proof = HTTPStreamBinding.proof(key: self.key, post: self.posts, body: ByteBuffer(string: body))!
            return [(HTTPStreamBinding.sessionHeader, self.token), (HTTPStreamBinding.proofHeader, proof)]
        }
    }

    /// Opens a stream.
    private func openStream(_ sessions: HTTPStreamSessions, reader: Reader) throws -> OpenStream {
        let stream = try self.connection(sessions, reader: reader)
        try self.send(self.request(.GET), to: stream)
        guard case .head(let head)? = try stream.readOutbound(as: HTTPServerResponsePart.self) else {
            Issue.record("no response head")
            throw CancellationError()
        }
        #expect(head.status == .ok)
        #expect(head.headers["Cache-Control"] == ["no-store, no-transform"])
        #expect(head.headers["X-Accel-Buffering"] == ["no"])
        guard case .body(.byteBuffer(let first))? = try stream.readOutbound(as: HTTPServerResponsePart.self) else {
            Issue.record("no first chunk")
            throw CancellationError()
        }
        let line = String(buffer: first)
        #expect(line.hasSuffix("\n"))
        guard let (token, key) = HTTPStreamBinding.parseSessionLine(line.dropLast()) else {
            Issue.record("not a session line: \(line)")
            throw CancellationError()
        }
        #expect(head.headers[HTTPStreamBinding.sessionHeader] == [token])
        #expect(!head.headers.contains { $0.value.contains(key) }, "the key is in no header")
        guard case .body(.byteBuffer(let added))? = try stream.readOutbound(as: HTTPServerResponsePart.self) else {
            Issue.record("what the connection's handler wrote as it was added is not in the body")
            throw CancellationError()
        }
        #expect(String(buffer: added) == "written as added")
        stream.read()  // as autoRead does once the connection is set up
        return OpenStream(channel: stream, token: token, key: key)
    }

    @Test(
        "GET opens a stream: 200, no buffering or transforming, the token first; frames written go down as chunks; a close ends the body and the session"
    )
    func openAndEnd() throws {
        let sessions = HTTPStreamSessions(remembered: 10)
        let reader = Reader()
        let open = try self.openStream(sessions, reader: reader)
        let (stream, token) = (open.channel, open.token)
        guard case .live = sessions.lookup(token) else {
            Issue.record("the session is not registered")
            return
        }
        try stream.writeOutbound(ByteBuffer(bytes: [1, 2, 3]))
        guard case .body(.byteBuffer(let chunk))? = try stream.readOutbound(as: HTTPServerResponsePart.self) else {
            Issue.record("the frame did not go down the stream")
            return
        }
        #expect(Array(chunk.readableBytesView) == [1, 2, 3])
        _ = try? stream.close().wait()
        guard case .end? = try stream.readOutbound(as: HTTPServerResponsePart.self) else {
            Issue.record("the body was not ended")
            return
        }
        guard case .ended = sessions.lookup(token) else {
            Issue.record("the session did not end")
            return
        }
    }

    @Test(
        "a POST's body is answered 204 only once the stream's connection has read it (it asks for more): a connection that holds reads holds the POST; a second POST meanwhile gets 409"
    )
    func postBackpressure() throws {
        let sessions = HTTPStreamSessions(remembered: 10)
        let reader = Reader()
        let open = try self.openStream(sessions, reader: reader)
        let stream = open.channel
        reader.holding = true  // it takes the next bytes, then holds (its limits pace the client)
        let post = try self.connection(sessions)
        try self.send(self.request(.POST, headers: open.headers("frames"), body: "frames"), to: post)
        stream.embeddedEventLoop.run()
        post.embeddedEventLoop.run()
        // The read asked for when the connection was set up was outstanding: the body went up,
        // but the connection holds its next read: it has not read it all, and the POST waits.
        #expect(reader.reads.map { String(buffer: $0) } == ["frames"])
        #expect(try self.response(of: post) == nil)

        let second = try self.connection(sessions)
        try self.send(self.request(.POST, headers: open.headers("meanwhile"), body: "meanwhile"), to: second)
        open.posts -= 1  // refused: it did not count
        stream.embeddedEventLoop.run()
        second.embeddedEventLoop.run()
        #expect(try self.response(of: second)?.status == .conflict)

        reader.release()  // the connection read what it held and asks for more
        stream.embeddedEventLoop.run()
        post.embeddedEventLoop.run()
        #expect(try self.response(of: post)?.status == .noContent)

        // A connection that does not hold reads answers at once.
        try self.send(self.request(.POST, headers: open.headers("more"), body: "more"), to: post)
        stream.embeddedEventLoop.run()
        post.embeddedEventLoop.run()
        #expect(reader.reads.map { String(buffer: $0) } == ["frames", "more"])
        #expect(try self.response(of: post)?.status == .noContent)
    }

    @Test(
        "a GET or a first POST the gateway does not admit gets the refusal's status, its reason and Retry-After, then a close; no stream opens"
    )
    func refusedAdmission() throws {
        let sessions = HTTPStreamSessions(remembered: 10)
        let refusal = HTTPRefusal(status: .serviceUnavailable, message: "the gateway holds its maximum", retryAfter: .milliseconds(1500))
        let post = [
            (HTTPStreamBinding.sessionHeader, HTTPStreamBinding.makeToken()), (HTTPStreamBinding.proofHeader, HTTPStreamBinding.makeKey()),
        ]
        for parts in [self.request(.GET), self.request(.POST, headers: post, body: "x")] {
            let channel = try self.connection(sessions, refusing: refusal)
            try self.send(parts, to: channel)
            channel.embeddedEventLoop.run()
            let response = try self.response(of: channel)
            #expect(response?.status == .serviceUnavailable)
            #expect(response?.headers["Retry-After"] == ["2"], "whole seconds, rounded up")
            #expect(response?.headers["Connection"] == ["close"])
            #expect(response?.body == "the gateway holds its maximum\n")
            #expect(!channel.isActive, "closed after the answer")
        }
        #expect(sessions.liveCount == 0)
        let rate = try self.connection(
            sessions,
            refusing: HTTPRefusal(status: .tooManyRequests, message: "too fast", retryAfter: .seconds(1))
        )
        try self.send(self.request(.GET), to: rate)
        let response = try self.response(of: rate)
        #expect(response?.status == .tooManyRequests)
        #expect(response?.headers["Retry-After"] == ["1"])
    }

    @Test(
        "clear statuses: 404 unknown session, 410 ended, 409 a second GET for a live session, 400 no token, 413 over the cap, 405 another method; other paths pass on"
    )
    func statuses() throws {
        let sessions = HTTPStreamSessions(remembered: 10)
        let open = try self.openStream(sessions, reader: Reader())
        let (stream, token) = (open.channel, open.token)
        let unknown = String(repeating: "A", count: HTTPStreamBinding.tokenLength)
        let session = HTTPStreamBinding.sessionHeader
        let proof = (HTTPStreamBinding.proofHeader, HTTPStreamBinding.makeKey())
        let cases: [(String, [HTTPServerRequestPart], HTTPResponseStatus)] = [
            ("unknown session", self.request(.POST, headers: [(session, unknown), proof], body: "x"), .notFound),
            ("second GET", self.request(.GET, headers: [(session, token)]), .conflict),
            ("no token", self.request(.POST, headers: [proof], body: "x"), .badRequest),
            ("malformed token", self.request(.POST, headers: [(session, "short"), proof], body: "x"), .badRequest),
            ("no proof", self.request(.POST, headers: [(session, token)], body: "x"), .badRequest),
            (
                "declared too large",
                self.request(.POST, headers: [(session, token), proof, ("Content-Length", "\(Self.maxPostBodySize + 1)")]),
                .payloadTooLarge
            ),
            (
                "too large",
                self.request(.POST, headers: [(session, token), proof], body: String(repeating: "x", count: Self.maxPostBodySize + 1)),
                .payloadTooLarge
            ),
            ("another method", self.request(.PUT), .methodNotAllowed),
        ]
        for (name, parts, status) in cases {
            let channel = try self.connection(sessions)
            try self.send(parts, to: channel)
            stream.embeddedEventLoop.run()
            channel.embeddedEventLoop.run()
            let response = try self.response(of: channel)
            #expect(response?.status == status, "\(name): \(String(describing: response))")
            #expect(response?.body.isEmpty == false, "\(name): the status comes with a sentence")
        }

        _ = try? stream.close().wait()
        let late = try self.connection(sessions)
        try self.send(self.request(.POST, headers: open.headers("late"), body: "late"), to: late)
        late.embeddedEventLoop.run()
        #expect(try self.response(of: late)?.status == .gone)

        let passed = Passed()
        let other = try self.connection(sessions, passed: passed)
        try self.send(self.request(.GET, "/health"), to: other)
        #expect(passed.parts.count == 2)
        #expect(try other.readOutbound(as: HTTPServerResponsePart.self) == nil)
    }

    @Test(
        "a POST with the token but without the key's proof (a stolen token), or replaying an earlier POST's proof, is refused 403 and the stream never sees it; its reader's POSTs go on"
    )
    func stolenToken() throws {
        let sessions = HTTPStreamSessions(remembered: 10)
        let reader = Reader()
        let open = try self.openStream(sessions, reader: reader)
        let first = open.headers("HELLO")
        let post = try self.connection(sessions)
        try self.send(self.request(.POST, headers: first, body: "HELLO"), to: post)
        open.channel.embeddedEventLoop.run()
        #expect(try self.response(of: post)?.status == .noContent)

        let forged = HTTPStreamBinding.proof(key: HTTPStreamBinding.makeKey(), post: open.posts, body: ByteBuffer(string: "garbage"))!
        let attempts: [(String, [(String, String)], String)] = [
            ("another key", [(HTTPStreamBinding.sessionHeader, open.token), (HTTPStreamBinding.proofHeader, forged)], "garbage"),
            ("a replayed proof", first, "HELLO"),
            ("a proof for another body", open.headers("REQUEST"), "garbage"),
        ]
        open.posts -= 1
        for (name, headers, body) in attempts {
            let thief = try self.connection(sessions)
            try self.send(self.request(.POST, headers: headers, body: body), to: thief)
            open.channel.embeddedEventLoop.run()
            let response = try self.response(of: thief)
            #expect(response?.status == .forbidden, "\(name): \(String(describing: response))")
            #expect(response?.body.contains(HTTPStreamBinding.proofHeader) == true)
            #expect(!thief.isActive)
        }
        #expect(reader.reads.map { String(buffer: $0) } == ["HELLO"], "the stream saw none of them")
        try self.send(self.request(.POST, headers: open.headers("REQUEST"), body: "REQUEST"), to: post)
        open.channel.embeddedEventLoop.run()
        #expect(try self.response(of: post)?.status == .noContent)
        #expect(reader.reads.map { String(buffer: $0) } == ["HELLO", "REQUEST"])
        #expect(open.channel.isActive)
    }

    @Test(
        "the proof is HMAC-SHA256 of the POST's number (8 bytes, big-endian) and its body, keyed with the session key (PROTOCOL.md vector)"
    )
    func proofVector() {
        // The key is 32 bytes 0x00…0x1F; POST 1 carries "TH".
        let key = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"
        #expect(HTTPStreamBinding.proof(key: key, post: 1, body: ByteBuffer(string: "TH")) == Self.vectorProof)
        #expect(HTTPStreamBinding.proof(key: "short", post: 1, body: ByteBuffer()) == nil)
        #expect(HTTPStreamBinding.parseSessionLine("\(String(repeating: "A", count: 43)) \(key)\r")?.key == key)
        #expect(HTTPStreamBinding.parseSessionLine(String(repeating: "A", count: 43)) == nil, "a line without a key")
    }

    /// The proof of the vector above, as computed independently (Python's hmac module).
    static let vectorProof = "iFIMBGYayGnL5d8V9L-tgp8ojM8LjQpxhNTjq_O8vHk"

    @Test("session tokens are 43 base64url characters from the system's random source, all different")
    func tokens() {
        let tokens = (0..<1000).map { _ in HTTPStreamBinding.makeToken() }
        #expect(Set(tokens).count == tokens.count)
        #expect(tokens.allSatisfy { HTTPStreamBinding.isWellFormedToken($0) })
        #expect(!HTTPStreamBinding.isWellFormedToken(String(repeating: "A", count: 42) + "="))
    }

    @Test("a cluster node's tokens start with its node key (the rest stays random); POSTs for other keys are forwarded, not its own")
    func nodeKeys() async {
        for key: UInt64 in [1, 0xdead_beef_0123_4567, .max] {
            let tokens = (0..<200).map { _ in HTTPStreamBinding.makeToken(nodeKey: key) }
            #expect(Set(tokens).count == tokens.count)
            #expect(tokens.allSatisfy { HTTPStreamBinding.isWellFormedToken($0) && HTTPStreamBinding.nodeKey(of: $0) == key })
        }
        #expect(HTTPStreamBinding.nodeKey(of: "short") == nil)

        let sessions = HTTPStreamSessions(
            remembered: 0,
            forwarding: .init(nodeKey: 7) { token, owner, body, proof in
                .init(status: .noContent, message: "\(owner) \(HTTPStreamBinding.nodeKey(of: token)!) \(body.readableBytes) \(proof)")
            }
        )
        #expect(HTTPStreamBinding.nodeKey(of: sessions.makeToken()) == 7)
        #expect(sessions.forwarder(for: HTTPStreamBinding.makeToken(nodeKey: 7)) == nil, "a token of this node's own")
        let forward = sessions.forwarder(for: HTTPStreamBinding.makeToken(nodeKey: 8))
        #expect(await forward?(ByteBuffer(string: "abc"), "proof")?.message == "8 8 3 proof")
        #expect(HTTPStreamSessions(remembered: 0).forwarder(for: HTTPStreamBinding.makeToken(nodeKey: 8)) == nil, "no cluster")
    }
}
