import NIOCore
import NIOEmbedded
import NIOHTTP1
import Testing
import TetherNIO

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
    private func connection(_ sessions: HTTPStreamSessions, reader: Reader = Reader(), passed: Passed = Passed()) throws -> EmbeddedChannel
    {
        let channel = EmbeddedChannel()
        let handler = HTTPStreamServerHandler(
            settings: .init(path: Self.path, maxPostBodySize: Self.maxPostBodySize, postIdleTimeout: .seconds(60)),
            sessions: sessions,
            startConnection: { channel in
                try channel.pipeline.syncOperations.removeHandler(passed).wait()
                try channel.pipeline.syncOperations.addHandler(reader)
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

    /// Opens a stream; returns its channel and token.
    private func openStream(_ sessions: HTTPStreamSessions, reader: Reader) throws -> (EmbeddedChannel, String) {
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
        let token = String(line.dropLast())
        #expect(HTTPStreamBinding.isWellFormedToken(token))
        #expect(head.headers[HTTPStreamBinding.sessionHeader] == [token])
        stream.read()  // as autoRead does once the connection is set up
        return (stream, token)
    }

    @Test(
        "GET opens a stream: 200, no buffering or transforming, the token first; frames written go down as chunks; a close ends the body and the session"
    )
    func openAndEnd() throws {
        let sessions = HTTPStreamSessions(remembered: 10)
        let reader = Reader()
        let (stream, token) = try self.openStream(sessions, reader: reader)
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
        "a POST's body is read by the stream's connection, and answered 204 only then: a connection that holds reads holds the POST; a second POST meanwhile gets 409"
    )
    func postBackpressure() throws {
        let sessions = HTTPStreamSessions(remembered: 10)
        let reader = Reader()
        let (stream, token) = try self.openStream(sessions, reader: reader)
        reader.holding = true  // reads after the one the connection asked for when it was set up
        let post = try self.connection(sessions)
        try self.send(self.request(.POST, headers: [(HTTPStreamBinding.sessionHeader, token)], body: "frames"), to: post)
        try stream.embeddedEventLoop.run()
        try post.embeddedEventLoop.run()
        // The read asked for when the connection was set up is still outstanding: the body is read.
        #expect(reader.reads.map { String(buffer: $0) } == ["frames"])
        #expect(try self.response(of: post)?.status == .noContent)

        // Now the connection holds reads: the next POST waits.
        try self.send(self.request(.POST, headers: [(HTTPStreamBinding.sessionHeader, token)], body: "more"), to: post)
        try stream.embeddedEventLoop.run()
        try post.embeddedEventLoop.run()
        #expect(reader.reads.count == 1)
        #expect(try self.response(of: post) == nil)

        let second = try self.connection(sessions)
        try self.send(self.request(.POST, headers: [(HTTPStreamBinding.sessionHeader, token)], body: "meanwhile"), to: second)
        try stream.embeddedEventLoop.run()
        try second.embeddedEventLoop.run()
        #expect(try self.response(of: second)?.status == .conflict)

        reader.release()
        try stream.embeddedEventLoop.run()
        try post.embeddedEventLoop.run()
        #expect(reader.reads.map { String(buffer: $0) } == ["frames", "more"])
        #expect(try self.response(of: post)?.status == .noContent)
    }

    @Test(
        "clear statuses: 404 unknown session, 410 ended, 409 a second GET for a live session, 400 no token, 413 over the cap, 405 another method; other paths pass on"
    )
    func statuses() throws {
        let sessions = HTTPStreamSessions(remembered: 10)
        let (stream, token) = try self.openStream(sessions, reader: Reader())
        let unknown = String(repeating: "A", count: HTTPStreamBinding.tokenLength)
        let session = HTTPStreamBinding.sessionHeader
        let cases: [(String, [HTTPServerRequestPart], HTTPResponseStatus)] = [
            ("unknown session", self.request(.POST, headers: [(session, unknown)], body: "x"), .notFound),
            ("second GET", self.request(.GET, headers: [(session, token)]), .conflict),
            ("no token", self.request(.POST, body: "x"), .badRequest),
            ("malformed token", self.request(.POST, headers: [(session, "short")], body: "x"), .badRequest),
            (
                "declared too large", self.request(.POST, headers: [(session, token), ("Content-Length", "\(Self.maxPostBodySize + 1)")]),
                .payloadTooLarge
            ),
            (
                "too large",
                self.request(.POST, headers: [(session, token)], body: String(repeating: "x", count: Self.maxPostBodySize + 1)),
                .payloadTooLarge
            ),
            ("another method", self.request(.PUT), .methodNotAllowed),
        ]
        for (name, parts, status) in cases {
            let channel = try self.connection(sessions)
            try self.send(parts, to: channel)
            try stream.embeddedEventLoop.run()
            try channel.embeddedEventLoop.run()
            let response = try self.response(of: channel)
            #expect(response?.status == status, "\(name): \(String(describing: response))")
            #expect(response?.body.isEmpty == false, "\(name): the status comes with a sentence")
        }

        _ = try? stream.close().wait()
        let late = try self.connection(sessions)
        try self.send(self.request(.POST, headers: [(session, token)], body: "late"), to: late)
        try late.embeddedEventLoop.run()
        #expect(try self.response(of: late)?.status == .gone)

        let passed = Passed()
        let other = try self.connection(sessions, passed: passed)
        try self.send(self.request(.GET, "/health"), to: other)
        #expect(passed.parts.count == 2)
        #expect(try other.readOutbound(as: HTTPServerResponsePart.self) == nil)
    }

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
            forwarding: .init(nodeKey: 7) { token, owner, body in
                .init(status: .noContent, message: "\(owner) \(HTTPStreamBinding.nodeKey(of: token)!) \(body.readableBytes)")
            }
        )
        #expect(HTTPStreamBinding.nodeKey(of: sessions.makeToken()) == 7)
        #expect(sessions.forwarder(for: HTTPStreamBinding.makeToken(nodeKey: 7)) == nil, "a token of this node's own")
        let forward = sessions.forwarder(for: HTTPStreamBinding.makeToken(nodeKey: 8))
        #expect(await forward?(ByteBuffer(string: "abc"))?.message == "8 8 3")
        #expect(HTTPStreamSessions(remembered: 0).forwarder(for: HTTPStreamBinding.makeToken(nodeKey: 8)) == nil, "no cluster")
    }
}
