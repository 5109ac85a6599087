import TetherNIO

extension Task where Failure == any Error {
    /// The task's value, or `CancellationError` as soon as the calling task is cancelled: the
    /// task is then cancelled too, and left to end on its own.
    ///
    /// For work that may not end when asked to: PostgresNIO does not always answer a query
    /// whose connection is closed under it, and a node leaving its cluster must not wait for it.
    ///
    /// ```swift
    /// let body = Task { try await connection.query("SELECT pg_advisory_lock(1, 2)", logger: logger) }
    /// _ = try await body.valueUnlessCancelled   // cancelled: returns at once
    /// ```
    var valueUnlessCancelled: Success {
        get async throws {
            let waiter = TetherLock(Waiter<Success>.idle)
            return try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Success, any Error>) in
                    let cancelledAlready = waiter.withLockedValue { state -> Bool in
                        guard case .idle = state else { return true }
                        state = .waiting(continuation)
                        return false
                    }
                    if cancelledAlready {
                        continuation.resume(throwing: _Concurrency.CancellationError())
                        return
                    }
                    Task<Void, Never> {
                        let result = await self.result
                        waiter.withLockedValue { $0.take() }?.resume(with: result)
                    }
                }
            } onCancel: {
                self.cancel()
                waiter.withLockedValue { $0.cancel() }?.resume(throwing: _Concurrency.CancellationError())
            }
        }
    }
}

/// Who waits for ``Task/valueUnlessCancelled``: resumed once, by the task's end or by cancellation.
private enum Waiter<Success: Sendable> {
    case idle
    case waiting(CheckedContinuation<Success, any Error>)
    case done

    /// The continuation to resume, if it was not resumed yet.
    mutating func take() -> CheckedContinuation<Success, any Error>? {
        guard case .waiting(let continuation) = self else { return nil }
        self = .done
        return continuation
    }

    /// Cancelled: the continuation to resume, if it waits; else none will wait.
    mutating func cancel() -> CheckedContinuation<Success, any Error>? {
        switch self {
        case .idle:
            self = .done
            return nil
        case .waiting(let continuation):
            self = .done
            return continuation
        case .done:
            return nil
        }
    }
}
