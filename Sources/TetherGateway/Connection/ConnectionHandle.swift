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

    /// Runs `body` with the handler and `argument` on its event loop: at once for a caller
    /// already there, making no closure if `body` captures nothing (what it needs comes in
    /// `argument`); else queued on the loop.
    ///
    /// ```swift
    /// handle.execute(passing: (id, response)) { $0.handlerFinished($1.0, response: $1.1) }
    /// ```
    func execute<Argument: Sendable>(
        passing argument: Argument,
        _ body: @escaping @Sendable (GatewayConnectionHandler, Argument) -> Void
    ) {
        self.handler.execute(passing: argument, body)
    }

    /// Runs `body` on the event loop and returns its value, without a hop from a task already
    /// on the connection's loop; `nil` if the loop no longer runs.
    func onLoop<T: Sendable>(_ body: @escaping @Sendable (GatewayConnectionHandler) -> T) async -> T? {
        await self.onLoop(passing: body) { handler, body in body(handler) }
    }

    /// ``onLoop(_:)`` with `argument` passed to `body`: a `body` that captures nothing makes no
    /// closure when the caller already runs on the loop.
    func onLoop<Argument: Sendable, T: Sendable>(
        passing argument: Argument,
        _ body: @escaping @Sendable (GatewayConnectionHandler, Argument) -> T
    ) async -> T? {
        if self.handler.eventLoop.inEventLoop { return body(self.handler.value, argument) }
        let handler = self.handler
        return try? await self.handler.eventLoop.submit { body(handler.value, argument) }.get()
    }
}
