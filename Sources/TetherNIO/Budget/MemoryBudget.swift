import Atomics

/// The bytes a whole gateway lets its peers make it hold: frames read in part, POST bodies
/// arriving, messages reassembled, reliable messages waiting, responses and pushes a client
/// does not read. One per gateway, shared by every connection on every loop.
///
/// Connections count what they hold in a ``BudgetAccount`` and publish it here once per read
/// (one atomic addition of the difference, no lock). While the budget is exhausted, a connection
/// that holds bytes stops reading at the end of its read (TCP and HTTP/2 flow control then slow
/// its peer), new connections are refused, and the ``IntakeMonitor`` of each loop lets the paced
/// connections read again as soon as there is room; a body paced beyond the body timeout is
/// refused.
///
/// The budget counts as exhausted at three quarters of its limit: a connection finds it exhausted
/// only at the end of a read it already made (at most 64 KiB on the gateway's sockets), so the
/// last quarter is kept for the reads already under way when it fills.
///
/// ```swift
/// let budget = MemoryBudget(limit: 512 << 20)
/// if budget.isExhausted { /* pace, refuse */ }
/// ```
package final class MemoryBudget: Sendable {
    /// The most bytes the connections may hold together.
    package let limit: Int
    /// Where it counts as exhausted: three quarters of the limit.
    package let threshold: Int
    private let used = ManagedAtomic<Int>(0)

    /// - Parameter limit: The most bytes the connections may hold together.
    package init(limit: Int) {
        self.limit = limit
        self.threshold = limit - limit / 4
    }

    /// What the connections hold now.
    package var usedBytes: Int { self.used.load(ordering: .relaxed) }

    /// Whether the connections hold three quarters of the limit or more: those holding bytes
    /// pause, and new connections are refused.
    package var isExhausted: Bool { self.used.load(ordering: .relaxed) >= self.threshold }

    /// A connection's holding changed by `delta` bytes.
    func add(_ delta: Int) {
        guard delta != 0 else { return }
        self.used.wrappingIncrement(by: delta, ordering: .relaxed)
    }
}
