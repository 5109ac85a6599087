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

    /// The ticket of an admitted connection; `nil` (and an issue recorded) if refused.
    @discardableResult
    func admitted(
        _ admission: ConnectionAdmission,
        _ address: String,
        kind: ConnectionAdmission.Kind = .tether,
        at now: TetherInstant = start
    ) -> ConnectionAdmission.Ticket? {
        switch admission.admit(address, kind: kind, now: now) {
        case .success(let ticket): return ticket
        case .failure(let refusal):
            Issue.record("\(address) refused: \(refusal.report.message)")
            return nil
        }
    }

    /// Why `address` is refused; `nil` (and an issue recorded) if it is admitted.
    func refusal(
        _ admission: ConnectionAdmission,
        _ address: String,
        kind: ConnectionAdmission.Kind = .tether,
        at now: TetherInstant = start
    ) -> ConnectionAdmission.Refusal? {
        switch admission.admit(address, kind: kind, now: now) {
        case .success:
            Issue.record("\(address) admitted")
            return nil
        case .failure(let refusal): return refusal
        }
    }

    @Test("connections in all: the one over the limit is refused, saying so; a closed one makes room")
    func total() {
        let admission = self.admission(connections: 2)
        let first = self.admitted(admission, "10.0.0.1")
        self.admitted(admission, "10.0.0.2")
        let refusal = self.refusal(admission, "10.0.0.3")
        #expect(refusal?.report.code == .resourceExhausted && refusal?.report.message.contains("maximum of 2 connections") == true)
        #expect(refusal?.limit == "connections")
        if let first { admission.left(first) }
        self.admitted(admission, "10.0.0.3")
        #expect(admission.counts == (2, 2))
    }

    @Test("per source address: one address at its limit does not stop the others")
    func perAddress() {
        let admission = self.admission(perAddress: 2)
        var first = self.admitted(admission, "10.0.0.1")
        self.admitted(admission, "10.0.0.1")
        #expect(self.refusal(admission, "10.0.0.1")?.report.message.contains("10.0.0.1 holds its maximum of 2") == true)
        self.admitted(admission, "10.0.0.2")
        if first != nil {
            admission.authenticated(&first!)
            admission.left(first!)
        }
        self.admitted(admission, "10.0.0.1")
    }

    @Test("before the handshake: only so many; an authenticated connection no longer counts there")
    func unauthenticated() {
        let admission = self.admission(unauthenticated: 2)
        var first = self.admitted(admission, "a")
        self.admitted(admission, "b")
        #expect(self.refusal(admission, "c")?.report.message.contains("waiting for their handshake") == true)
        if first != nil { admission.authenticated(&first!) }
        self.admitted(admission, "c")
        #expect(admission.counts == (3, 2))
    }

    @Test("new connections per second from one address: a burst up to the rate, then a token every 1/rate s")
    func ratePerAddress() {
        let admission = self.admission(perSecondPerAddress: 2)
        self.admitted(admission, "a")
        self.admitted(admission, "a")
        let perAddress = self.refusal(admission, "a")
        #expect(perAddress?.report.message.contains("2 new connections per second from a") == true)
        #expect(perAddress?.limit == "handshake_rate_per_address")
        self.admitted(admission, "b")  // another address has its own rate
        _ = self.refusal(admission, "a", at: Self.start + .milliseconds(499))  // half a token is not enough
        self.admitted(admission, "a", at: Self.start + .milliseconds(500))
    }

    @Test("closing its connections does not reset an address's rate")
    func rateOutlivesConnections() {
        let admission = self.admission(perSecondPerAddress: 2)
        for _ in 0..<2 {
            if let ticket = self.admitted(admission, "a") { admission.left(ticket) }
        }
        _ = self.refusal(admission, "a", at: Self.start + .milliseconds(100))
        // A second later the idle, refilled address is forgotten, and starts afresh.
        self.admitted(admission, "b", at: Self.start + .seconds(2))
        self.admitted(admission, "a", at: Self.start + .seconds(2))
        self.admitted(admission, "a", at: Self.start + .seconds(2))
    }

    @Test("new connections per second in all")
    func rate() {
        let admission = self.admission(perSecond: 3)
        for address in ["a", "b", "c"] { self.admitted(admission, address) }
        #expect(self.refusal(admission, "d")?.report.message.contains("3 new connections per second") == true)
        self.admitted(admission, "d", at: Self.start + .milliseconds(340))
        #expect(admission.counts.connections == 4, "the refusal did not count")
    }

    @Test("connections carrying POSTs count against the connections, not against those waiting for a handshake")
    func posts() {
        let admission = self.admission(connections: 4, perAddress: 2, unauthenticated: 1)
        self.admitted(admission, "a")
        #expect(self.refusal(admission, "b")?.limit == "unauthenticated")
        let posts = self.admitted(admission, "b", kind: .posts)
        #expect(posts?.authenticated == true)
        #expect(admission.counts == (2, 1))
        self.admitted(admission, "b", kind: .posts)
        #expect(self.refusal(admission, "b", kind: .posts)?.limit == "connections_per_address")
        self.admitted(admission, "c", kind: .posts)
        #expect(self.refusal(admission, "d", kind: .posts)?.limit == "connections")
        if let posts { admission.left(posts) }
        #expect(admission.counts == (3, 1))
    }

    @Test("charges: an HTTP/2 client's resets take its address's new-connection tokens")
    func charges() {
        let admission = self.admission(perSecondPerAddress: 3)
        #expect(admission.charge("a", now: Self.start))
        #expect(admission.charge("a", now: Self.start))
        self.admitted(admission, "a")
        #expect(!admission.charge("a", now: Self.start))
        #expect(self.refusal(admission, "a")?.limit == "handshake_rate_per_address")
        #expect(admission.charge("b", now: Self.start), "another address has its own rate")
        #expect(admission.charge(nil, now: Self.start), "no address: nothing to charge")
    }

    @Test("refusals over HTTP: 429 for a rate, 503 for a count, each with Retry-After")
    func http() {
        let admission = self.admission(perAddress: 1, perSecondPerAddress: 2)
        self.admitted(admission, "a")
        let count = self.refusal(admission, "a")
        #expect(count?.http.status == .serviceUnavailable)
        #expect(count?.http.retryAfter == .seconds(5))
        for _ in 0..<2 {
            if let ticket = self.admitted(admission, "b") { admission.left(ticket) }
        }
        let rate = self.refusal(admission, "b")
        #expect(rate?.limit == "handshake_rate_per_address")
        #expect(rate?.http.status == .tooManyRequests)
        #expect(rate?.http.retryAfter == .seconds(1))
    }
}
