import TetherNIO

/// Runs `body` in a task of its own and returns what it returns, unless the calling task is
/// cancelled first (`CancellationError`) or `timeout` passes first (the error `timedOut` makes):
/// then the task is cancelled and left to end on its own.
///
/// For work that may not end when asked to: PostgresNIO does not end a query it has sent when
/// the querying task is cancelled, and one on a connection closed or dropped under it was seen
/// never to end. A store operation with a deadline and a node leaving its cluster must not wait
/// for such a query (it keeps its connection until it ends, if it ever does).
///
/// ```swift
/// let rows = try await abandonable(timeout: .seconds(5), timedOut: { StoreTimeout() }) {
///     try await client.rows("SELECT 1", logger: logger)
/// }
/// ```
///
/// - Parameters:
///   - timeout: How long to wait for `body`; `nil` waits until it ends or the caller is cancelled.
///   - timedOut: The error thrown when `timeout` passes first.
///   - body: The work, run in a task of its own.
func abandonable<T: Sendable>(
    timeout: Duration? = nil,
    timedOut: @escaping @Sendable () -> any Error = { CancellationError() },
    _ body: @escaping @Sendable () async throws -> T
) async throws -> T {
    let waiter = TetherLock(AbandonableWaiter<T>())
    return try await withTaskCancellationHandler {
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<T, any Error>) in
            guard waiter.withLockedValue({ $0.wait(continuation) }) else {
                continuation.resume(throwing: CancellationError())  // cancelled before it waited
                return
            }
            let work = Task {
                let result = await Result { try await body() }
                let (continuation, timer) = waiter.withLockedValue { $0.end() }
                timer?.cancel()
                continuation?.resume(with: result)
            }
            let timer = timeout.map { timeout in
                Task {
                    guard (try? await Task.sleep(for: timeout)) != nil else { return }
                    let (continuation, work) = waiter.withLockedValue { $0.timeOut() }
                    work?.cancel()
                    continuation?.resume(throwing: timedOut())
                }
            }
            // Settled before the tasks were recorded: they are this call's to stop.
            switch waiter.withLockedValue({ $0.started(work: work, timer: timer) }) {
            case .recorded: break
            case .ended: timer?.cancel()
            case .abandoned:
                timer?.cancel()
                work.cancel()
            }
        }
    } onCancel: {
        let (continuation, work, timer) = waiter.withLockedValue { $0.cancel() }
        work?.cancel()
        timer?.cancel()
        continuation?.resume(throwing: CancellationError())
    }
}

/// The caller of ``abandonable(timeout:timedOut:_:)``: resumed once, by the body's end, the
/// timeout or cancellation, whichever comes first.
private struct AbandonableWaiter<T: Sendable> {
    private enum Phase {
        case idle
        case waiting(CheckedContinuation<T, any Error>)
        case ended
        case abandoned
    }

    private var phase = Phase.idle
    private var work: Task<Void, Never>?
    private var timer: Task<Void, Never>?

    enum Started { case recorded, ended, abandoned }

    /// Waits with `continuation`; false if the caller was cancelled already.
    mutating func wait(_ continuation: CheckedContinuation<T, any Error>) -> Bool {
        guard case .idle = self.phase else { return false }
        self.phase = .waiting(continuation)
        return true
    }

    /// Records the tasks, unless it was settled already (they are then the caller's to stop).
    mutating func started(work: Task<Void, Never>, timer: Task<Void, Never>?) -> Started {
        switch self.phase {
        case .waiting:
            (self.work, self.timer) = (work, timer)
            return .recorded
        case .ended: return .ended
        case .idle, .abandoned: return .abandoned
        }
    }

    /// The body ended: the continuation to resume, if it still waits, and the timer to stop.
    mutating func end() -> (CheckedContinuation<T, any Error>?, Task<Void, Never>?) {
        guard case .waiting(let continuation) = self.phase else { return (nil, nil) }
        self.phase = .ended
        defer { (self.work, self.timer) = (nil, nil) }
        return (continuation, self.timer)
    }

    /// The timeout passed: the continuation to resume, if it still waits, and the body to cancel.
    mutating func timeOut() -> (CheckedContinuation<T, any Error>?, Task<Void, Never>?) {
        guard case .waiting(let continuation) = self.phase else { return (nil, nil) }
        self.phase = .abandoned
        defer { (self.work, self.timer) = (nil, nil) }
        return (continuation, self.work)
    }

    /// The caller was cancelled: the continuation to resume, if it waits, and the tasks to cancel.
    mutating func cancel() -> (CheckedContinuation<T, any Error>?, Task<Void, Never>?, Task<Void, Never>?) {
        switch self.phase {
        case .idle:
            self.phase = .abandoned
            return (nil, nil, nil)
        case .waiting(let continuation):
            self.phase = .abandoned
            defer { (self.work, self.timer) = (nil, nil) }
            return (continuation, self.work, self.timer)
        case .ended, .abandoned:
            return (nil, nil, nil)
        }
    }
}
