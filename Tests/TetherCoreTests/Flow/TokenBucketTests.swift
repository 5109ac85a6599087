import Testing

@testable import TetherCore

@Suite("Token bucket")
struct TokenBucketTests {
    static let start = TetherInstant(nanoseconds: 5_000_000_000)

    @Test("a burst up to the rate, then a token every 1/rate s; at most one second's worth is kept")
    func burstAndRefill() {
        var bucket = TokenBucket(perSecond: 4, now: Self.start)
        let burst = bucket.take(10, now: Self.start)
        #expect(burst == 4, "the burst")
        let early = bucket.take(now: Self.start + .milliseconds(249))
        #expect(!early, "not a whole token yet")
        let onTime = bucket.take(now: Self.start + .milliseconds(250))
        #expect(onTime)
        let later = bucket.available(now: Self.start + .seconds(60))
        #expect(later == 4, "one second's worth at most")
    }

    @Test("nextToken says when the next whole token is there, exactly: taking one then succeeds")
    func nextToken() {
        var bucket = TokenBucket(perSecond: 3, now: Self.start)
        _ = bucket.take(3, now: Self.start)
        let next = bucket.nextToken(now: Self.start)
        #expect(next == Self.start + .microseconds(333_334), "1/3 s, rounded up to the microsecond")
        let before = bucket.take(now: next - .microseconds(1))
        #expect(!before)
        let at = bucket.take(now: next)
        #expect(at)
        let ready = bucket.nextToken(now: next + .seconds(1))
        #expect(ready == next + .seconds(1), "a token is there: now")
    }

    @Test("over a long time the rate is exact: no drift from rounding")
    func noDrift() {
        var bucket = TokenBucket(perSecond: 7, now: Self.start)
        var now = Self.start
        var taken = bucket.take(7, now: now)
        for _ in 0..<10_000 {
            now = now + .microseconds(1_003)
            taken += bucket.take(1_000, now: now)
        }
        let elapsed = (now - Self.start).totalSeconds
        #expect(abs(Double(taken) - (7 + 7 * elapsed)) <= 1, "\(taken) tokens in \(elapsed) s")
    }
}
