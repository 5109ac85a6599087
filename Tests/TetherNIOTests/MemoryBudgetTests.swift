import NIOCore
import NIOEmbedded
import Testing
import TetherCore
import TetherNIO

/// Records what the monitor tells a connection.
private final class Owner: BudgetAccountOwner {
    var roomCount = 0
    var timedOut = 0
    func budgetHasRoom() { self.roomCount += 1 }
    func bodyTimedOut() { self.timedOut += 1 }
}

/// The memory budget, its accounts and the loop's monitor, on an embedded loop's virtual time.
@Suite("Memory budget")
struct MemoryBudgetTests {
    private func monitor(limit: Int, bodyTimeout: Duration = .seconds(30)) -> (IntakeMonitor, EmbeddedEventLoop) {
        let loop = EmbeddedEventLoop()
        let monitor = IntakeMonitor(
            budget: MemoryBudget(limit: limit),
            bodyTimeout: bodyTimeout,
            clock: EventLoopClock(loop),
            eventLoop: loop
        )
        return (monitor, loop)
    }

    @Test("accounts publish what they hold, once per publish; closing one gives its bytes back")
    func publish() {
        let (monitor, _) = self.monitor(limit: 1000)
        let owners = [Owner(), Owner()]
        let first = monitor.account(for: owners[0])
        let second = monitor.account(for: owners[1])
        first.hold(300, inProgress: false)
        #expect(monitor.budget.usedBytes == 0, "nothing counts before it is published")
        first.publish()
        second.hold(500, inProgress: false)
        second.publish()
        #expect(monitor.budget.usedBytes == 800)
        first.hold(100, inProgress: false)
        first.publish()
        #expect(monitor.budget.usedBytes == 600)
        #expect(!monitor.budget.isExhausted)
        second.hold(649, inProgress: false)
        second.publish()
        #expect(!monitor.budget.isExhausted, "749 of 1,000: below three quarters")
        second.hold(650, inProgress: false)
        second.publish()
        #expect(monitor.budget.isExhausted, "at three quarters: exhausted, the last quarter kept for reads under way")
        #expect(second.shouldPause && first.shouldPause, "every account that holds bytes pauses")
        second.close()
        #expect(monitor.budget.usedBytes == 100)
        first.close()
        #expect(monitor.budget.usedBytes == 0)
    }

    @Test("a paused account is told at the first tick that finds room, not before")
    func pausedUntilRoom() {
        let (monitor, loop) = self.monitor(limit: 1000)
        let waiting = Owner()
        let hog = Owner()
        let paused = monitor.account(for: waiting)
        let full = monitor.account(for: hog)
        full.hold(750, inProgress: false)
        full.publish()
        paused.hold(10, inProgress: false)
        paused.publish()
        #expect(paused.shouldPause)
        paused.paused()
        loop.advanceTime(by: .milliseconds(200))
        #expect(waiting.roomCount == 0, "still full")
        full.hold(0, inProgress: false)
        full.publish()
        loop.advanceTime(by: .milliseconds(50))
        #expect(waiting.roomCount == 1)
        #expect(!paused.isPaused)
        loop.advanceTime(by: .seconds(1))
        #expect(waiting.roomCount == 1, "told once")
        #expect(monitor.watchedCount == 0, "nothing left to watch: the monitor stops ticking")
    }

    @Test("a body in progress longer than the body timeout is refused; one that completes in time is not")
    func bodyTimeout() {
        let (monitor, loop) = self.monitor(limit: 1 << 20, bodyTimeout: .seconds(2))
        let slow = Owner()
        let quick = Owner()
        let trickle = monitor.account(for: slow)
        let burst = monitor.account(for: quick)
        trickle.hold(1, inProgress: true)
        burst.hold(100, inProgress: true)
        loop.advanceTime(by: .seconds(1))
        burst.hold(0, inProgress: false)  // its frame arrived
        for bytes in 2...5 {
            trickle.hold(bytes, inProgress: true)  // a byte more now and then does not reset it
            loop.advanceTime(by: .milliseconds(200))
        }
        #expect(slow.timedOut == 0, "1.8 s in")
        loop.advanceTime(by: .milliseconds(300))
        #expect(slow.timedOut == 1)
        #expect(quick.timedOut == 0)
        loop.advanceTime(by: .seconds(5))
        #expect(slow.timedOut == 1, "told once")
    }

    @Test("time paused for a full budget counts against the body timeout")
    func pausedTooLong() {
        let (monitor, loop) = self.monitor(limit: 100, bodyTimeout: .seconds(1))
        let owner = Owner()
        let account = monitor.account(for: owner)
        account.hold(150, inProgress: false)
        account.publish()
        account.paused()
        loop.advanceTime(by: .milliseconds(1100))
        #expect(owner.timedOut == 1)
        #expect(owner.roomCount == 0)
        account.close()
        #expect(monitor.budget.usedBytes == 0)
    }
}
