import NIOCore
import Testing

@testable import TetherCore

@Suite("Heartbeat state machine")
struct HeartbeatStateMachineTests {
    let start = TetherInstant(nanoseconds: 1_000_000_000)

    func at(_ milliseconds: Int64) -> TetherInstant { self.start + .milliseconds(milliseconds) }

    @Test("an idle link is pinged after one interval and declared dead one timeout later")
    func silentLink() {
        var heartbeat = HeartbeatStateMachine(interval: .seconds(10), timeout: .seconds(5), now: self.start)
        #expect(heartbeat.nextDeadline == self.at(10_000))
        #expect(heartbeat.timerFired(at: self.at(9_999)) == .none)
        #expect(heartbeat.timerFired(at: self.at(10_000)) == .sendPing(id: 1))
        #expect(heartbeat.nextDeadline == self.at(15_000))
        #expect(heartbeat.timerFired(at: self.at(14_000)) == .none)
        #expect(heartbeat.timerFired(at: self.at(15_000)) == .linkDead(silentFor: .seconds(15)))
    }

    @Test("any inbound frame proves liveness, not only the PONG")
    func anyFrameCounts() {
        var heartbeat = HeartbeatStateMachine(interval: .seconds(10), timeout: .seconds(5), now: self.start)
        #expect(heartbeat.timerFired(at: self.at(10_000)) == .sendPing(id: 1))
        heartbeat.frameReceived(at: self.at(12_000))  // a PUSH, say
        #expect(heartbeat.timerFired(at: self.at(15_000)) == .none)
        #expect(heartbeat.nextDeadline == self.at(20_000))
    }

    @Test("a PONG measures the round trip of its own PING only")
    func roundTrip() {
        var heartbeat = HeartbeatStateMachine(interval: .seconds(1), timeout: .seconds(1), now: self.start)
        #expect(heartbeat.timerFired(at: self.at(1_000)) == .sendPing(id: 1))
        heartbeat.frameReceived(at: self.at(1_030))
        #expect(heartbeat.pongReceived(id: 99, at: self.at(1_030)) == nil)
        #expect(heartbeat.pongReceived(id: 1, at: self.at(1_030)) == .milliseconds(30))
        #expect(heartbeat.lastRoundTrip == .milliseconds(30))
        #expect(heartbeat.pongReceived(id: 1, at: self.at(1_040)) == nil, "a PONG counts once")
    }

    @Test("a PING after a whole interval of silence both ways is an idle probe; its answer or the link's death reports it")
    func idleProbes() {
        var heartbeat = HeartbeatStateMachine(interval: .seconds(10), timeout: .seconds(5), now: self.start)
        #expect(heartbeat.timerFired(at: self.at(10_000)) == .sendPing(id: 1))
        let probe = HeartbeatStateMachine.IdleProbe(interval: .seconds(10), silence: .seconds(10))
        #expect(heartbeat.outstandingIdleProbe == probe)
        #expect(heartbeat.frameReceived(at: self.at(10_050)) == probe)
        #expect(heartbeat.outstandingIdleProbe == nil)
        #expect(heartbeat.frameReceived(at: self.at(10_060)) == nil, "an answer counts once")
        // The next PING comes one interval after the last one, a round trip less after its PONG.
        #expect(heartbeat.timerFired(at: self.at(20_000)) == .sendPing(id: 2))
        #expect(heartbeat.outstandingIdleProbe == .init(interval: .seconds(10), silence: .milliseconds(9_940)))

        // Sent 4 s ago (a request, say), received nothing for 10 s: the PING is due, but the
        // link was not silent both ways for a whole interval, so it proves nothing about a NAT.
        var busy = HeartbeatStateMachine(interval: .seconds(10), timeout: .seconds(5), now: self.start)
        busy.frameSent(at: self.at(6_000))
        #expect(busy.timerFired(at: self.at(10_000)) == .sendPing(id: 1))
        #expect(busy.outstandingIdleProbe == nil)

        // The link dies while an idle probe waits: the probe is still there for the driver.
        var dying = HeartbeatStateMachine(interval: .seconds(10), timeout: .seconds(5), now: self.start)
        #expect(dying.timerFired(at: self.at(10_000)) == .sendPing(id: 1))
        #expect(dying.timerFired(at: self.at(15_000)) == .linkDead(silentFor: .seconds(15)))
        #expect(dying.outstandingIdleProbe?.interval == .seconds(10))
    }

    @Test("a probe on demand pings at once, unless a PING already waits for its answer")
    func probeNow() {
        var heartbeat = HeartbeatStateMachine(interval: .seconds(60), timeout: .seconds(3), now: self.start)
        #expect(heartbeat.probeNow(at: self.at(2_000)) == .sendPing(id: 1))
        #expect(heartbeat.outstandingIdleProbe == nil, "an on-demand probe is not an idle probe")
        #expect(heartbeat.nextDeadline == self.at(5_000))
        #expect(heartbeat.probeNow(at: self.at(2_500)) == .none)
        #expect(heartbeat.timerFired(at: self.at(5_000)) == .linkDead(silentFor: .seconds(5)))
    }

