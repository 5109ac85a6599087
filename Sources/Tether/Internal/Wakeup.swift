import TetherNIO

/// A one-shot signal that interrupts the run loop's backoff sleep (for example on shutdown).
///
/// A signal sent while nobody waits is kept for the next ``wait()``.
final class Wakeup: Sendable {
    private enum State {
        case idle
        case waiting(CheckedContinuation<Void, Never>)
        case signalled
    }

    private let state = TetherLock(State.idle)

    /// Returns when signalled or when the task is cancelled.
    func wait() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow: Bool = self.state.withLockedValue { state in
                    if case .signalled = state {
                        state = .idle
                        return true
                    }
                    if Task.isCancelled { return true }
                    state = .waiting(continuation)
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            self.resumeWaiter()
        }
    }

    /// Wakes the waiter, or the next one to wait.
    func signal() {
        let waiter: CheckedContinuation<Void, Never>? = self.state.withLockedValue { state in
            if case .waiting(let continuation) = state {
                state = .idle
                return continuation
            }
            state = .signalled
            return nil
        }
        waiter?.resume()
    }

    /// Forgets a signal that nobody waited for.
    func reset() {
        self.state.withLockedValue { state in
            if case .signalled = state { state = .idle }
        }
    }

    private func resumeWaiter() {
        let waiter: CheckedContinuation<Void, Never>? = self.state.withLockedValue { state in
            guard case .waiting(let continuation) = state else { return nil }
            state = .idle
            return continuation
        }
        waiter?.resume()
    }
}
