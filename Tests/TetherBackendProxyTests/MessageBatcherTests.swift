import NIOConcurrencyHelpers
import Testing

@testable import TetherBackendProxy

@Suite("Message batcher")
struct MessageBatcherTests {
    /// A `send` that records its batches and waits until released, so that messages pile up.
    final class Backend: Sendable {
        struct State {
            var batches: [[Int]] = []
            var inFlight = 0
            var mostInFlight = 0
            var released = false
        }

        let state = NIOLockedValueBox(State())

        func send(_ batch: [Int]) async -> [String] {
            self.state.withLockedValue {
                $0.batches.append(batch)
                $0.inFlight += 1
                $0.mostInFlight = max($0.mostInFlight, $0.inFlight)
            }
            while !self.state.withLockedValue({ $0.released }) { try? await Task.sleep(for: .milliseconds(1)) }
            self.state.withLockedValue { $0.inFlight -= 1 }
            return batch.map { "outcome \($0)" }
        }
    }

    @Test("a message alone is a call of its own")
    func alone() async {
        let backend = Backend()
        backend.state.withLockedValue { $0.released = true }
        let batcher = MessageBatcher<Int, String>(maxMessages: 8)
        #expect(await batcher.process(7, cancelled: "cancelled") { await backend.send($0) } == "outcome 7")
        #expect(backend.state.withLockedValue { $0.batches } == [[7]])
    }

    @Test("50 messages at once: two calls under way at most, up to 8 to a call, each message gets its own outcome once")
    func many() async throws {
        let backend = Backend()
        let batcher = MessageBatcher<Int, String>(maxMessages: 8, maxCallsInFlight: 2)
        try await withThrowingTaskGroup(of: (Int, String).self) { group in
            for item in 0..<50 {
                group.addTask { (item, await batcher.process(item, cancelled: "cancelled") { await backend.send($0) }) }
            }
            // Two calls are made at once; the other 48 wait in line for them.
            while batcher.waitingCount < 48 || backend.state.withLockedValue({ $0.batches.count }) < 2 {
                try await Task.sleep(for: .milliseconds(1))
            }
            try await Task.sleep(for: .milliseconds(20))
            #expect(backend.state.withLockedValue { $0.batches.count } == 2, "no third call while two are under way")
            backend.state.withLockedValue { $0.released = true }
            var outcomes: [Int: String] = [:]
            for try await (item, outcome) in group {
                #expect(outcomes[item] == nil)
                outcomes[item] = outcome
            }
            #expect(outcomes.count == 50 && outcomes.allSatisfy { $0.value == "outcome \($0.key)" })
        }
        let state = backend.state.withLockedValue { $0 }
        #expect(state.mostInFlight == 2)
        #expect(state.batches.allSatisfy { !$0.isEmpty && $0.count <= 8 })
        #expect(state.batches.flatMap { $0 }.sorted() == Array(0..<50), "each message in one call, once")
        // The 48 went 8 to a call, but at the end of the line, where two leaders take what is
        // left at once: at most two calls there are not full.
        let sizes = state.batches.map(\.count)
        #expect(sizes.prefix(2) == [1, 1] && sizes.dropFirst(2).filter { $0 < 8 }.count <= 2, "\(sizes)")
    }

    @Test("a message whose task is cancelled while it waits in line leaves it at once; the others go on")
    func cancelledInLine() async throws {
        let backend = Backend()
        let batcher = MessageBatcher<Int, String>(maxMessages: 8, maxCallsInFlight: 1)
        let leader = Task { await batcher.process(0, cancelled: "cancelled") { await backend.send($0) } }
        while backend.state.withLockedValue({ $0.batches.count }) < 1 { try await Task.sleep(for: .milliseconds(1)) }
        let waiting = (1...3).map { item in Task { await batcher.process(item, cancelled: "cancelled") { await backend.send($0) } } }
        while batcher.waitingCount < 3 { try await Task.sleep(for: .milliseconds(1)) }
        waiting[1].cancel()
        #expect(await waiting[1].value == "cancelled", "it returns while the call is still under way")
        #expect(batcher.waitingCount == 2)
        backend.state.withLockedValue { $0.released = true }
        #expect(await leader.value == "outcome 0")
        #expect(await waiting[0].value == "outcome 1")
        #expect(await waiting[2].value == "outcome 3")
        #expect(backend.state.withLockedValue { $0.batches } == [[0], [1, 3]], "the cancelled message is in no call")

        // Cancelled before it joins the line: it does not wait either.
        backend.state.withLockedValue { $0.released = false }
        let busy = Task { await batcher.process(4, cancelled: "cancelled") { await backend.send($0) } }
        while backend.state.withLockedValue({ $0.batches.count }) < 3 { try await Task.sleep(for: .milliseconds(1)) }
        let late = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return await batcher.process(5, cancelled: "cancelled") { await backend.send($0) }
        }
        #expect(await late.value == "cancelled")
        backend.state.withLockedValue { $0.released = true }
        #expect(await busy.value == "outcome 4")
    }
}
