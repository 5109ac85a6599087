import Testing
import TetherCore

@testable import TetherBackendProxy

@Suite("Circuit breaker (state × event)")
struct CircuitBreakerTests {
    let start = TetherInstant(nanoseconds: 1_000_000_000)
    let configuration = BackendConfiguration.Breaker(failures: 3, openFor: .seconds(5))

    /// Whether the breaker lets a call go at `now` (the call is then under way).
    func allows(_ breaker: inout CircuitBreaker, at now: TetherInstant) -> Bool {
        breaker.allows(now: now)
    }

    @Test("closed: failures in a row open it; a success in between starts the count again")
    func opensAfterFailuresInARow() {
        var breaker = CircuitBreaker(self.configuration)
        breaker.failed(now: self.start)
        breaker.failed(now: self.start)
        breaker.succeeded()
        breaker.failed(now: self.start)
        breaker.failed(now: self.start)
        #expect(breaker.state == .closed(failures: 2))
        #expect(self.allows(&breaker, at: self.start))
        breaker.failed(now: self.start)
        #expect(breaker.state == .open(until: self.start + .seconds(5)))
        #expect(breaker.isOpen(now: self.start))
        #expect(!self.allows(&breaker, at: self.start + .seconds(4)))
    }

    @Test("open: after openFor one call probes (half-open); its success closes, its failure opens again")
    func halfOpenProbe() {
        var breaker = CircuitBreaker(self.configuration)
        for _ in 0..<3 { breaker.failed(now: self.start) }
        let later = self.start + .seconds(5)
        #expect(!breaker.isOpen(now: later))
        #expect(self.allows(&breaker, at: later))
        #expect(breaker.state == .halfOpen(probing: true))
        #expect(!self.allows(&breaker, at: later), "one probe at a time")
        breaker.failed(now: later)
        #expect(breaker.state == .open(until: later + .seconds(5)))
        let probe = later + .seconds(5)
        #expect(self.allows(&breaker, at: probe))
        breaker.succeeded()
        #expect(breaker.state == .closed(failures: 0))
        #expect(self.allows(&breaker, at: probe))
    }

    @Test("a probe abandoned (cancelled before it went) lets the next call probe")
    func abandonedProbe() {
        var breaker = CircuitBreaker(self.configuration)
        for _ in 0..<3 { breaker.failed(now: self.start) }
        let later = self.start + .seconds(6)
        #expect(self.allows(&breaker, at: later))
        breaker.abandoned()
        #expect(breaker.state == .halfOpen(probing: false))
        #expect(self.allows(&breaker, at: later))
        // Abandoning a call while closed changes nothing.
        var closed = CircuitBreaker(self.configuration)
        closed.abandoned()
        #expect(closed.state == .closed(failures: 0))
    }
}

@Suite("Call slots")
struct CallSlotsTests {
    @Test("at most the limit under way; waiters get slots in order; a cancelled waiter leaves the queue")
    func slots() async throws {
        let slots = CallSlots(2)
        try await slots.acquire()
        try await slots.acquire()
        let waiting = Task { try await slots.acquire() }
        let cancelled = Task { try await slots.acquire() }
        while slots.waiting < 2 { await Task.yield() }
        cancelled.cancel()
        await #expect(throws: CancellationError.self) { try await cancelled.value }
        #expect(slots.waiting == 1)
        slots.release()
        try await waiting.value
        #expect(slots.waiting == 0)
        slots.release()
        slots.release()
        // Both slots are free again: two acquisitions do not wait.
        try await slots.acquire()
        try await slots.acquire()
        #expect(slots.waiting == 0)
    }
}
