import Testing

@testable import TetherPostgres

@Suite("A task's value unless cancelled")
struct ValueUnlessCancelledTests {
    @Test("the value and the error of a task that ends come through")
    func passesThrough() async throws {
        #expect(try await Task { 42 }.valueUnlessCancelled == 42)
        struct Failure: Error {}
        await #expect(throws: Failure.self) { try await Task<Int, any Error> { throw Failure() }.valueUnlessCancelled }
    }

    @Test("a caller waiting for a task that never ends returns CancellationError as soon as it is cancelled")
    func cancelled() async throws {
        // A task that ignores cancellation and never ends, as a query PostgresNIO never answers.
        let stuck = Task<Int, any Error> { await withUnsafeContinuation { (_: UnsafeContinuation<Int, Never>) in } }
        let waiting = Task { try await stuck.valueUnlessCancelled }
        try await Task.sleep(for: .milliseconds(50))
        waiting.cancel()
        await #expect(throws: CancellationError.self) { try await waiting.value }
        #expect(stuck.isCancelled, "the task is asked to stop too")
    }

    @Test("a caller cancelled before it waits returns CancellationError at once")
    func cancelledBefore() async throws {
        let stuck = Task<Int, any Error> { await withUnsafeContinuation { (_: UnsafeContinuation<Int, Never>) in } }
        let waiting = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await stuck.valueUnlessCancelled
        }
        await #expect(throws: CancellationError.self) { try await waiting.value }
    }
}
