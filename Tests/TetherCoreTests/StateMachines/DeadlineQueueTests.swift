import Testing
import TetherCore

@Suite("Deadline queue")
struct DeadlineQueueTests {
    func earliest<Key, Instant>(_ queue: inout DeadlineQueue<Key, Instant>) -> Instant? { queue.earliest }

    @Test("keys expire earliest first, at or after their deadline, and only once")
    func order() {
        var queue = DeadlineQueue<Int, Int>()
        queue.insert(1, deadline: 30)
        queue.insert(2, deadline: 10)
        queue.insert(3, deadline: 20)
        let result1 = earliest(&queue)
        #expect(result1 == 10)
        let result2 = queue.popExpired(at: 9)
        #expect(result2 == [])
        let result3 = queue.popExpired(at: 20)
        #expect(result3 == [2, 3])
        #expect(queue.count == 1)
        let result4 = earliest(&queue)
        #expect(result4 == 30)
        let result5 = queue.popExpired(at: 100)
        #expect(result5 == [1])
        let result6 = queue.popExpired(at: 100)
        #expect(result6 == [])
        let result7 = earliest(&queue)
        #expect(result7 == nil)
        #expect(queue.isEmpty)
    }

    @Test("a removed key never expires, and the next deadline skips it")
    func removal() {
        var queue = DeadlineQueue<Int, Int>()
        queue.insert(1, deadline: 10)
        queue.insert(2, deadline: 20)
        let result8 = queue.remove(1)
        #expect(result8)
        let result9 = queue.remove(1)
        #expect(!result9)
        let result10 = earliest(&queue)
        #expect(result10 == 20)
        let result11 = queue.popExpired(at: 50)
        #expect(result11 == [2])
    }

    @Test("inserting a key again replaces its deadline, earlier or later")
    func reinsert() {
        var queue = DeadlineQueue<Int, Int>()
        queue.insert(1, deadline: 10)
        queue.insert(1, deadline: 40)
        queue.insert(2, deadline: 20)
        #expect(queue.deadline(of: 1) == 40)
        let result12 = queue.popExpired(at: 30)
        #expect(result12 == [2])
        queue.insert(1, deadline: 5)
        let result13 = earliest(&queue)
        #expect(result13 == 5)
        let result14 = queue.popExpired(at: 5)
        #expect(result14 == [1])
        // Removed and inserted again with the same deadline: it expires once.
        queue.insert(3, deadline: 60)
        queue.remove(3)
        queue.insert(3, deadline: 60)
        let result15 = queue.popExpired(at: 60)
        #expect(result15 == [3])
        #expect(queue.isEmpty)
    }

    @Test("with many keys removed early, the rest still expire in deadline order")
    func churn() {
        var queue = DeadlineQueue<Int, Int>()
        var generator = SplitMix64(seed: 42)
        var expected: [Int: Int] = [:]
        for key in 0..<100_000 {
            let deadline = Int(generator.next() % 1_000_000)
            queue.insert(key, deadline: deadline)
            expected[key] = deadline
            // Most requests are answered soon: keep about 50 live.
            if key >= 50 {
                let answered = key - 50
                if answered % 10 != 0 {
                    queue.remove(answered)
                    expected[answered] = nil
                }
            }
        }
        #expect(queue.count == expected.count)
        let popped = queue.popExpired(at: .max)
        #expect(popped.count == expected.count)
        #expect(Set(popped) == Set(expected.keys))
        let deadlines = popped.map { expected[$0]! }
        #expect(deadlines == deadlines.sorted())
    }

    @Test("removeAll returns every key with a deadline")
    func removeAll() {
        var queue = DeadlineQueue<String, Int>()
        queue.insert("a", deadline: 1)
        queue.insert("b", deadline: 2)
        queue.remove("a")
        let keys = queue.removeAll()
        #expect(keys == ["b"])
        let result16 = earliest(&queue)
        #expect(result16 == nil)
    }
}
