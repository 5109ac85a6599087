import NIOConcurrencyHelpers

/// The requests of one connection that were forwarded to the application and not yet settled.
///
/// The protocol handler owns it: it adds a request when it forwards it, and settles it (removes
/// it and cancels its handler) when the answer is written, when the client's CANCEL arrives,
/// when the deadline passes, or when the connection closes. The application layer looks a
/// request up when a handler slot is free; a request settled while it waited (answered by its
/// deadline, or cancelled) is not run at all.
///
/// Cancellation thus never waits behind other frames: a connection whose handler slots are all
/// busy still stops the handlers whose deadline passed or that the client cancelled.
final class RequestRegistry: Sendable {
    private let signals = NIOLockedValueBox<[UInt64: RequestSignal]>([:])

    /// A request was forwarded.
    func add(_ id: UInt64) {
        self.signals.withLockedValue { $0[id] = RequestSignal() }
    }

    /// The signal of a request about to run, or `nil` if it was settled meanwhile.
    func signal(for id: UInt64) -> RequestSignal? {
        self.signals.withLockedValue { $0[id] }
    }

    /// The request is answered, cancelled or past its deadline: forget it and stop its handler.
    func settle(_ id: UInt64) {
        self.signals.withLockedValue { $0.removeValue(forKey: id) }?.cancel()
    }

    /// The connection closed: stop every handler.
    func settleAll() {
        let all = self.signals.withLockedValue { signals in
            defer { signals.removeAll() }
            return Array(signals.values)
        }
        for signal in all { signal.cancel() }
    }

    /// The number of requests forwarded and not yet settled.
    var count: Int { self.signals.withLockedValue { $0.count } }
}
