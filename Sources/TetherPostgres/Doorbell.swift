import TetherNIO

/// Wakes one waiting loop: ``ring()`` from anywhere, ``wait(upTo:)`` in the loop. A ring while
/// nobody waits is kept for the next wait (several rings count as one).
final class Doorbell: Sendable {
    private struct State {
        var rung = false
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let state = TetherLock(State())

    func ring() {
        let waiter = self.state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
            guard let waiter = state.waiter else {
                state.rung = true
                return nil
            }
            state.waiter = nil
            return waiter
        }
        waiter?.resume()
    }

    /// Returns once rung (or if it was rung since the last wait), after `timeout` at most, or
    /// when the task is cancelled.
    func wait(upTo timeout: Duration) async {
        await withTaskGroup { group in
            group.addTask {
                if (try? await Task.sleep(for: timeout)) != nil { self.ring() }
            }
            await withTaskCancellationHandler {
                await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                    let ready = self.state.withLockedValue { state -> Bool in
                        if state.rung || Task.isCancelled {
                            state.rung = false
                            return true
                        }
                        state.waiter = continuation
                        return false
                    }
                    if ready { continuation.resume() }
                }
            } onCancel: {
                self.ring()
            }
            group.cancelAll()
        }
    }
}
