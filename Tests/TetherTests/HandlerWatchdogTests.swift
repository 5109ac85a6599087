import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing

@testable import TetherGateway

/// A one-shot gate a task waits at, deaf to cancellation.
private final class Gate: Sendable {
    private let state = NIOLockedValueBox<(open: Bool, waiter: CheckedContinuation<Void, Never>?)>((false, nil))

    func wait() async {
        await withCheckedContinuation { continuation in
            let open = self.state.withLockedValue { state in
                if !state.open { state.waiter = continuation }
                return state.open
            }
            if open { continuation.resume() }
        }
    }

    func open() {
        let waiter = self.state.withLockedValue { state in
            state.open = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume()
    }
}

@Suite("Handler watchdog (reliable message handlers' time limit)")
struct HandlerWatchdogTests {
    @Test("each handler gets the whole limit from its start; one past it is cancelled and reported, whatever it returns")
    func limits() async throws {
        let loop = NIOAsyncTestingEventLoop()
        let watchdog = HandlerWatchdog(eventLoop: loop, limit: .seconds(10))

        // In time: its result. This arms the timer for t = 10 s.
        #expect(await watchdog.run { 7 } == 7)
        await loop.advanceTime(by: .seconds(5))

        // Started at t = 5 s, so due at t = 15 s. It ignores cancellation until the gate opens;
        // its cancellation handler records when the watchdog cancels it.
        let started = Gate()
        let gate = Gate()
        let cancelled = NIOLockedValueBox(false)
        async let outcome: Int? = watchdog.run {
            started.open()
            await withTaskCancellationHandler {
                await gate.wait()
            } onCancel: {
                cancelled.withLockedValue { $0 = true }
            }
            return 42
        }
        await started.wait()

        // t = 10 s: the first handler's timer fires, finds this one not yet due, and re-arms.
        await loop.advanceTime(by: .seconds(5))
        #expect(!cancelled.withLockedValue { $0 }, "not cancelled before its own deadline")
        // t = 15 s: due; cancelled, and reported as timed out though it then returns a value.
        await loop.advanceTime(by: .seconds(5))
        #expect(cancelled.withLockedValue { $0 })
        gate.open()
        #expect(await outcome == nil)

        // The watchdog is ready for the next handler, which gets its result again.
        #expect(await watchdog.run { 3 } == 3)
        try await loop.shutdownGracefully()
    }
}
