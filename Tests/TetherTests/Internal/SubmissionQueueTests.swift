import Testing

@testable import Tether

@Suite("Submission queue")
struct SubmissionQueueTests {
    @Test("the first push of a batch says to wake the consumer; takeAll gives every element, oldest first")
    func order() {
        let queue = SubmissionQueue<Int>()
        #expect(Array(queue.takeAll()).isEmpty)
        #expect(queue.push(1))
        #expect(!queue.push(2) && !queue.push(3))
        #expect(Array(queue.takeAll()) == [1, 2, 3])
        #expect(queue.push(4), "empty again: the next push wakes the consumer")
        #expect(Array(queue.takeAll()) == [4])
    }

    @Test("pushes from many threads: nothing lost or doubled, each producer's elements in its order")
    func concurrent() async {
        let queue = SubmissionQueue<Int>()
        let producers = 8
        let each = 10_000
        var taken: [Int] = []
        await withTaskGroup(of: Void.self) { group in
            for producer in 0..<producers {
                group.addTask {
                    for index in 0..<each { _ = queue.push(producer * each + index) }
                }
            }
            while taken.count < producers * each {
                taken.append(contentsOf: queue.takeAll())
                await Task.yield()
            }
        }
        #expect(taken.count == producers * each)
        #expect(Set(taken).count == producers * each)
        var last = [Int](repeating: -1, count: producers)
        for value in taken {
            let producer = value / each
            #expect(value > last[producer])
            last[producer] = value
        }
    }
}
