import Logging
import NIOCore
import TetherCore
import TetherNIO

// The connection's share of the gateway's memory budget: what it holds (bytes read and not
// decoded, reliable messages waiting, what its client does not read), published once per read;
// its reads paused while the budget is exhausted; a frame that takes too long refused.
extension GatewayConnectionHandler: BudgetAccountOwner {
    /// Tells the budget what the connection holds now: called at the end of each read, and when
    /// the channel's writability changes. A frame read in part (the reader needs more bytes, it
    /// does not hold them back itself) is a body in progress, under the body timeout.
    func publishHoldings() {
        guard let account = self.account else { return }
        var held = self.io.bufferedBytes + self.machine.reliableBytesWaiting
        if !self.io.isWritable, let queued = try? self.context?.channel.syncOptions?.getOption(.bufferedWritableBytes) {
            held += queued
        }
        account.hold(held, inProgress: self.io.hasBufferedBytes && !self.machine.holdsReads && !self.machine.isClosing)
        account.publish()
    }

    /// Pauses the connection's reads if it holds bytes while the budget is exhausted.
    /// - Returns: Whether its reads are paused for the budget.
    func pausesForBudget() -> Bool {
        if self.budgetPaused { return true }
        guard let account = self.account, account.shouldPause else { return false }
        self.budgetPaused = true
        account.paused()
        self.services.metrics.budgetPauses.increment()
        return true
    }

    func budgetHasRoom() {
        self.budgetPaused = false
        self.resumeReading()
    }

    func bodyTimedOut() {
        guard self.context != nil, !self.machine.isClosing else { return }
        let timeout = self.services.configuration.timeouts.body
        let message =
            self.budgetPaused
            ? "the gateway's memory budget stayed full for \(timeout) while this connection held a frame; try again later"
            : "a frame took longer than \(timeout) to arrive"
        self.logger.info("closing a connection whose frame does not arrive", metadata: ["reason": "\(message)"])
        self.services.metrics.refused(self.budgetPaused ? "memory" : "body_timeout")
        self.writeAndClose(
            .error(Frame.ErrorReport(code: .resourceExhausted, message: message)),
            settle: self.machine.startClosing(writingLastFrame: true, now: self.services.clock.now)
        )
    }
}