    @Test("traffic in both directions postpones the PING")
    func busyLink() {
        var heartbeat = HeartbeatStateMachine(interval: .seconds(10), timeout: .seconds(5), now: self.start)
        for second in stride(from: Int64(1), through: 30, by: 1) {
            heartbeat.frameSent(at: self.at(second * 1000))
            heartbeat.frameReceived(at: self.at(second * 1000 + 10))
            #expect(heartbeat.timerFired(at: self.at(second * 1000 + 10)) == .none)
        }
        #expect(heartbeat.nextDeadline == self.at(40_000))
    }

    @Test("a link in use that falls silent is probed after the stall interval, not the full interval")
    func stalledLink() {
        let fixed = RTTEstimator(initialTimeout: .seconds(2), minimumTimeout: .seconds(2), maximumTimeout: .seconds(2))
        var heartbeat = HeartbeatStateMachine(
            configuration: .init(interval: .seconds(10), timeout: fixed, stallInterval: .seconds(1)),
            now: self.start
        )
        // Answers keep coming: no probe.
        heartbeat.frameSent(at: self.at(100))
        heartbeat.frameReceived(at: self.at(150))
        #expect(heartbeat.nextDeadline == self.at(10_100))
        // Sent after the last answer, then silence (TCP stuck retransmitting): probe at 1 s.
        heartbeat.frameSent(at: self.at(500))
        #expect(heartbeat.nextDeadline == self.at(1_150))
        #expect(heartbeat.timerFired(at: self.at(1_150)) == .sendPing(id: 1))
        #expect(heartbeat.timerFired(at: self.at(3_150)) == .linkDead(silentFor: .milliseconds(3_000)))

        // The PONG arrives instead: back to the idle interval.
        var healthy = HeartbeatStateMachine(
            configuration: .init(interval: .seconds(10), timeout: fixed, stallInterval: .seconds(1)),
            now: self.start
        )
        healthy.frameSent(at: self.at(500))
        #expect(healthy.timerFired(at: self.at(1_000)) == .sendPing(id: 1))
        healthy.frameReceived(at: self.at(1_200))
        #expect(healthy.nextDeadline == self.at(11_000))
    }

    @Test("a client that only receives still pings so that the gateway sees it")
    func receiveOnly() {
        var heartbeat = HeartbeatStateMachine(interval: .seconds(10), timeout: .seconds(5), now: self.start)
        heartbeat.frameReceived(at: self.at(9_000))
        #expect(heartbeat.timerFired(at: self.at(10_000)) == .sendPing(id: 1))
    }

    @Test("a link that sends but never receives is declared dead")
    func sendOnly() {
        var heartbeat = HeartbeatStateMachine(interval: .seconds(10), timeout: .seconds(5), now: self.start)
        heartbeat.frameSent(at: self.at(5_000))
        #expect(heartbeat.timerFired(at: self.at(10_000)) == .sendPing(id: 1))
        heartbeat.frameSent(at: self.at(11_000))
        #expect(heartbeat.timerFired(at: self.at(15_000)) == .linkDead(silentFor: .seconds(15)))
    }
}

@Suite("Heartbeat state machine, adaptive")
struct AdaptiveHeartbeatTests {
    let start = TetherInstant(nanoseconds: 1_000_000_000)

    func at(_ milliseconds: Int64) -> TetherInstant { self.start + .milliseconds(milliseconds) }

    func configuration(jitter: Double = 0, suspensionThreshold: Duration? = .seconds(2)) -> HeartbeatStateMachine.Configuration {
        .init(
            interval: .seconds(10),
            jitter: jitter,
            timeout: RTTEstimator(initialTimeout: .seconds(5), minimumTimeout: .seconds(1), maximumTimeout: .seconds(8)),
            suspensionThreshold: suspensionThreshold,
            probeTimeout: .seconds(2)
        )
    }

    /// Pings at the deadline and answers after `roundTrip`; returns the next deadline.
    mutating func exchange(_ heartbeat: inout HeartbeatStateMachine, roundTrip: Duration) -> Duration {
        let sentAt = heartbeat.nextDeadline
        guard case .sendPing(let id) = heartbeat.timerFired(at: sentAt) else {
            Issue.record("expected a PING")
            return .zero
        }
        heartbeat.frameReceived(at: sentAt + roundTrip)
        heartbeat.pongReceived(id: id, at: sentAt + roundTrip)
        return heartbeat.timeout
    }

