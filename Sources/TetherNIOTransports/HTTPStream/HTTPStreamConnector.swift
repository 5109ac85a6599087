import NIOCore
import NIOHTTP1
import NIOHTTP2
import TetherCore
import TetherNIO

/// Opens the client's end of an HTTP stream over connections a transport makes (PROTOCOL.md,
/// section 11.5): over HTTP/1.1 the stream's GET on one connection and POSTs on another; over
/// HTTP/2 (when TLS's ALPN picks `h2`) the GET and each POST are streams of one connection.
enum HTTPStreamConnector {
    /// Opens a connection (through a proxy, with TLS, as the transport does) by the deadline
    /// and calls `install` on its event loop once it carries HTTP, with the ALPN protocol TLS
    /// chose (if any).
    typealias Open =
        @Sendable (_ deadline: NIODeadline, _ install: @escaping @Sendable (any Channel, String?) throws -> Void) async throws ->
        any Channel

    /// Opens a connection to `endpoint` with `open`, for a transport's
    /// ``ClientTransport/connect(to:timeout:eventLoop:initializer:)``: the HTTP stream over the
    /// connections `open` makes, every other transport directly on the one it makes.
    static func connect(
        to endpoint: Endpoint,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel, Framing) throws -> Void,
        open: @escaping Open
    ) async throws -> any Channel {
        let deadline = NIODeadline.now() + TimeAmount(timeout)
        guard endpoint.transport.isHTTPStream else {
            let framing = endpoint.transport.framing
            return try await open(deadline) { channel, _ in try initializer(channel, framing) }
        }
        return try await Self.connect(
            to: endpoint,
            deadline: deadline,
            timeout: timeout,
            eventLoop: eventLoop,
            initializer: initializer,
            open: open
        )
    }

    /// Opens the stream, waits for its session token, opens the POST connection (HTTP/1.1),
    /// then installs the Tether handler through `initializer` on the stream's channel.
    /// - Returns: The stream's channel; closing it closes the connections it uses.
    static func connect(
        to endpoint: Endpoint,
        deadline: NIODeadline,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel, Framing) throws -> Void,
        open: @escaping Open
    ) async throws -> any Channel {
        let opened = eventLoop.makePromise(of: String.self)
        // Over HTTP/2: the connection's stream multiplexer, set as the connection is installed.
        let multiplexer = NIOLoopBoundBox<NIOHTTP2Handler.StreamMultiplexer?>.makeEmptyBox(
            valueType: NIOHTTP2Handler.StreamMultiplexer.self,
            eventLoop: eventLoop
        )
        // Later POST connections (after an idle one closed) get the connect timeout afresh;
        // over HTTP/2 each POST is a new stream of the connection.
        let openPost: HTTPStreamClientHandler.OpenPostConnection = { stream in
            @Sendable func openOnLoop() -> EventLoopFuture<any Channel> {
                if let multiplexer = multiplexer.value {
                    return Self.openStream(on: multiplexer, eventLoop: eventLoop) { HTTPStreamPostHandler(stream: stream) }
                }
                return eventLoop.makeFutureWithTask {
                    try await Self.openPostConnection(deadline: .now() + TimeAmount(timeout), stream: stream, open: open)
                }
            }
            // The stream's handler asks on the loop: an HTTP/2 stream then opens at once.
            return eventLoop.inEventLoop ? openOnLoop() : eventLoop.flatSubmit(openOnLoop)
        }
        let makeHandler = { @Sendable (onePOSTPerConnection: Bool) in
            HTTPStreamClientHandler(
                endpoint: endpoint,
                deadline: deadline,
                opened: opened,
                onePOSTPerConnection: onePOSTPerConnection,
                openPostConnection: openPost
            )
        }
        let connection: any Channel
        do {
            connection = try await open(deadline) { channel, alpn in
                guard alpn == TLSApplicationProtocols.http2 else {
                    try channel.pipeline.syncOperations.addHTTPClientHandlers()
                    try channel.pipeline.syncOperations.addHandler(makeHandler(false))
                    return
                }
                multiplexer.value = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                    mode: .client,
                    connectionConfiguration: HTTPStreamBinding.http2Connection,
                    streamConfiguration: HTTPStreamBinding.http2Stream,
                    inboundStreamInitializer: { pushed in pushed.close() }  // no server push here
                )
            }
        } catch {
            opened.fail(error)
            throw error
        }
        let stream: any Channel
        if let multiplexer = try await eventLoop.submit({ multiplexer.value }).get() {
            // HTTP/2: the GET is a stream of the connection, which closes with it.
            do {
                stream = try await Self.openStream(on: multiplexer, eventLoop: eventLoop) { makeHandler(true) }.get()
                stream.closeFuture.whenComplete { _ in connection.close(promise: nil) }
            } catch {
                opened.fail(error)
                connection.close(promise: nil)
                throw error
            }
        } else {
            stream = connection
        }
        do {
            _ = try await opened.futureResult.get()
            let handler = try await eventLoop.submit {
                NIOLoopBound(try stream.pipeline.syncOperations.handler(type: HTTPStreamClientHandler.self), eventLoop: eventLoop)
            }.get()
            let post = try await openPost(handler).get()
            try await eventLoop.submit {
                guard stream.isActive else {
                    post.close(promise: nil)
                    throw TransportError(code: .httpStreamFailed, message: "\(endpoint) closed the HTTP stream as it started")
                }
                try initializer(stream, .byteStream)
                let context = try stream.pipeline.syncOperations.context(handlerType: HTTPStreamClientHandler.self)
                handler.value.start(post: post, context: context)
            }.get()
        } catch {
            stream.close(promise: nil)
            throw error
        }
        return stream
    }

    private static func openPostConnection(
        deadline: NIODeadline,
        stream: NIOLoopBound<HTTPStreamClientHandler>,
        open: Open
    ) async throws -> any Channel {
        try await open(deadline) { channel, _ in
            try channel.pipeline.syncOperations.addHTTPClientHandlers()
            try channel.pipeline.syncOperations.addHandler(HTTPStreamPostHandler(stream: stream))
        }
    }

    /// A new HTTP/2 stream of the connection, speaking HTTP/1-shaped parts to `handler`'s result.
    private static func openStream<Handler: ChannelHandler>(
        on multiplexer: NIOHTTP2Handler.StreamMultiplexer,
        eventLoop: any EventLoop,
        handler: @escaping @Sendable () -> Handler
    ) -> EventLoopFuture<any Channel> {
        let promise = eventLoop.makePromise(of: (any Channel).self)
        multiplexer.createStreamChannel(promise: promise) { child in
            child.eventLoop.makeCompletedFuture {
                try child.pipeline.syncOperations.addHandler(HTTP2FramePayloadToHTTP1ClientCodec(httpProtocol: .https))
                try child.pipeline.syncOperations.addHandler(handler())
            }
        }
        return promise.futureResult
    }
}
