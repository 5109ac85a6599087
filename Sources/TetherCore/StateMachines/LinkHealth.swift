import NIOCore

/// Whether a connection that is up is failing: the share of its requests sent and never
/// answered before their deadline, over a sliding window of time (seed 004: a link is given up
/// when at least 10 % of at least 40 tasks fail). The window slides a twelfth of itself at a
/// time, and its memory does not grow with the request rate.
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
    /// Outcomes counted in slices of the window (a ring of ``slices``), so that memory stays
    /// the same at any request rate; the window's start moves a slice at a time.
    private var buckets: [Bucket]
    private let sliceNanoseconds: Int64

    private struct Bucket {
        /// The slice's number since the clock's origin; `nil`: empty.
        var slice: Int64?
        var failed = 0
        var total = 0
    }

    /// Slices per window.
    static let slices = 12

    package init(policy: Policy) {
        self.policy = policy
        let window = policy.window.components
        let nanoseconds = window.seconds * 1_000_000_000 + window.attoseconds / 1_000_000_000
        self.sliceNanoseconds = max(1, nanoseconds / Int64(Self.slices))
        self.buckets = Array(repeating: Bucket(), count: Self.slices)
    }

    /// Requests in the window at `now`, and how many of them failed.
    package func counts(at now: TetherInstant) -> (failed: Int, total: Int) {
        let current = now.nanoseconds / self.sliceNanoseconds
        var failed = 0
        var total = 0
        for bucket in self.buckets {
            guard let slice = bucket.slice, slice > current - Int64(Self.slices), slice <= current else { continue }
            failed += bucket.failed
            total += bucket.total
        }
        return (failed, total)
    }

    /// Records one request's outcome.
    /// - Returns: Why the link is failing, if it is now; `nil` if it is not.
    package mutating func record(failed: Bool, at now: TetherInstant) -> Failing? {
        let slice = now.nanoseconds / self.sliceNanoseconds
        let index = Int(((slice % Int64(Self.slices)) + Int64(Self.slices)) % Int64(Self.slices))
        if self.buckets[index].slice != slice { self.buckets[index] = Bucket(slice: slice) }
        self.buckets[index].total += 1
        if failed { self.buckets[index].failed += 1 }
        guard failed else { return nil }
        let (failures, total) = self.counts(at: now)
        guard total >= self.policy.minimumRequests, Double(failures) >= self.policy.failureRate * Double(total) else { return nil }
        return Failing(failed: failures, total: total)
    }
}
