public import NIOCore

extension NIOLoopBound {
    /// Runs `body` with the value on its event loop: at once for a caller already there, else
    /// queued on the loop.
    ///
    /// ```swift
    /// handler.execute { $0.cancelRequest(id: id) }
    /// ```
    @inlinable
    package func execute(_ body: @escaping @Sendable (Value) -> Void) {
        self.execute(passing: body) { value, body in body(value) }
    }

    /// Runs `body` with the value and `argument` on its event loop: at once for a caller
    /// already there, making no closure if `body` captures nothing (what it needs comes in
    /// `argument`); else queued on the loop.
    ///
    /// ```swift
    /// handler.execute(passing: (id, response)) { $0.handlerFinished($1.0, response: $1.1) }
    /// ```
    @inlinable
    package func execute<Argument: Sendable>(passing argument: Argument, _ body: @escaping @Sendable (Value, Argument) -> Void) {
        if self.eventLoop.inEventLoop {
            body(self.value, argument)
        } else {
            self.eventLoop.execute { body(self.value, argument) }
        }
    }
}
