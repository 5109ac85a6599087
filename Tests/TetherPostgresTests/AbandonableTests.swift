import Testing

@testable import TetherPostgres

@Suite("Work abandoned on cancellation or timeout")
struct AbandonableTests {
    struct Failure: Error {}
    struct TimedOut: Error {}

    /// A body that ignores cancellation and never ends, as a query PostgresNIO never answers.
    @Sendable static func stuck() async throws -> Int {
        await withUnsafeContinuation { (_: UnsafeContinuation<Int, Never>) in }
    }

    @Test("the value and the error of a body that ends come through")
    func passesThrough() async throws {
        #expect(try await abandonable { 42 } == 42)
        #expect(try await abandonable(timeout: .seconds(5), timedOut: { TimedOut() }) { 43 } == 43)
        await #expect(throws: Failure.self) { try await abandonable { () async throws -> Int in throw Failure() } }
    }

    @Test("a caller waiting for a body that never ends returns CancellationError as soon as it is cancelled")
    func cancelled() async throws {
        let waiting = Task { try await abandonable(Self.stuck) }
        try await Task.sleep(for: .milliseconds(50))
        let clock = ContinuousClock()
        let cancelledAt = clock.now
        waiting.cancel()
        await #expect(throws: CancellationError.self) { try await waiting.value }
        #expect(clock.now - cancelledAt < .seconds(30), "it returned on cancellation, not never")
    }

    @Test("a caller cancelled before it waits returns CancellationError, without waiting for a long timeout")
    func cancelledBefore() async throws {
        let clock = ContinuousClock()
        let started = clock.now
        let waiting = Task {
            withUnsafeCurrentTask { $0?.cancel() }
            return try await abandonable(timeout: .seconds(3600), timedOut: { TimedOut() }, Self.stuck)
        }
        await #expect(throws: CancellationError.self) { try await waiting.value }
        #expect(clock.now - started < .seconds(60), "it did not wait for the hour's timeout")
    }

    @Test("a body that overruns its timeout fails with the timeout's error and is cancelled")
    func timesOut() async throws {
        let cancelled = AsyncStream<Void>.makeStream()
        await #expect(throws: TimedOut.self) {
            try await abandonable(timeout: .milliseconds(50), timedOut: { TimedOut() }) {
                await withTaskCancellationHandler {
                    try? await Task.sleep(for: .seconds(60))
                } onCancel: {
                    cancelled.continuation.yield()
                }
                return 1
            }
        }
        var iterator = cancelled.stream.makeAsyncIterator()
        #expect(await iterator.next() != nil, "the overrunning body was cancelled")
    }

    @Test("a body that ends before its timeout stops the timer: many calls, each with an hour's timeout, end without it")
    func timerStopped() async throws {
        let clock = ContinuousClock()
        let started = clock.now
        try await withThrowingDiscardingTaskGroup { group in
            for index in 0..<200 {
                group.addTask {
                    let value = try await abandonable(timeout: .seconds(3600), timedOut: { TimedOut() }) { index }
                    #expect(value == index)
                }
            }
        }
        #expect(clock.now - started < .seconds(60), "no call waited for its hour's timeout")
    }
}
