import NIOConcurrencyHelpers
import NIOCore

/// Holds a reliable session's message handlers, which run one after another, to the gateway's
/// handler time limit: the task running a handler past its deadline is cancelled.
///
/// One timer on the event loop serves every handler: it is armed when a handler starts and none
/// is armed, and when it fires it either times out the running handler or re-arms itself for
/// that handler's deadline. A batch of messages thus costs no timer per message (a sleeping
/// task per handler cost a Dispatch timer, and a wake-up of its thread, each).
final class HandlerWatchdog: Sendable {
    /// The task running a handler. It is only touched under the lock, and only while
    /// `State.running` holds it: ``run(_:)`` sets it before the handler starts and clears it
    /// (under the lock) before the task can end, so the task is alive whenever it is cancelled.
    private struct RunningTask: @unchecked Sendable {
        let task: UnsafeCurrentTask
    }

    private struct Running {
        var task: RunningTask
        var deadline: NIODeadline
        var timedOut = false
    }

    private struct State {
        var running: Running?
        /// Whether a timer is scheduled; it finds whatever handler runs when it fires.
        var armed = false
    }

    private let eventLoop: any EventLoop
    private let limit: TimeAmount
    private let state = NIOLockedValueBox(State())

    /// - Parameters:
    ///   - eventLoop: Where the timer runs, and the clock (the connection's event loop).
    ///   - limit: The longest a handler may run.
    init(eventLoop: any EventLoop, limit: TimeAmount) {
        self.eventLoop = eventLoop
        self.limit = limit
    }

    /// Runs `body` in the calling task, and cancels that task if `body` is still running when
    /// the limit passes. Calls must not overlap.
    /// - Returns: What `body` returned, or `nil` if it ran past the limit (whatever it returned).
    func run<Result: Sendable>(_ body: () async -> Result) async -> Result? {
        let deadline = self.eventLoop.now + self.limit
        let arm = withUnsafeCurrentTask { task -> Bool in
            guard let task else { return false }
            return self.state.withLockedValue { state in
                precondition(state.running == nil, "HandlerWatchdog.run calls overlap")
                state.running = Running(task: RunningTask(task: task), deadline: deadline)
                defer { state.armed = true }
                return !state.armed
            }
        }
        if arm { self.schedule(at: deadline) }
        let result = await body()
        let timedOut = self.state.withLockedValue { state in
            defer { state.running = nil }
            return state.running?.timedOut ?? false
        }
        return timedOut ? nil : result
    }

    private func schedule(at deadline: NIODeadline) {
        self.eventLoop.scheduleTask(deadline: deadline) { self.fire() }
    }

    private func fire() {
        let next: NIODeadline? = self.state.withLockedValue { state in
            guard var running = state.running, !running.timedOut else {
                state.armed = false  // the next handler to start arms it again
                return nil
            }
            guard running.deadline <= self.eventLoop.now else { return running.deadline }
            running.timedOut = true
            running.task.task.cancel()
            state.running = running
            state.armed = false
            return nil
        }
        if let next { self.schedule(at: next) }
    }
}
