import Testing

@testable import TetherCore

@Suite("Tether instants and durations")
struct TetherInstantTests {
    @Test("arithmetic with durations, both ways, and saturation at the bounds")
    func arithmetic() {
        let start = TetherInstant(nanoseconds: 1_000)
        #expect(start + .milliseconds(2) == TetherInstant(nanoseconds: 2_001_000))
        #expect((start + .seconds(3)) - start == .seconds(3))
        #expect(start - .nanoseconds(500) == TetherInstant(nanoseconds: 500))
        #expect(start + .seconds(Int64.max) == .distantFuture, "saturates instead of wrapping")
        #expect(Duration.seconds(Int64.max).nanoseconds == .max)
        #expect(Duration.milliseconds(1500).nanoseconds == 1_500_000_000)
        #expect(Duration.milliseconds(-2).wholeMilliseconds == -2)
    }

    @Test("the system clock reads NIO's monotonic time, so an instant is a NIODeadline exactly; its wall clock moves")
    func systemClock() {
        let clock = SystemClock()
        let first = clock.now
        let second = clock.now
        #expect(second >= first)
        #expect(clock.wallClockMilliseconds > 1_700_000_000_000)
    }
}
