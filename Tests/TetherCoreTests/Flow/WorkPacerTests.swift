import Testing

@testable import TetherCore

/// Work charged by the byte: a burst up to the rate, then a pause until the rate paid for it.
@Suite("Work pacer")
struct WorkPacerTests {
    static let start = TetherInstant(nanoseconds: 1_000_000_000)

    @Test("work within the burst pauses nothing; beyond it, until the rate has paid the debt")
    func pacing() {
        var pacer = WorkPacer(perSecond: 1000, now: Self.start)
        #expect(pacer.charge(600, now: Self.start) == nil)
        #expect(pacer.charge(400, now: Self.start) == nil, "the whole burst")
        let until = pacer.charge(500, now: Self.start)
        #expect(until == Self.start + .milliseconds(500), "500 bytes of debt at 1,000 per second")
        #expect(pacer.debt == 500)
        #expect(pacer.charge(0, now: Self.start + .milliseconds(250)) == Self.start + .milliseconds(500), "half paid")
        #expect(pacer.charge(0, now: Self.start + .milliseconds(500)) == nil)
        #expect(pacer.debt == 0)
    }
}

extension GatewayConnectionStateMachineTests {
    @Test("compression beyond the connection's rate holds its reads until the rate allows; the timer says when")
    func compressionPaced() throws {
        var configuration = Self.configuration()
        configuration.compressionBytesPerSecond = 1 << 20
        var machine = try Self.established(configuration)
        machine.compressed(512 << 10, now: Self.start)
        #expect(!machine.holdsReads, "within the burst")
        machine.compressed(1 << 20, now: Self.start)
        #expect(machine.holdsReads)
        let until = try #require(machine.compressionPausedUntil)
        #expect(until == Self.start + .milliseconds(500))
        #expect(machine.nextDeadline(now: Self.start) == until)
        _ = machine.timerFired(now: Self.start + .milliseconds(499))
        #expect(machine.holdsReads)
        _ = machine.timerFired(now: until)
        #expect(!machine.holdsReads, "paid: reads go on")

        var unlimited = try Self.established()
        unlimited.compressed(1 << 30, now: Self.start)
        #expect(!unlimited.holdsReads, "without a rate, nothing is paced")
    }
}
