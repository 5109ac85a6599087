import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import Testing
import TetherCore
import TetherNIO
import TetherNIOTransports
import TetherTestSupport

/// An HTTP client of the tests' own, driven by hand: requests as a peer would send them to the
/// gateway's HTTP listener (HTTP/1.1, over TLS or not, or HTTP/2 over TLS), and what it answers.
///
/// Over HTTP/1.1 each ``send(_:_:headers:body:)`` goes on the one connection, after the last;
/// over HTTP/2 each is a stream of its own.
final class HTTPPeer: Sendable {
    /// What one request got so far.
    struct Response: Sendable {
        var status: HTTPResponseStatus
        var headers: HTTPHeaders
        var bytes: ByteBuffer
        /// The body as text.
        var body: String { String(buffer: self.bytes) }
        /// The response ended (its `end` arrived).
        var ended: Bool
    }

    /// One request's response, as it arrives.
    final class Exchange: Sendable {
        fileprivate let state = NIOLockedValueBox<Response?>(nil)
        /// The stream (HTTP/2) or connection (HTTP/1.1) it went on.
        let channel: any Channel

        fileprivate init(channel: any Channel) {
            self.channel = channel
        }

        /// The response so far; `nil` before its head.
        var response: Response? { self.state.withLockedValue { $0 } }

        /// The response once its head arrived and, if `ended`, once it ended.
        /// The first line of the body (an HTTP stream's session line), once it arrived whole:
        /// the head and the first body bytes may come apart.
        func firstLine(timeout: Duration = .seconds(10)) async throws -> String {
            try await eventually("the first line of the response's body", timeout: timeout) {
                self.response?.body.contains("\n") ?? false
            }
            return String(self.response!.body.prefix { $0 != "\n" })
        }

        func wait(ended: Bool = true, timeout: Duration = .seconds(10)) async throws -> Response {
            try await eventually("an HTTP response\(ended ? " that ends" : "")", timeout: timeout) {
                guard let response = self.response else { return false }
                return !ended || response.ended
            }
            return self.response!
        }
    }

    let connection: any Channel
    private let multiplexer: NIOHTTP2Handler.StreamMultiplexer?
    /// Over HTTP/1.1: the exchange of the last request, where the connection's responses go.
    private let current: NIOLockedValueBox<Exchange?>
    private let port: Int

    private init(connection: any Channel, multiplexer: NIOHTTP2Handler.StreamMultiplexer?, current: NIOLockedValueBox<Exchange?>, port: Int)
    {
        self.connection = connection
        self.multiplexer = multiplexer
        self.current = current
        self.port = port
    }

    /// A client TLS context that trusts the test CA and offers `protocols` (ALPN).
    static func tlsContext(offering protocols: [String]) throws -> NIOSSLContext {
        var configuration = NIOSSL.TLSConfiguration.makeClientConfiguration()
        configuration.trustRoots = .certificates([
            try NIOSSLCertificate(bytes: Array(TestCertificates.shared.authority.certificatePEM.utf8), format: .pem)
        ])
        configuration.applicationProtocols = protocols
        return try NIOSSLContext(configuration: configuration)
    }

