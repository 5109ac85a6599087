import NIOCore
import NIOHTTP1
import TetherCore

/// Opens the client's end of an HTTP stream over connections a transport makes: the stream's
/// GET on one, POSTs on another (PROTOCOL.md, section 11.5).
enum HTTPStreamConnector {
    /// Opens a connection (through a proxy, with TLS, as the transport does) by the deadline
    /// and calls `install` on its event loop once it carries HTTP.
    typealias Open =
        @Sendable (_ deadline: NIODeadline, _ install: @escaping @Sendable (any Channel) throws -> Void) async throws -> any Channel

    /// Opens the stream, waits for its session token, opens the POST connection, then
    /// installs the Tether handler through `initializer` on the stream's connection.
    /// - Returns: The stream's connection; closing it closes the POST connection too.
    static func connect(
        to endpoint: Endpoint,
        deadline: NIODeadline,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel, Framing) throws -> Void,
        open: @escaping Open
    ) async throws -> any Channel {
        let opened = eventLoop.makePromise(of: String.self)
        // Later POST connections (after an idle one closed) get the connect timeout afresh.
        let openPost: HTTPStreamClientHandler.OpenPostConnection = { stream in
            eventLoop.makeFutureWithTask {
                try await Self.openPostConnection(deadline: .now() + TimeAmount(timeout), stream: stream, open: open)
            }
        }
        let stream: any Channel
        do {
            stream = try await open(deadline) { channel in
                try channel.pipeline.syncOperations.addHTTPClientHandlers()
                try channel.pipeline.syncOperations.addHandler(
                    HTTPStreamClientHandler(endpoint: endpoint, deadline: deadline, opened: opened, openPostConnection: openPost)
                )
            }
        } catch {
            opened.fail(error)
            throw error
        }
        do {
            _ = try await opened.futureResult.get()
            let handler = try await eventLoop.submit {
                NIOLoopBound(try stream.pipeline.syncOperations.handler(type: HTTPStreamClientHandler.self), eventLoop: eventLoop)
            }.get()
            let post = try await Self.openPostConnection(deadline: deadline, stream: handler, open: open)
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
        try await open(deadline) { channel in
            try channel.pipeline.syncOperations.addHTTPClientHandlers()
            try channel.pipeline.syncOperations.addHandler(HTTPStreamPostHandler(stream: stream))
        }
    }
}
