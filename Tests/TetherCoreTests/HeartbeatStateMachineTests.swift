import NIOCore
import Testing

@testable import TetherCore

@Suite("Heartbeat state machine")
struct HeartbeatStateMachineTests {
    let start = NIODeadline.uptimeNanoseconds(1_000_000_000)

    func at(_ milliseconds: Int64) -> NIODeadline { self.start + .milliseconds(milliseconds) }

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
