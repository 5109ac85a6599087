import TetherCore

/// What one connection (or one HTTP/2 stream) is told by its loop's ``IntakeMonitor``.
package protocol BudgetAccountOwner: AnyObject {
    /// The budget has room again: a connection that paused its reads reads on.
    func budgetHasRoom()
    /// A body (a frame, a message, a POST) has been arriving for longer than the body timeout,
    /// or has been paused by an exhausted budget that long: refuse it and close.
    func bodyTimedOut()
}

/// What one connection holds of the gateway's ``MemoryBudget``, kept on the connection's event
/// loop and published to the budget once per read.
///
/// The connection sets what it holds (``hold(_:inProgress:)``) as often as it likes (a plain
/// store), and calls ``publish()`` at the end of each read or flush: one atomic addition of the
/// difference. A connection that holds bytes of a body that has not fully arrived ("in
/// progress") is watched by the loop's monitor: that body must arrive within the body timeout.
///
/// ```swift
/// self.account.hold(self.reader.bufferedBytes, inProgress: self.reader.hasPartialFrame)
/// self.account.publish()
/// if self.account.shouldPause { /* hold the next read; the monitor calls budgetHasRoom() */ }
/// ```
package final class BudgetAccount {
    private let monitor: IntakeMonitor
    package private(set) weak var owner: (any BudgetAccountOwner)?
    /// What the connection holds now.
    package private(set) var held = 0
    /// What the budget counts for it.
    private var published = 0
    /// Since when a body has been arriving, if one is.
    private var inProgressSince: TetherInstant?
    /// Since when its reads have been paused until the budget has room, if they are.
    private var pausedSince: TetherInstant?
    /// Whether its reads are paused until the budget has room.
    package var isPaused: Bool { self.pausedSince != nil }
    /// Since when it has been holding up a body, arriving or paused: what the body timeout runs from.
    var watchedSince: TetherInstant? {
        switch (self.inProgressSince, self.pausedSince) {
        case (let arriving?, let paused?): min(arriving, paused)
        case (let since?, nil), (nil, let since?): since
        case (nil, nil): nil
        }
    }
    private var closed = false

    init(monitor: IntakeMonitor, owner: any BudgetAccountOwner) {
        self.monitor = monitor
        self.owner = owner
    }

    /// The gateway's budget.
    package var budget: MemoryBudget { self.monitor.budget }

    /// Sets what the connection holds, and whether part of it is a body still arriving.
    package func hold(_ bytes: Int, inProgress: Bool) {
        guard !self.closed else { return }
        self.held = max(0, bytes)
        if inProgress, self.inProgressSince == nil {
            self.inProgressSince = self.monitor.now
            self.monitor.watch(self)
        } else if !inProgress, self.inProgressSince != nil {
            self.inProgressSince = nil
            if self.pausedSince == nil { self.monitor.unwatch(self) }
        }
    }

    /// Tells the budget what the connection holds now.
    package func publish() {
        guard self.held != self.published else { return }
        self.monitor.budget.add(self.held - self.published)
        self.published = self.held
    }

    /// Whether the connection should pause its reads: it holds bytes and the budget is exhausted.
    package var shouldPause: Bool { self.held > 0 && self.monitor.budget.isExhausted }

    /// The connection paused its reads for the budget: the monitor calls ``BudgetAccountOwner/budgetHasRoom()``
    /// once there is room (and, past the body timeout, ``BudgetAccountOwner/bodyTimedOut()``).
    package func paused() {
        guard !self.closed, self.pausedSince == nil else { return }
        // Waiting for room counts against the body timeout too: a peer cannot hold its bytes
        // in the budget for longer by making it full.
        self.pausedSince = self.monitor.now
        self.monitor.paused(self)
    }

    /// The monitor let it read again.
    func resumed() {
        self.pausedSince = nil
        if self.inProgressSince == nil { self.monitor.unwatch(self) }
    }

    /// The connection is gone: it holds nothing any more.
    package func close() {
        guard !self.closed else { return }
        self.held = 0
        self.publish()
        self.closed = true
        self.inProgressSince = nil
        self.pausedSince = nil
        self.monitor.forget(self)
    }

    deinit {
        // An account dropped without close(): give its bytes back all the same.
        if !self.closed { self.monitor.budget.add(-self.published) }
    }
}

@available(*, unavailable)
extension BudgetAccount: Sendable {}
