import NIOConcurrencyHelpers

/// The requests of one connection that were forwarded to the application and not yet settled.
///
/// The protocol handler owns it: it adds a request when it forwards it, and settles it (removes
/// it, cancelling its handler's task if it runs) when the answer is written, when the client's
/// CANCEL arrives, when the deadline passes, or when the connection closes. The application
/// layer runs a handler through ``run(_:_:)`` once a handler slot is free; a request settled
/// while it waited (answered by its deadline, or cancelled) is not run at all.
///
/// Cancellation thus never waits behind other frames, and needs no watchdog task per request:
/// settling cancels the handler's task directly.
final class RequestRegistry: Sendable {
    private enum Entry {
        /// Forwarded; its handler has not started, or has returned and its answer is on its way.
        case waiting
        /// Its handler runs in this task.
        case running(RunningTask)
    }

    /// The task running a handler. It is only touched under the lock, and only while the entry
    /// says `running`: ``run(_:_:)`` sets that before the handler starts and clears it (under
    /// the lock) before its task can end, so the task is alive whenever ``settle(_:)`` cancels it.
    private struct RunningTask: @unchecked Sendable {
        let task: UnsafeCurrentTask
    }

    private let entries = NIOLockedValueBox<[UInt64: Entry]>([:])

    /// A request was forwarded.
    func add(_ id: UInt64) {
        self.entries.withLockedValue { $0[id] = .waiting }
    }

    /// Whether the request is still waiting to be answered (not settled meanwhile).
    func isPending(_ id: UInt64) -> Bool {
        self.entries.withLockedValue { $0[id] != nil }
    }

    /// Runs a request's handler in the calling task, which settling the request cancels.
    /// - Returns: What `body` returned, or `nil` if the request was settled before it could start.
    func run<Result: Sendable>(_ id: UInt64, _ body: @Sendable () async -> Result) async -> Result? {
        let started = withUnsafeCurrentTask { task -> Bool in
            guard let task else { return false }
            return self.entries.withLockedValue { entries in
                guard entries[id] != nil else { return false }
                entries[id] = .running(RunningTask(task: task))
                return true
            }
        }
        guard started else { return nil }
        let result = await body()
        self.entries.withLockedValue { entries in
            if case .running = entries[id] { entries[id] = .waiting }
        }
        return result
    }

    /// The request is answered, cancelled or past its deadline: forget it and stop its handler.
    func settle(_ id: UInt64) {
        self.entries.withLockedValue { entries in
            if case .running(let running) = entries.removeValue(forKey: id) {
                running.task.cancel()
            }
        }
    }

    /// The connection closed: stop every handler.
    func settleAll() {
        self.entries.withLockedValue { entries in
            for case .running(let running) in entries.values {
                running.task.cancel()
            }
            entries.removeAll()
        }
    }

    /// The number of requests forwarded and not yet settled.
    var count: Int { self.entries.withLockedValue { $0.count } }
}
