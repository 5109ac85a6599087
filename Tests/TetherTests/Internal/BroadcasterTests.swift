import Testing

@testable import Tether

@Suite("Broadcaster")
struct BroadcasterTests {
    @Test("each subscriber gets what is published after it subscribed, in order; publishing to nobody drops nothing and holds nothing")
    func fanOut() async {
        let broadcaster = Broadcaster<Int>(bufferSize: 10)
        #expect(!broadcaster.hasSubscribers)
        #expect(broadcaster.yield(0) == 0, "nobody listens")
        let first = broadcaster.subscribe()
        broadcaster.yield(1)
        let second = broadcaster.subscribe()
        #expect(broadcaster.hasSubscribers)
        broadcaster.yield(2)
        broadcaster.finish()
        #expect(!broadcaster.hasSubscribers)
        var firstSeen: [Int] = []
        for await element in first { firstSeen.append(element) }
        var secondSeen: [Int] = []
        for await element in second { secondSeen.append(element) }
        #expect(firstSeen == [1, 2])
        #expect(secondSeen == [2])
    }

    @Test("a subscriber that falls behind by more than the buffer loses its oldest elements, and yield says so")
    func slowSubscriber() async {
        let broadcaster = Broadcaster<Int>(bufferSize: 2)
        let stream = broadcaster.subscribe()
        var dropped = 0
        for element in 1...5 { dropped += broadcaster.yield(element) }
        broadcaster.finish()
        var seen: [Int] = []
        for await element in stream { seen.append(element) }
        #expect(dropped == 3)
        #expect(seen == [4, 5])
    }

    @Test("the last subscription to end calls onLastSubscriberGone; a subscription after finish() ends at once")
    func lastSubscriberGone() async throws {
        let gone = AsyncStream.makeStream(of: Void.self)
        let broadcaster = Broadcaster<Int>(bufferSize: 4, onLastSubscriberGone: { gone.continuation.yield() })
        var task: Task<Void, Never>? = Task {
            for await _ in broadcaster.subscribe() {}
        }
        while !broadcaster.hasSubscribers { await Task.yield() }
        task?.cancel()
        task = nil
        var iterator = gone.stream.makeAsyncIterator()
        _ = await iterator.next()
        #expect(!broadcaster.hasSubscribers)
        broadcaster.finish()
        var after: [Int] = []
        for await element in broadcaster.subscribe() { after.append(element) }
        #expect(after.isEmpty)
    }
}
