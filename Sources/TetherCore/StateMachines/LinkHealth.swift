import NIOCore

/// Whether a connection that is up is failing: the share of its requests sent and never
/// answered before their deadline, over a sliding window of time (seed 004: a link is given up
/// when at least 10 % of at least 40 tasks fail).
///
/// A connection can stay open while the link under it no longer works: a proxy or a middlebox
/// that buffers or drops one way, a gateway that is alive but stuck. The heartbeat may still
/// get through; requests do not. Each request sent on the connection is one outcome: answered
/// (whatever its status: the link carried it) or timed out. Once the window holds at least
/// ``Policy/minimumRequests`` outcomes and at least ``Policy/failureRate`` of them are
/// timeouts, the link is failing, and the client moves to another endpoint.
///
/// ```swift
/// var health = LinkHealth(policy: try .init(failureRate: 0.1, minimumRequests: 40, window: .seconds(60)))
/// if let failing = health.record(failed: true, at: now) { … close, penalise the endpoint … }
/// ```
package struct LinkHealth: Sendable {
    /// When a link counts as failing.
    package struct Policy: Sendable, Hashable {
        /// The share of timed-out requests, from more than 0 to 1, at which the link is failing.
        package var failureRate: Double
        /// The fewest outcomes in the window for a verdict.
        package var minimumRequests: Int
        /// How far back outcomes count.
        package var window: Duration

        package init(failureRate: Double, minimumRequests: Int, window: Duration) throws(ConfigurationError) {
            guard failureRate > 0, failureRate <= 1 else {
                throw ConfigurationError("the failing-link rate must be more than 0 and at most 1, got \(failureRate)")
            }
            guard minimumRequests >= 1 else {
                throw ConfigurationError("the failing link's minimum number of requests must be at least 1, got \(minimumRequests)")
            }
            guard window > .zero else { throw ConfigurationError("the failing link's window must be positive") }
            self.failureRate = failureRate
            self.minimumRequests = minimumRequests
            self.window = window
        }
    }

    /// Why the link is failing.
    package struct Failing: Sendable, Hashable {
        /// Requests that timed out, of ``total``, within the window.
        package var failed: Int
        package var total: Int
    }

    package let policy: Policy
    private var outcomes = CircularBuffer<(at: TetherInstant, failed: Bool)>()
    private var failures = 0

    package init(policy: Policy) {
        self.policy = policy
    }

    /// Requests in the window, and how many of them failed.
    package var counts: (failed: Int, total: Int) { (self.failures, self.outcomes.count) }

    /// Records one request's outcome.
    /// - Returns: Why the link is failing, if it is now; `nil` if it is not.
    package mutating func record(failed: Bool, at now: TetherInstant) -> Failing? {
        self.forget(before: now - self.policy.window)
        self.outcomes.append((now, failed))
        if failed { self.failures += 1 }
        let total = self.outcomes.count
        guard failed, total >= self.policy.minimumRequests,
            Double(self.failures) >= self.policy.failureRate * Double(total)
        else { return nil }
        return Failing(failed: self.failures, total: total)
    }

    private mutating func forget(before start: TetherInstant) {
        while let first = self.outcomes.first, first.at < start {
            self.outcomes.removeFirst()
            if first.failed { self.failures -= 1 }
        }
    }
}
