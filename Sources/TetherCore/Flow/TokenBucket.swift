/// A rate: up to `perSecond` takes in a burst, refilled at `perSecond` per second.
///
/// Used two ways: to **refuse** past the rate (new connections per second: a refusal is cheap
/// and the client backs off), and to **pace** (requests and reliable messages of one
/// connection: what is over the rate waits for ``nextToken(now:)``, and the connection stops
/// reading if too much waits, so the client is slowed to the rate and nothing is refused).
///
/// ```swift
/// var rate = TokenBucket(perSecond: 5_000, now: clock.now)
/// if rate.take(now: clock.now) { process() } else { wait(until: rate.nextToken(now: clock.now)) }
/// ```
package struct TokenBucket: Sendable, Hashable {
    package let perSecond: Int
    /// Tokens, in millionths of a token: integer arithmetic keeps the rate exact over time.
    private var micros: Int64
    private var updated: TetherInstant

    private var capacity: Int64 { Int64(self.perSecond) * 1_000_000 }

    package init(perSecond: Int, now: TetherInstant) {
        precondition(perSecond > 0, "a rate must be positive")
        self.perSecond = perSecond
        self.micros = Int64(perSecond) * 1_000_000
        self.updated = now
    }

    private mutating func refill(now: TetherInstant) {
        let elapsed = now.nanoseconds &- self.updated.nanoseconds
        guard elapsed > 0 else { return }
        // perSecond tokens per 10⁹ ns = perSecond micro-tokens per 10³ ns.
        let (gained, overflow) = (elapsed / 1000).multipliedReportingOverflow(by: Int64(self.perSecond))
        self.micros = overflow ? self.capacity : min(self.capacity, self.micros + gained)
        // Only whole microseconds were counted; the rest counts next time.
        self.updated = TetherInstant(nanoseconds: now.nanoseconds - elapsed % 1000)
    }

    /// The whole tokens available at `now`.
    package mutating func available(now: TetherInstant) -> Int {
        self.refill(now: now)
        return Int(self.micros / 1_000_000)
    }

    /// How many tokens a pacer waits for at a time: a hundredth of a second's worth, at least one.
    package var pacingQuantum: Int { max(1, self.perSecond / 100) }

    /// Whether the bucket is full at `now` (nothing was taken for a second).
    package mutating func isFull(now: TetherInstant) -> Bool {
        self.refill(now: now)
        return self.micros >= self.capacity
    }

    /// Takes a token if there is one.
    package mutating func take(now: TetherInstant) -> Bool {
        self.take(1, now: now) == 1
    }

    /// Takes up to `count` tokens.
    /// - Returns: How many were taken.
    package mutating func take(_ count: Int, now: TetherInstant) -> Int {
        self.refill(now: now)
        let taken = min(count, Int(self.micros / 1_000_000))
        self.micros -= Int64(taken) * 1_000_000
        return taken
    }

    /// When the next whole token is available (`now` if one is).
    package mutating func nextToken(now: TetherInstant) -> TetherInstant {
        self.nextTokens(1, now: now)
    }

    /// When `count` whole tokens are available (at most a burst's worth; `now` if they are).
    ///
    /// A pacer waits for a few tokens at a time (``pacingQuantum``), not one: at thousands per
    /// second, a timer per token would cost more than the work it paces.
    package mutating func nextTokens(_ count: Int, now: TetherInstant) -> TetherInstant {
        self.refill(now: now)
        let missing = Int64(min(max(1, count), self.perSecond)) * 1_000_000 - self.micros
        guard missing > 0 else { return now }
        // Rounded up to the microsecond in which the missing micro-tokens have refilled.
        let microseconds = (missing + Int64(self.perSecond) - 1) / Int64(self.perSecond)
        return self.updated + .microseconds(microseconds)
    }
}
