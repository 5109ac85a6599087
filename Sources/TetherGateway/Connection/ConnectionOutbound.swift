import NIOCore
import TetherCore

/// How a connection's tasks (request handlers, the handshake, reliable delivery) reach its
/// handler: every call runs on the connection's event loop, at once if the task already runs
/// there (the default execution), else queued on it.
struct ConnectionOutbound: Sendable {
    let handler: NIOLoopBound<GatewayConnectionHandler>

    var eventLoop: any EventLoop { self.handler.eventLoop }

    /// Runs `body` with the handler on its event loop.
    func execute(_ body: @escaping @Sendable (GatewayConnectionHandler) -> Void) {
        if self.handler.eventLoop.inEventLoop {
            body(self.handler.value)
        } else {
            let handler = self.handler
            self.handler.eventLoop.execute { body(handler.value) }
        }
    }

    /// Writes a frame without waiting for it to be written (a MESSAGE_ACK, whose loss with the
    /// connection is the client's to notice).
    func send(_ payload: Frame.Payload) {
        self.execute { $0.send(payload) }
    }

    /// Writes frames in order, with one flush, and returns once the last was written.
    /// - Throws: `ChannelError.ioOnClosedChannel` once the connection closed.
    func write(contentsOf payloads: [Frame.Payload]) async throws {
        let written = self.handler.eventLoop.makePromise(of: Void.self)
        self.execute { $0.send(contentsOf: payloads, promise: written) }
        try await written.futureResult.get()
    }

    /// Runs `body` in a task of its own, held to the gateway's handler time limit by the
    /// connection's timer: past the limit, the task is cancelled.
    /// - Returns: What `body` returned, or `nil` if it ran past the limit (or the connection
    ///   closed meanwhile).
    func withTimeLimit<Result: Sendable>(
        executor: (any TaskExecutor)?,
        _ body: @escaping @Sendable () async -> Result
    ) async -> Result? {
        let task = Task(executorPreference: executor) { await body() }
        let token = await self.onLoop { handler in
            handler.startTimeLimit { task.cancel() }
        }
        let result = await task.value
        guard let token, let timedOut = await self.onLoop({ handler in handler.endTimeLimit(token) }) else {
            return nil  // the event loop is gone, and the connection with it
        }
        return timedOut ? nil : result
    }

    /// Runs `body` on the event loop and returns its value: without a hop from a task on the
    /// connection's loop. `nil` if the loop no longer runs.
    private func onLoop<T: Sendable>(_ body: @escaping @Sendable (GatewayConnectionHandler) -> T) async -> T? {
        if self.handler.eventLoop.inEventLoop { return body(self.handler.value) }
        let handler = self.handler
        return try? await self.handler.eventLoop.submit { body(handler.value) }.get()
    }
}
