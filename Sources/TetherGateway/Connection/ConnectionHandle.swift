import NIOCore

/// How a connection's tasks (the handshake, request handlers, reliable batches) and other event
/// loops reach its handler: every call runs on the connection's event loop, at once if the
/// caller already runs there (the default execution), else queued on it.
struct ConnectionHandle: Sendable {
    let handler: NIOLoopBound<GatewayConnectionHandler>

    init(_ handler: NIOLoopBound<GatewayConnectionHandler>) {
        self.handler = handler
    }

    /// Runs `body` with the handler on its event loop.
    func execute(_ body: @escaping @Sendable (GatewayConnectionHandler) -> Void) {
        self.handler.execute(body)
    }

    /// The handler, for a caller that runs on its event loop; `nil` elsewhere (then use
    /// ``execute(_:)``). Calling it directly makes no closure.
    var onItsLoop: GatewayConnectionHandler? {
        self.handler.eventLoop.inEventLoop ? self.handler.value : nil
    }

    /// Runs `body` on the event loop and returns its value, without a hop from a task already
    /// on the connection's loop; `nil` if the loop no longer runs.
    func onLoop<T: Sendable>(_ body: @escaping @Sendable (GatewayConnectionHandler) -> T) async -> T? {
        if self.handler.eventLoop.inEventLoop { return body(self.handler.value) }
        let handler = self.handler
        return try? await self.handler.eventLoop.submit { body(handler.value) }.get()
    }
}