    @Test("the PONG timeout starts at its initial value, then follows the round trips within floor and ceiling")
    mutating func adaptiveTimeout() {
        var heartbeat = HeartbeatStateMachine(configuration: self.configuration(), now: self.start)
        #expect(heartbeat.timeout == .seconds(5))
        var timeout = Duration.zero
        for _ in 0..<10 { timeout = self.exchange(&heartbeat, roundTrip: .milliseconds(50)) }
        #expect(timeout == .seconds(1), "a fast link: the floor")
        for _ in 0..<3 { timeout = self.exchange(&heartbeat, roundTrip: .milliseconds(1_500)) }
        #expect(timeout > .seconds(2) && timeout <= .seconds(8), "slower round trips stretch it: \(timeout)")
        for _ in 0..<20 { timeout = self.exchange(&heartbeat, roundTrip: .seconds(20)) }
        #expect(timeout == .seconds(8), "never beyond the ceiling")
        // The PING after the exchanges waits exactly the derived timeout.
        let sentAt = heartbeat.nextDeadline
        #expect(heartbeat.timerFired(at: sentAt) != .none)
        #expect(heartbeat.nextDeadline == sentAt + .seconds(8))
        guard case .linkDead = heartbeat.timerFired(at: sentAt + .seconds(8)) else {
            Issue.record("no answer within the derived timeout: the link is dead")
            return
        }
    }

    @Test("jitter shortens each interval by up to its fraction, reproducibly for a seed")
    func jitter() {
        func intervals(seed: UInt64) -> [Duration] {
            var heartbeat = HeartbeatStateMachine(
                configuration: self.configuration(jitter: 0.2),
                now: self.start,
                generator: SplitMix64(seed: seed)
            )
            var result: [Duration] = []
            var last = self.start
            for _ in 0..<20 {
                let deadline = heartbeat.nextDeadline
                result.append(deadline - last)
                _ = heartbeat.timerFired(at: deadline)
                heartbeat.frameReceived(at: deadline)
                last = deadline
            }
            return result
        }
        let first = intervals(seed: 1)
        #expect(first.allSatisfy { $0 > .seconds(8) && $0 <= .seconds(10) })
        #expect(Set(first).count > 10, "they vary")
        #expect(intervals(seed: 1) == first)
        #expect(intervals(seed: 2) != first)
    }

    @Test("a timer that fires long after its deadline sends a quick probe instead of judging the link")
    func suspensionWhileIdle() {
        var heartbeat = HeartbeatStateMachine(configuration: self.configuration(), now: self.start)
        // Due at 10 s; the process was suspended until 70 s.
        #expect(heartbeat.timerFired(at: self.at(70_000)) == .sendPing(id: 1))
        #expect(heartbeat.suspensions == 1)
        #expect(heartbeat.nextDeadline == self.at(72_000), "the probe's short timeout")
        #expect(heartbeat.timerFired(at: self.at(72_000)) == .linkDead(silentFor: .seconds(72)))
    }

    @Test("a PONG wait interrupted by a suspension is not a dead link: a new probe decides")
    func suspensionWhileWaiting() {
        var heartbeat = HeartbeatStateMachine(configuration: self.configuration(), now: self.start)
        #expect(heartbeat.timerFired(at: self.at(10_000)) == .sendPing(id: 1))
        // The PONG timeout (5 s) would end at 15 s; the timer runs at 45 s, after a suspension.
        #expect(heartbeat.timerFired(at: self.at(45_000)) == .sendPing(id: 2))
        // The answer to the first PING was waiting in the socket: the link is alive.
        heartbeat.frameReceived(at: self.at(45_001))
        #expect(heartbeat.pongReceived(id: 1, at: self.at(45_001)) == nil, "no round trip measured across a suspension")
        #expect(heartbeat.timeout == .seconds(5))
        #expect(heartbeat.nextDeadline == self.at(55_000), "one interval after the probe was sent")
    }

    @Test("a small delay is not a suspension; detection can be turned off")
    func lateButNotSuspended() {
        var heartbeat = HeartbeatStateMachine(configuration: self.configuration(), now: self.start)
        #expect(heartbeat.timerFired(at: self.at(11_000)) == .sendPing(id: 1))
        #expect(heartbeat.suspensions == 0)
        #expect(heartbeat.nextDeadline == self.at(16_000))
        var off = HeartbeatStateMachine(configuration: self.configuration(suspensionThreshold: nil), now: self.start)
        #expect(off.timerFired(at: self.at(10_000)) == .sendPing(id: 1))
        #expect(off.timerFired(at: self.at(60_000)) == .linkDead(silentFor: .seconds(60)))
    }

    @Test("a new interval (background mode) applies from the next deadline")
    func setInterval() {
        var heartbeat = HeartbeatStateMachine(configuration: self.configuration(), now: self.start)
        heartbeat.setInterval(.seconds(25))
        #expect(heartbeat.nextDeadline == self.at(25_000))
        heartbeat.setInterval(.seconds(4))
        #expect(heartbeat.timerFired(at: self.at(4_000)) == .sendPing(id: 1))
    }
}
