import NIOConcurrencyHelpers

/// Tells a running request's watchdog that the request was settled by the protocol handler
/// (cancelled by the client, or past its deadline, or its connection closed).
///
/// ``wait()`` returns `true` once cancelled, or `false` if the waiting task itself was
/// cancelled (which is how the handler's completion stops the watchdog).
final class RequestSignal: Sendable {
    private enum State {
        case pending
        case waiting(CheckedContinuation<Bool, Never>)
        case cancelled
        case finished
    }

    private let state = NIOLockedValueBox(State.pending)

    /// Whether the request was cancelled.
    var isCancelled: Bool {
        self.state.withLockedValue { state in
            if case .cancelled = state { return true }
            return false
        }
    }

    /// Cancels the request, unless it already finished.
    func cancel() {
        let waiter: CheckedContinuation<Bool, Never>? = self.state.withLockedValue { state in
            switch state {
            case .pending:
                state = .cancelled
                return nil
            case .waiting(let continuation):
                state = .cancelled
                return continuation
            case .cancelled, .finished:
                return nil
            }
        }
        waiter?.resume(returning: true)
    }

    /// Waits until the request is cancelled or the waiting task is.
    func wait() async -> Bool {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let immediate: Bool? = self.state.withLockedValue { state in
                    switch state {
                    case .cancelled:
                        return true
                    case .finished:
                        return false
                    case .pending, .waiting:
                        if Task.isCancelled {
                            state = .finished
                            return false
                        }
                        state = .waiting(continuation)
                        return nil
                    }
                }
                if let immediate { continuation.resume(returning: immediate) }
            }
        } onCancel: {
            let waiter: CheckedContinuation<Bool, Never>? = self.state.withLockedValue { state in
                switch state {
                case .waiting(let continuation):
                    state = .finished
                    return continuation
                case .pending:
                    state = .finished
                    return nil
                case .cancelled, .finished:
                    return nil
                }
            }
            waiter?.resume(returning: false)
        }
    }
}
