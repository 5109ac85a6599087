import Testing

@testable import TetherCore

@Suite("Link health")
struct LinkHealthTests {
    static let start = TetherInstant(nanoseconds: 1_000_000_000)

    @Test("seed 004's rule: at least 10 % of at least 40 requests timed out is failing; fewer requests or a lower share is not")
    func seedRule() throws {
        var health = LinkHealth(policy: try .init(failureRate: 0.1, minimumRequests: 40, window: .seconds(60)))
        var now = Self.start
        for _ in 0..<36 {
            #expect(health.record(failed: false, at: now) == nil)
            now = now + .milliseconds(10)
        }
        for index in 0..<3 {
            #expect(health.record(failed: true, at: now) == nil, "\(index + 1) failed of \(37 + index): fewer than 40 requests")
        }
        #expect(health.record(failed: true, at: now) == LinkHealth.Failing(failed: 4, total: 40))
        // Successes dilute the share below 10 %: 4 of 41 is not failing, and a success never is.
        var diluted = LinkHealth(policy: try .init(failureRate: 0.1, minimumRequests: 40, window: .seconds(60)))
        for _ in 0..<37 { _ = diluted.record(failed: false, at: now) }
        for _ in 0..<3 { _ = diluted.record(failed: true, at: now) }
        #expect(diluted.record(failed: false, at: now) == nil)
        #expect(diluted.counts(at: now) == (3, 41))
    }

    @Test("outcomes older than the window are forgotten: old timeouts do not condemn a link that recovered")
    func window() throws {
        var health = LinkHealth(policy: try .init(failureRate: 0.5, minimumRequests: 4, window: .seconds(10)))
        for _ in 0..<3 { #expect(health.record(failed: true, at: Self.start) == nil) }
        let later = Self.start + .seconds(11)
        for _ in 0..<3 { #expect(health.record(failed: false, at: later) == nil) }
        #expect(health.counts(at: later) == (0, 3), "the three timeouts left the window")
        #expect(health.record(failed: true, at: later) == nil, "1 of 4")
        #expect(health.record(failed: true, at: later) == nil, "2 of 5: under half")
        #expect(health.counts(at: later) == (2, 5))
        #expect(health.record(failed: true, at: later) == LinkHealth.Failing(failed: 3, total: 6))
    }

    @Test("memory does not grow with the rate: a million answered requests in the window, then a burst of timeouts")
    func constantMemory() throws {
        var health = LinkHealth(policy: try .init(failureRate: 0.1, minimumRequests: 40, window: .seconds(60)))
        var now = Self.start
        for _ in 0..<1_000_000 {
            _ = health.record(failed: false, at: now)
            now = now + .microseconds(50)  // 20,000 a second for 50 s
        }
        #expect(health.counts(at: now).total == 1_000_000)
        var verdict: LinkHealth.Failing?
        var timeouts = 0
        while verdict == nil, timeouts < 200_000 {
            verdict = health.record(failed: true, at: now)
            timeouts += 1
        }
        #expect(verdict?.failed == timeouts && timeouts > 100_000, "10 % of everything in the window, not of a sample")
    }

    @Test("bad policies are refused, saying which value", arguments: [(0.0, 40, 60), (1.5, 40, 60), (0.1, 0, 60), (0.1, 40, 0)])
    func policies(rate: Double, minimum: Int, seconds: Int) {
        #expect(throws: ConfigurationError.self) {
            try LinkHealth.Policy(failureRate: rate, minimumRequests: minimum, window: .seconds(seconds))
        }
    }
}
