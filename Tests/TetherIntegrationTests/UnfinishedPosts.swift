import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import TetherCore
import TetherNIO
import TetherNIOTransports
import TetherTestSupport

/// An attacker's POSTs to a live HTTP stream that never end: each declares a body of `declared`
/// bytes and sends all of it but the last byte as fast as the gateway takes it, then waits.
/// Over HTTP/1.1 each is a connection of its own; over HTTP/2, `streams` streams share each
/// connection. Every body is one buffer shared by all: the attacker holds it once.
///
/// It records how each ended: the status line the gateway answered (`408`, `503`, …), or `closed`.
final class UnfinishedPosts: Sendable {
    let group: MultiThreadedEventLoopGroup
    private let channels = NIOLockedValueBox<[any Channel]>([])
    private let outcomes = NIOLockedValueBox<[String: Int]>([:])

    private init(group: MultiThreadedEventLoopGroup) {
        self.group = group
    }

    /// Connections (or streams) not closed yet.
    var open: Int { self.channels.withLockedValue { $0.filter(\.isActive).count } }

    /// How the POSTs ended so far, by answer.
    var endings: [String: Int] { self.outcomes.withLockedValue { $0 } }

    fileprivate func ended(_ outcome: String) {
        self.outcomes.withLockedValue { $0[outcome, default: 0] += 1 }
    }

    /// `count` connections, each with one unfinished POST.
    static func http1(count: Int, port: Int, token: String, declared: Int) async throws -> UnfinishedPosts {
        let flood = UnfinishedPosts(group: MultiThreadedEventLoopGroup(numberOfThreads: 1))
        let head = Self.head(token: token, declared: declared, port: port)
        let body = ByteBuffer(repeating: 0x54, count: declared - 1)
        let bootstrap = ClientBootstrap(group: flood.group)
            // A small send buffer: what the gateway does not read waits in this process (one
            // shared buffer), not in the kernel's memory for sockets.
            .channelOption(.socketOption(.so_sndbuf), value: 64 * 1024)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(StatusLine(flood: flood))
                }
            }
        for _ in 0..<count {
            guard let channel = try? await bootstrap.connect(host: "127.0.0.1", port: port).get() else {
                flood.ended("refused to connect")
                continue
            }
            flood.channels.withLockedValue { $0.append(channel) }
            channel.write(head, promise: nil)
            channel.writeAndFlush(body, promise: nil)
        }
        return flood
    }

    /// `connections` HTTP/2 connections (TLS, trusting the test CA) with `streams` unfinished
    /// POST streams each.
    static func http2(connections: Int, streams: Int, port: Int, token: String, declared: Int) async throws -> UnfinishedPosts {
        let flood = UnfinishedPosts(group: MultiThreadedEventLoopGroup(numberOfThreads: 1))
        let context = try HTTPPeer.tlsContext(offering: ["h2"])
        let body = ByteBuffer(repeating: 0x54, count: declared - 1)
        var head = HTTPRequestHead(version: .http1_1, method: .POST, uri: Endpoint.defaultHTTPStreamPath)
        head.headers.add(name: "Host", value: "127.0.0.1:\(port)")
        head.headers.add(name: HTTPStreamBinding.sessionHeader, value: token)
        head.headers.add(name: HTTPStreamBinding.proofHeader, value: HTTPStreamBinding.makeKey())
        head.headers.add(name: "Content-Length", value: "\(declared)")
        for _ in 0..<connections {
            let multiplexer = NIOLockedValueBox<NIOHTTP2Handler.StreamMultiplexer?>(nil)
            let connection = try await ClientBootstrap(group: flood.group)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: nil))
                        let streams = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                            mode: .client,
                            connectionConfiguration: .init(),
                            streamConfiguration: .init(),
                            inboundStreamInitializer: { $0.close() }
                        )
                        multiplexer.withLockedValue { $0 = streams }
                    }
                }
                .connect(host: "127.0.0.1", port: port).get()
            flood.channels.withLockedValue { $0.append(connection) }
            guard let streamMultiplexer = multiplexer.withLockedValue({ $0 }) else { continue }
            for _ in 0..<streams {
                guard
                    let stream = try? await streamMultiplexer.createStreamChannel({ child in
                        child.eventLoop.makeCompletedFuture {
                            try child.pipeline.syncOperations.addHandler(HTTP2FramePayloadToHTTP1ClientCodec(httpProtocol: .https))
                            try child.pipeline.syncOperations.addHandler(Status(flood: flood))
                        }
                    }).get()
                else {
                    flood.ended("stream refused")
                    continue
                }
                stream.write(HTTPClientRequestPart.head(head), promise: nil)
                stream.writeAndFlush(HTTPClientRequestPart.body(.byteBuffer(body)), promise: nil)
            }
        }
        return flood
    }

    /// Closes every connection and stops the attacker's loop.
    func stop() async {
        for channel in self.channels.withLockedValue({ $0 }) { try? await channel.close() }
        try? await self.group.shutdownGracefully()
    }

    private static func head(token: String, declared: Int, port: Int) -> ByteBuffer {
        ByteBuffer(
            string: "POST \(Endpoint.defaultHTTPStreamPath) HTTP/1.1\r\nHost: 127.0.0.1:\(port)\r\n"
                + "\(HTTPStreamBinding.sessionHeader): \(token)\r\n\(HTTPStreamBinding.proofHeader): \(HTTPStreamBinding.makeKey())\r\n"
                + "Content-Type: application/octet-stream\r\nContent-Length: \(declared)\r\n\r\n"
        )
    }

    /// Records the first line the gateway answers on a raw HTTP/1.1 connection, or `closed`.
    private final class StatusLine: ChannelInboundHandler, Sendable {
        typealias InboundIn = ByteBuffer
        let flood: UnfinishedPosts
        let answered = NIOLockedValueBox(false)

        init(flood: UnfinishedPosts) {
            self.flood = flood
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let bytes = Self.unwrapInboundIn(data)
            guard !self.answered.withLockedValue({ $0 }) else { return }
            self.answered.withLockedValue { $0 = true }
            let line = String(buffer: bytes).prefix { $0 != "\r" && $0 != "\n" }
            self.flood.ended(String(line.split(separator: " ").dropFirst().first ?? "?"))
        }

        func channelInactive(context: ChannelHandlerContext) {
            if !self.answered.withLockedValue({ $0 }) { self.flood.ended("closed") }
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }

    /// Records the status an HTTP/2 stream is answered, or `reset`.
    private final class Status: ChannelInboundHandler, Sendable {
        typealias InboundIn = HTTPClientResponsePart
        let flood: UnfinishedPosts
        let answered = NIOLockedValueBox(false)

        init(flood: UnfinishedPosts) {
            self.flood = flood
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            guard case .head(let head) = Self.unwrapInboundIn(data), !self.answered.withLockedValue({ $0 }) else { return }
            self.answered.withLockedValue { $0 = true }
            self.flood.ended("\(head.status.code)")
        }

        func userInboundEventTriggered(context: ChannelHandlerContext, event: Any) {
            if let closed = event as? StreamClosedEvent, !self.answered.withLockedValue({ $0 }) {
                self.answered.withLockedValue { $0 = true }
                self.flood.ended(closed.reason.map { "reset \($0)" } ?? "closed")
            }
            context.fireUserInboundEventTriggered(event)
        }

        func channelInactive(context: ChannelHandlerContext) {
            if !self.answered.withLockedValue({ $0 }) { self.flood.ended("reset") }
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }
}