    /// A connection to 127.0.0.1:`port`: plain, TLS trusting the test CA, or HTTP/2 (TLS, ALPN `h2`).
    static func connect(port: Int, tls: Bool = false, http2: Bool = false) async throws -> HTTPPeer {
        let context = tls || http2 ? try Self.tlsContext(offering: http2 ? ["h2"] : ["http/1.1"]) : nil
        let multiplexer = NIOLockedValueBox<NIOHTTP2Handler.StreamMultiplexer?>(nil)
        let current = NIOLockedValueBox<Exchange?>(nil)
        let connection = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    if let context {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: nil))
                    }
                    if http2 {
                        let streams = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                            mode: .client,
                            connectionConfiguration: .init(),
                            streamConfiguration: .init(),
                            inboundStreamInitializer: { $0.close() }
                        )
                        multiplexer.withLockedValue { $0 = streams }
                    } else {
                        try channel.pipeline.syncOperations.addHTTPClientHandlers()
                        try channel.pipeline.syncOperations.addHandler(Collector { current.withLockedValue { $0 } })
                    }
                }
            }
            .connect(host: "127.0.0.1", port: port).get()
        return HTTPPeer(connection: connection, multiplexer: multiplexer.withLockedValue { $0 }, current: current, port: port)
    }

    /// Sends a request; its response arrives in the exchange returned.
    func send(
        _ method: HTTPMethod,
        _ path: String,
        headers: [(String, String)] = [],
        body: ByteBuffer? = nil,
        end: Bool = true
    ) async throws -> Exchange {
        var head = HTTPRequestHead(version: .http1_1, method: method, uri: path)
        head.headers.add(name: "Host", value: "127.0.0.1:\(self.port)")
        for (name, value) in headers { head.headers.add(name: name, value: value) }
        if let body, !head.headers.contains(name: "Content-Length") {
            head.headers.add(name: "Content-Length", value: "\(body.readableBytes)")
        }
        let channel: any Channel
        let exchange: Exchange
        if let multiplexer = self.multiplexer {
            let box = NIOLockedValueBox<Exchange?>(nil)
            channel = try await multiplexer.createStreamChannel { child in
                child.eventLoop.makeCompletedFuture {
                    try child.pipeline.syncOperations.addHandler(HTTP2FramePayloadToHTTP1ClientCodec(httpProtocol: .https))
                    try child.pipeline.syncOperations.addHandler(Collector { box.withLockedValue { $0 } })
                }
            }.get()
            exchange = Exchange(channel: channel)
            box.withLockedValue { $0 = exchange }
        } else {
            channel = self.connection
            exchange = Exchange(channel: channel)
            self.current.withLockedValue { $0 = exchange }
        }
        channel.write(HTTPClientRequestPart.head(head), promise: nil)
        if let body { channel.write(HTTPClientRequestPart.body(.byteBuffer(body)), promise: nil) }
        if end {
            try await channel.writeAndFlush(HTTPClientRequestPart.end(nil)).get()
        } else {
            channel.flush()
        }
        return exchange
    }

    /// An HTTP stream opened by a GET on a peer: its session's token and key (its first line),
    /// and the number of its next POST, which that POST's proof names (PROTOCOL.md 11.5).
    final class StreamSession: Sendable {
        /// The GET's response: the stream.
        let stream: Exchange
        /// The stream's first line, which carries the token and the key.
        let line: String
        let token: String
        let key: String
        private let nextPost = NIOLockedValueBox<UInt64>(0)

        fileprivate init(stream: Exchange, line: String, token: String, key: String) {
            self.stream = stream
            self.line = line
            self.token = token
            self.key = key
        }

        /// Sends `frames` (each with its checksum) in one POST on `peer`, with the session's
        /// token and the proof of the POST's number.
        func post(_ frames: [Frame.Payload], on peer: HTTPPeer) async throws -> Exchange {
            var body = ByteBuffer()
            for payload in frames { try FrameEncoder().encode(Frame(payload, flags: .checksum), into: &body) }
            let number = self.nextPost.withLockedValue { number in
                defer { number += 1 }
                return number
            }
            let proof = try #require(HTTPStreamBinding.proof(key: self.key, post: number, body: body))
            return try await peer.send(
                .POST,
                Endpoint.defaultHTTPStreamPath,
                headers: [(HTTPStreamBinding.sessionHeader, self.token), (HTTPStreamBinding.proofHeader, proof)],
                body: body
            )
        }
    }

    /// Opens an HTTP stream on this connection (a GET of the stream's path) and reads its
    /// session line.
    func openStream() async throws -> StreamSession {
        let stream = try await self.send(.GET, Endpoint.defaultHTTPStreamPath)
        let line = try await stream.firstLine()
        let (token, key) = try #require(HTTPStreamBinding.parseSessionLine(line))
        return StreamSession(stream: stream, line: line, token: token, key: key)
    }

    /// Sends more of a request's body, on the channel its exchange went on.
    func sendBody(_ bytes: ByteBuffer, of exchange: Exchange) async throws {
        try await exchange.channel.writeAndFlush(HTTPClientRequestPart.body(.byteBuffer(bytes))).get()
    }

    var isActive: Bool { self.connection.isActive }

    func close() {
        self.connection.close(promise: nil)
    }

    /// Puts each response part in the exchange `target` names.
    private final class Collector: ChannelInboundHandler, Sendable {
        typealias InboundIn = HTTPClientResponsePart
        let target: @Sendable () -> Exchange?

        init(_ target: @escaping @Sendable () -> Exchange?) {
            self.target = target
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard let exchange = self.target() else { return }
            switch Self.unwrapInboundIn(data) {
            case .head(let head):
                exchange.state.withLockedValue {
                    $0 = Response(status: head.status, headers: head.headers, bytes: ByteBuffer(), ended: false)
                }
            case .body(var bytes):
                _ = exchange.state.withLockedValue { $0?.bytes.writeBuffer(&bytes) }
            case .end:
                exchange.state.withLockedValue { $0?.ended = true }
            }
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }
}
