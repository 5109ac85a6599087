import NIOConcurrencyHelpers

/// At most `limit` calls under way; the others wait, in order, for a slot (or until their
/// task is cancelled).
final class CallSlots: Sendable {
    private struct State {
        var free: Int
        var waiters: [(id: UInt64, continuation: CheckedContinuation<Void, any Error>)] = []
        var nextID: UInt64 = 0
    }

    private let state: NIOLockedValueBox<State>

    init(_ limit: Int) {
        self.state = NIOLockedValueBox(State(free: limit))
    }

    /// Takes a slot, waiting for one if none is free.
    /// - Throws: `CancellationError` if the task is cancelled while it waits.
    func acquire() async throws {
        let id: UInt64? = self.state.withLockedValue { state in
            if state.free > 0 {
                state.free -= 1
                return nil
            }
            state.nextID += 1
            return state.nextID
        }
        guard let id else { return }
        try await withTaskCancellationHandler {
            try await withCheckedThrowingContinuation { continuation in
                let cancelled = self.state.withLockedValue { state -> Bool in
                    if Task.isCancelled { return true }
                    state.waiters.append((id, continuation))
                    return false
                }
                if cancelled { continuation.resume(throwing: CancellationError()) }
            }
        } onCancel: {
            let waiter = self.state.withLockedValue { state in
                state.waiters.firstIndex { $0.id == id }.map { state.waiters.remove(at: $0).continuation }
            }
            waiter?.resume(throwing: CancellationError())
        }
    }

    /// Gives a slot back: to the first waiter, if any.
    func release() {
        let next = self.state.withLockedValue { state -> CheckedContinuation<Void, any Error>? in
            guard !state.waiters.isEmpty else {
                state.free += 1
                return nil
            }
            return state.waiters.removeFirst().continuation
        }
        next?.resume()
    }

    /// How many calls wait for a slot.
    var waiting: Int { self.state.withLockedValue { $0.waiters.count } }
}
