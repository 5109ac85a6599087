import TetherNIO

/// Counts what ``Gateway/run()`` must wait for before it returns: the listener, and each
/// connection until it closed and its last task (a handshake, a request's handler, the loops of
/// reliable delivery) ended.
///
/// Connections are not tasks: an idle connection is served by its channel handler alone, and a
/// task exists only while there is work. Each connection counts its own tasks (in its state
/// machine, on its event loop), and leaves this counter once they are all done: this counter is
/// what lets `run()` still end only when everything it started has ended.
final class ActivityTracker: Sendable {
    private struct State {
        var active = 0
        var waiters: [CheckedContinuation<Void, Never>] = []
    }

    private let state = TetherLock(State())

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

    /// How many callers of ``finished()`` wait.
    var waiting: Int { self.state.withLockedValue { $0.waiters.count } }
}
