import NIOConcurrencyHelpers
import Testing

@testable import TetherGateway

@Suite("Activity tracker")
struct ActivityTrackerTests {
    @Test("finished() returns once everything that entered has left, and at once when nothing is active")
    func waitsForEverything() async {
        let tracker = ActivityTracker()
        await tracker.finished()  // nothing active
        tracker.enter()
        tracker.enter()
        let done = NIOLockedValueBox(false)
        let waiter = Task {
            await tracker.finished()
            done.withLockedValue { $0 = true }
        }
        tracker.leave()
        try? await Task.sleep(for: .milliseconds(50))
        #expect(!done.withLockedValue { $0 }, "one is still active")
        tracker.leave()
        await waiter.value
        #expect(done.withLockedValue { $0 } && tracker.active == 0)
    }
}
