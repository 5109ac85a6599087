package import NIOCore
package import TetherCore

/// Watches the connections of one event loop that hold bytes of a body still arriving, or that
/// paused for the gateway's ``MemoryBudget``: one timer for the whole loop, ticking only while
/// there is something to watch.
///
/// - A paused connection is told ``BudgetAccountOwner/budgetHasRoom()`` at the first tick that
///   finds the budget below its limit (in the order they paused).
/// - A body in progress (or paused) for longer than the body timeout is refused:
///   ``BudgetAccountOwner/bodyTimedOut()``. A peer that trickles a frame or a POST body, one
///   byte every few seconds, holds its bytes that long and no longer.
///
/// Everything but ``init(budget:bodyTimeout:clock:eventLoop:)`` runs on its loop.
package final class IntakeMonitor: @unchecked Sendable {
    // Sendable: the mutable state is touched only on `eventLoop`, which every entry point checks.

    /// How often it checks, while it watches anything.
    package static let tick = Duration.milliseconds(50)

    package let budget: MemoryBudget
    /// The longest a body may take to arrive (or be paused).
    package let bodyTimeout: Duration
    private let clock: any TetherClock
    package let eventLoop: any EventLoop
    /// Accounts with a body in progress, or paused.
    private var watched: [ObjectIdentifier: BudgetAccount] = [:]
    /// Paused accounts, in the order they paused.
    private var paused: [BudgetAccount] = []
    private var ticking: ClockCallback?

    /// - Parameters:
    ///   - budget: The gateway's budget.
    ///   - bodyTimeout: The longest a body may take to arrive, or stay paused.
    ///   - clock: The gateway's clock.
    ///   - eventLoop: The loop whose connections it watches.
    package init(budget: MemoryBudget, bodyTimeout: Duration, clock: any TetherClock, eventLoop: any EventLoop) {
        self.budget = budget
        self.bodyTimeout = bodyTimeout
        self.clock = clock
        self.eventLoop = eventLoop
    }

    /// A new account for a connection of this loop.
    package func account(for owner: any BudgetAccountOwner) -> BudgetAccount {
        self.eventLoop.preconditionInEventLoop()
        return BudgetAccount(monitor: self, owner: owner)
    }

    /// Connections watched now (a body in progress, or paused).
    package var watchedCount: Int { self.watched.count }

    var now: TetherInstant { self.clock.now }

    func watch(_ account: BudgetAccount) {
        self.watched[ObjectIdentifier(account)] = account
        self.startTicking()
    }

    func unwatch(_ account: BudgetAccount) {
        self.watched.removeValue(forKey: ObjectIdentifier(account))
    }

    func paused(_ account: BudgetAccount) {
        self.watched[ObjectIdentifier(account)] = account
        self.paused.append(account)
        self.startTicking()
    }

    func forget(_ account: BudgetAccount) {
        self.watched.removeValue(forKey: ObjectIdentifier(account))
        self.paused.removeAll { $0 === account }
    }

    private func startTicking() {
        guard self.ticking == nil else { return }
        self.ticking = self.clock.schedule(at: self.clock.now + Self.tick, on: self.eventLoop) { self.fire() }
    }

    private func fire() {
        self.eventLoop.preconditionInEventLoop()
        self.ticking = nil
        let now = self.clock.now
        if !self.paused.isEmpty, !self.budget.isExhausted {
            var resumed: [BudgetAccount] = []
            swap(&resumed, &self.paused)
            for account in resumed {
                account.resumed()
                account.owner?.budgetHasRoom()
            }
        }
        var late: [BudgetAccount] = []
        for account in self.watched.values {
            if let since = account.watchedSince, now - since >= self.bodyTimeout { late.append(account) }
        }
        for account in late {
            self.forget(account)
            account.owner?.bodyTimedOut()
        }
        if !self.watched.isEmpty || !self.paused.isEmpty { self.startTicking() }
    }
}
