import NIOCore
import Testing

@testable import TetherCore

@Suite("Message scheduler")
struct OutboxWindowTests {
    let now = TetherInstant(nanoseconds: 1_000_000_000)

    func record(_ id: UInt64, _ conversation: String, _ sequence: UInt64, _ priority: MessagePriority = .normal) -> OutboxRecord {
        OutboxRecord(
            id: id,
            topic: "t",
            conversation: conversation,
            sequence: sequence,
            priority: priority,
            expiresAt: nil,
            body: ByteBuffer()
        )
    }

    mutating func drain(_ scheduler: inout OutboxWindow) -> [UInt64] {
        var sent: [UInt64] = []
        while let next = scheduler.next(now: self.now) { sent.append(next.id) }
        return sent
    }

    @Test("a conversation's messages leave in sequence order; conversations take turns")
    mutating func order() {
        var scheduler = OutboxWindow(window: 100)
        scheduler.enqueue([
            self.record(1, "a", 1), self.record(2, "a", 2), self.record(3, "b", 1), self.record(4, "a", 3), self.record(5, "b", 2),
        ])
        #expect(self.drain(&scheduler) == [1, 3, 2, 5, 4])
    }

    @Test("a lone message is sent; messages enqueued out of order still leave in sequence order")
    mutating func insertion() {
        var scheduler = OutboxWindow(window: 100)
        scheduler.enqueue([self.record(1, "a", 1)])
        #expect(self.drain(&scheduler) == [1])
        scheduler.enqueue([self.record(4, "b", 3)])
        scheduler.enqueue([self.record(2, "b", 1)])
        scheduler.enqueue([self.record(5, "b", 4), self.record(3, "b", 2)])
        scheduler.enqueue([self.record(3, "b", 2)])  // twice: queued once
        #expect(self.drain(&scheduler) == [2, 3, 4, 5])
        #expect(scheduler.queuedCount == 0)
    }

    @Test("higher lanes go first, but never ahead of their conversation's earlier messages")
    mutating func priorities() {
        var scheduler = OutboxWindow(window: 100)
        scheduler.enqueue([
            self.record(1, "bulk", 1, .low), self.record(2, "bulk", 2, .low),
            self.record(3, "chat", 1, .high), self.record(4, "chat", 2, .high),
            self.record(5, "mixed", 1, .low), self.record(6, "mixed", 2, .high),
        ])
        // chat (high) first; "mixed" stays in the low lane until its first message is out.
        #expect(self.drain(&scheduler) == [3, 4, 1, 5, 6, 2])
    }

    @Test("the window bounds the messages in flight; acknowledgements open it, with an RTT sample")
    mutating func window() {
        var scheduler = OutboxWindow(window: 2)
        scheduler.enqueue((1...4).map { self.record(UInt64($0), "c", UInt64($0)) })
        #expect(self.drain(&scheduler) == [1, 2])
        #expect(!scheduler.canSend)
        let later = self.now + .milliseconds(30)
        let acknowledged = scheduler.acknowledged(1, now: later)
        #expect(acknowledged?.record.id == 1 && acknowledged?.sample == .milliseconds(30))
        #expect(scheduler.next(now: later)?.id == 3)
        #expect(scheduler.acknowledged(99, now: later) == nil)
    }

    @Test("a timed-out message is sent again before the later ones of its conversation, without an RTT sample")
    mutating func retransmission() {
        var scheduler = OutboxWindow(window: 10)
        scheduler.enqueue([self.record(1, "c", 1), self.record(2, "c", 2), self.record(3, "c", 3)])
        #expect(self.drain(&scheduler) == [1, 2, 3])
        #expect(scheduler.timedOut(2) == 1)
        #expect(scheduler.timedOut(1) == 1)
        #expect(self.drain(&scheduler) == [1, 2])
        #expect(scheduler.acknowledged(1, now: self.now)?.sample == nil, "Karn: no sample from a retransmission")
        #expect(scheduler.acknowledged(3, now: self.now + .seconds(1))?.sample == .seconds(1))
    }

    @Test("messages timing out in any order go again first, in sequence order, ahead of a long queue")
    mutating func retransmissionsAheadOfQueue() {
        var scheduler = OutboxWindow(window: 10)
        scheduler.enqueue((1...1_000).map { self.record(UInt64($0), "c", UInt64($0)) })
        #expect(self.drain(&scheduler) == Array(1...10))
        for id in [3, 1, 2, 10, 4, 5, 6, 9, 8, 7] as [UInt64] { scheduler.timedOut(id) }
        #expect(scheduler.acknowledged(5, now: self.now)?.sample == nil, "acknowledged while waiting to go again")
        #expect(self.drain(&scheduler) == [1, 2, 3, 4, 6, 7, 8, 9, 10, 11])
        #expect(scheduler.queuedCount == 989)
    }

    @Test("an acknowledgement for a message queued again removes it; enqueueing twice sends once")
    mutating func acknowledgedWhileQueued() {
        var scheduler = OutboxWindow(window: 10)
        scheduler.enqueue([self.record(1, "c", 1), self.record(2, "c", 2)])
        _ = scheduler.next(now: self.now)
        scheduler.timedOut(1)
        #expect(scheduler.acknowledged(1, now: self.now)?.record.id == 1)
        scheduler.enqueue([self.record(2, "c", 2)])
        #expect(self.drain(&scheduler) == [2])
        #expect(scheduler.queuedCount == 0)
    }

    @Test("an expired message's tombstone replaces it, queued or in flight")
    mutating func tombstones() {
        var scheduler = OutboxWindow(window: 1)
        scheduler.enqueue([self.record(1, "c", 1), self.record(2, "c", 2)])
        _ = scheduler.next(now: self.now)
        var first = self.record(1, "c", 1)
        first.expired = true
        var second = self.record(2, "c", 2)
        second.expired = true
        scheduler.replace(with: first)
        scheduler.replace(with: second)
        scheduler.timedOut(1)
        #expect(scheduler.next(now: self.now)?.expired == true)
        _ = scheduler.acknowledged(1, now: self.now)
        #expect(scheduler.next(now: self.now)?.expired == true)
    }
}
