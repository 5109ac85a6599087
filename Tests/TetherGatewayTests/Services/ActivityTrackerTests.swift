import NIOConcurrencyHelpers
import Testing
import TetherTestSupport

@testable import TetherGateway

@Suite("Activity tracker")
struct ActivityTrackerTests {
    @Test("finished() returns once everything that entered has left, and at once when nothing is active")
    func waitsForEverything() async throws {
        let tracker = ActivityTracker()
        await tracker.finished()  // nothing active
        tracker.enter()
        tracker.enter()
        let done = NIOLockedValueBox(false)
        let waiter = Task {
            await tracker.finished()
            done.withLockedValue { $0 = true }
        }
        try await eventually("the waiter waits") { tracker.waiting == 1 }
        tracker.leave()
        #expect(tracker.waiting == 1 && !done.withLockedValue { $0 }, "one is still active: the waiter still waits")
        tracker.leave()
        await waiter.value
        #expect(done.withLockedValue { $0 } && tracker.active == 0)
    }
}
