import NIOConcurrencyHelpers

/// Counts what ``Gateway/run()`` must wait for before it returns: the listener, each open
/// connection, and each task the gateway started (a handshake, a request's handler, the loops of
/// reliable delivery).
///
/// Connections are not tasks: an idle connection is served by its channel handlers alone, and
/// a task exists only while there is work. This counter is what lets `run()` still end only
/// when everything it started has ended.
final class ActivityTracker: Sendable {
    private struct State {
        var active = 0
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = NIOLockedValueBox(State())

    /// Something started.
    func enter() {
        self.state.withLockedValue { $0.active += 1 }
    }

    /// Something that called ``enter()`` ended.
    func leave() {
        let waiters = self.state.withLockedValue { state -> [CheckedContinuation<Void, Never>] in
            precondition(state.active > 0, "ActivityTracker.leave() without enter()")
            state.active -= 1
            guard state.active == 0 else { return [] }
            defer { state.waiters.removeAll() }
            return state.waiters
        }
        for waiter in waiters { waiter.resume() }
    }

    /// Starts a task that the gateway waits for.
    /// - Parameters:
    ///   - executor: Where the task runs: a connection's event loop, or `nil` for the global executor.
    ///   - immediately: Run the task on the calling thread until it first suspends (Swift
    ///     6.2's `Task.immediate`), instead of queueing it on `executor` first. Only for a
    ///     caller that is running on `executor`'s thread already.
    ///   - body: The work.
    /// - Returns: The task, to cancel it.
    @discardableResult
    func spawn(
        on executor: (any TaskExecutor)?,
        immediately: Bool = false,
        _ body: @escaping @Sendable () async -> Void
    ) -> Task<Void, Never> {
        self.enter()
        #if compiler(>=6.2)
            if immediately, #available(macOS 26.0, iOS 26.0, tvOS 26.0, watchOS 26.0, *) {
                return Task.immediate(executorPreference: executor) {
                    await body()
                    self.leave()
                }
            }
        #endif
        return Task(executorPreference: executor) {
            await body()
            self.leave()
        }
    }

    /// Returns once nothing is active. Not cancellable: it waits for what is running to end.
    func finished() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let done = self.state.withLockedValue { state -> Bool in
                if state.active == 0 { return true }
                state.waiters.append(continuation)
                return false
            }
            if done { continuation.resume() }
        }
    }

    /// How many things are active.
    var active: Int { self.state.withLockedValue { $0.active } }
}
