import NIOConcurrencyHelpers

/// Counts free slots; `acquire` suspends while none is free.
final class AsyncSemaphore: Sendable {
    private struct State {
        var permits: Int
        var waiters: [(id: Int, continuation: CheckedContinuation<Void, any Error>)] = []
        var nextID = 0
    }

    private let state: NIOLockedValueBox<State>

    init(permits: Int) {
        self.state = NIOLockedValueBox(State(permits: permits))
    }

    /// Takes a slot, waiting for one if necessary.
    /// - Throws: `CancellationError` if the task is cancelled while waiting.
    func acquire() async throws {
        let acquired = self.state.withLockedValue { state in
            guard state.permits > 0 else { return false }
            state.permits -= 1
            return true
        }
        if acquired { return }
        let id = self.state.withLockedValue { state in
            defer { state.nextID += 1 }
            return state.nextID
        }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let outcome: Result<Void, any Error>? = self.state.withLockedValue { state in
                    if Task.isCancelled { return .failure(CancellationError()) }
                    if state.permits > 0 {
                        state.permits -= 1
                        return .success(())
                    }
                    state.waiters.append((id, continuation))
                    return nil
                }
                if let outcome { continuation.resume(with: outcome) }
            }
        } onCancel: {
            let waiter = self.state.withLockedValue { state -> CheckedContinuation<Void, any Error>? in
                guard let index = state.waiters.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiters.remove(at: index).continuation
            }
            waiter?.resume(throwing: CancellationError())
        }
    }

    /// Gives a slot back, waking the oldest waiter.
    func release() {
        let waiter = self.state.withLockedValue { state -> CheckedContinuation<Void, any Error>? in
            if state.waiters.isEmpty {
                state.permits += 1
                return nil
            }
            return state.waiters.removeFirst().continuation
        }
        waiter?.resume()
    }
}
