/// Paces work that costs by the byte (inflating and deflating payloads): up to `perSecond` bytes
/// in a burst, refilled at `perSecond` bytes per second. Work is charged after it was done; work
/// beyond the rate is a debt, and the connection pauses its reads until the rate has paid it.
///
/// ```swift
/// var pacer = WorkPacer(perSecond: 8 << 20, now: clock.now)
/// if let until = pacer.charge(inflated, now: clock.now) { holdReads(until: until) }
/// ```
package struct WorkPacer: Sendable, Hashable {
    private var bucket: TokenBucket
    /// Bytes of work done beyond the rate, not paid yet.
    package private(set) var debt = 0

    package init(perSecond: Int, now: TetherInstant) {
        self.bucket = TokenBucket(perSecond: perSecond, now: now)
    }

    /// Charges `bytes` of work done.
    /// - Returns: Until when reads pause, if the work went beyond the rate; `nil` if it did not.
    package mutating func charge(_ bytes: Int, now: TetherInstant) -> TetherInstant? {
        self.debt += bytes
        self.debt -= self.bucket.take(self.debt, now: now)
        guard self.debt > 0 else { return nil }
        return self.bucket.nextTokens(self.debt, now: now)
    }
}
