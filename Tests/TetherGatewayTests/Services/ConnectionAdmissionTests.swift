import NIOCore
import Testing
import TetherCore

@testable import TetherGateway

/// The connection limits, event by event, on a clock passed in.
@Suite("Connection admission")
struct ConnectionAdmissionTests {
    static let start = TetherInstant(nanoseconds: 1_000_000_000)

    func admission(
        connections: Int = 100,
        perAddress: Int = 100,
        unauthenticated: Int = 100,
        perSecond: Int = 1000,
        perSecondPerAddress: Int = 1000
    ) -> ConnectionAdmission {
        ConnectionAdmission(
            limits: .init(
                connections: connections,
                connectionsPerAddress: perAddress,
                unauthenticated: unauthenticated,
                handshakesPerSecond: perSecond,
                handshakesPerSecondPerAddress: perSecondPerAddress
            ),
            now: Self.start
        )
    }

    @Test("connections in all: the one over the limit is refused, saying so; a closed one makes room")
    func total() {
        let admission = self.admission(connections: 2)
        #expect(admission.admit("10.0.0.1", now: Self.start) == nil)
        #expect(admission.admit("10.0.0.2", now: Self.start) == nil)
        let refusal = admission.admit("10.0.0.3", now: Self.start)
        #expect(refusal?.report.code == .resourceExhausted && refusal?.report.message.contains("maximum of 2 connections") == true)
        #expect(refusal?.limit == "connections")
        admission.left("10.0.0.1", authenticated: false)
        #expect(admission.admit("10.0.0.3", now: Self.start) == nil)
        #expect(admission.counts == (2, 2))
    }

    @Test("per source address: one address at its limit does not stop the others")
    func perAddress() {
        let admission = self.admission(perAddress: 2)
        #expect(admission.admit("10.0.0.1", now: Self.start) == nil)
        #expect(admission.admit("10.0.0.1", now: Self.start) == nil)
        #expect(admission.admit("10.0.0.1", now: Self.start)?.report.message.contains("10.0.0.1 holds its maximum of 2") == true)
        #expect(admission.admit("10.0.0.2", now: Self.start) == nil)
        admission.left("10.0.0.1", authenticated: true)
        admission.authenticated()
        #expect(admission.admit("10.0.0.1", now: Self.start) == nil)
    }

    @Test("before the handshake: only so many; an authenticated connection no longer counts there")
    func unauthenticated() {
        let admission = self.admission(unauthenticated: 2)
        #expect(admission.admit("a", now: Self.start) == nil)
        #expect(admission.admit("b", now: Self.start) == nil)
        #expect(admission.admit("c", now: Self.start)?.report.message.contains("waiting for their handshake") == true)
        admission.authenticated()
        #expect(admission.admit("c", now: Self.start) == nil)
        #expect(admission.counts == (3, 2))
    }

    @Test("new connections per second from one address: a burst up to the rate, then a token every 1/rate s")
    func ratePerAddress() {
        let admission = self.admission(perSecondPerAddress: 2)
        #expect(admission.admit("a", now: Self.start) == nil)
        #expect(admission.admit("a", now: Self.start) == nil)
        let perAddress = admission.admit("a", now: Self.start)
        #expect(perAddress?.report.message.contains("2 new connections per second from a") == true)
        #expect(perAddress?.limit == "handshake_rate_per_address")
        #expect(admission.admit("b", now: Self.start) == nil, "another address has its own rate")
        #expect(admission.admit("a", now: Self.start + .milliseconds(499)) != nil, "half a token is not enough")
        #expect(admission.admit("a", now: Self.start + .milliseconds(500)) == nil)
    }

    @Test("closing its connections does not reset an address's rate")
    func rateOutlivesConnections() {
        let admission = self.admission(perSecondPerAddress: 2)
        for _ in 0..<2 {
            #expect(admission.admit("a", now: Self.start) == nil)
            admission.left("a", authenticated: false)
        }
        #expect(admission.admit("a", now: Self.start + .milliseconds(100)) != nil)
        // A second later the idle, refilled address is forgotten, and starts afresh.
        #expect(admission.admit("b", now: Self.start + .seconds(2)) == nil)
        #expect(admission.admit("a", now: Self.start + .seconds(2)) == nil)
        #expect(admission.admit("a", now: Self.start + .seconds(2)) == nil)
    }

    @Test("new connections per second in all")
    func rate() {
        let admission = self.admission(perSecond: 3)
        for address in ["a", "b", "c"] { #expect(admission.admit(address, now: Self.start) == nil) }
        #expect(admission.admit("d", now: Self.start)?.report.message.contains("3 new connections per second") == true)
        #expect(admission.admit("d", now: Self.start + .milliseconds(340)) == nil)
        #expect(admission.counts.connections == 4, "the refusal did not count")
    }
}
