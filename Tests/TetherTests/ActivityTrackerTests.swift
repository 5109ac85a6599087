import NIOConcurrencyHelpers
import Testing

@testable import TetherGateway

@Suite("Activity tracker")
struct ActivityTrackerTests {
    @Test("an immediate task runs on the calling thread until it first suspends; the tracker waits for every task")
    func immediateSpawn() async {
        let tracker = ActivityTracker()
        let order = NIOLockedValueBox<[String]>([])
        let immediate = tracker.spawn(on: nil, immediately: true) {
            order.withLockedValue { $0.append("immediate body") }
            await Task.yield()
            order.withLockedValue { $0.append("immediate resumed") }
        }
        order.withLockedValue { $0.append("spawn returned") }
        #expect(order.withLockedValue { $0 }.first == "immediate body", "the body ran before spawn returned")
        await immediate.value
        #expect(order.withLockedValue { $0 } == ["immediate body", "spawn returned", "immediate resumed"])

        let queued = tracker.spawn(on: nil) { order.withLockedValue { $0.append("queued body") } }
        await queued.value
        await tracker.finished()
        #expect(tracker.active == 0)
        #expect(order.withLockedValue { $0 }.last == "queued body")
    }
}
