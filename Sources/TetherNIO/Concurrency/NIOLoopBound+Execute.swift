package import NIOCore

extension NIOLoopBound {
    /// Runs `body` with the value on its event loop: at once for a caller already there, else
    /// queued on the loop.
    ///
    /// ```swift
    /// handler.execute { $0.cancelRequest(id: id) }
    /// ```
    package func execute(_ body: @escaping @Sendable (Value) -> Void) {
        if self.eventLoop.inEventLoop {
            body(self.value)
        } else {
            self.eventLoop.execute { body(self.value) }
        }
    }
}
