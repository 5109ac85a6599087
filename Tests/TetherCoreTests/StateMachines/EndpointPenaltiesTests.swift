import Testing
import TetherCore

@Suite("Endpoint penalties")
struct EndpointPenaltiesTests {
    let a = Endpoint(host: "a", port: 1)
    let b = Endpoint(host: "b", port: 1)
    let c = Endpoint(host: "c", port: 1)
    /// A fixed origin: the tests move time by hand, never by reading the clock again.
    let start = ContinuousClock.now

    func at(_ seconds: Int64) -> ContinuousClock.Instant { self.start.advanced(by: .seconds(seconds)) }

    @Test("attempts rotate from the chosen endpoint; a penalized one goes last until its penalty ends")
    func order() {
        var penalties = EndpointPenalties<ContinuousClock.Instant>(duration: .seconds(30))
        #expect(penalties.order([a, b, c], from: b, at: self.at(0)) == [b, c, a])
        penalties.penalize(b, at: self.at(0))
        #expect(penalties.isPenalized(b, at: self.at(29)))
        #expect(penalties.order([a, b, c], from: b, at: self.at(29)) == [c, a, b])
        #expect(!penalties.isPenalized(b, at: self.at(30)))
        #expect(penalties.order([a, b, c], from: b, at: self.at(30)) == [b, c, a])
    }

    @Test("when every endpoint is penalized, all are still tried, in rotation order")
    func allPenalized() {
        var penalties = EndpointPenalties<ContinuousClock.Instant>(duration: .seconds(30))
        for endpoint in [a, b, c] { penalties.penalize(endpoint, at: self.at(0)) }
        #expect(penalties.order([a, b, c], from: c, at: self.at(1)) == [c, a, b])
    }

    @Test("an endpoint outside the list comes first; a zero duration penalizes nothing")
    func edges() {
        var penalties = EndpointPenalties<ContinuousClock.Instant>(duration: .zero)
        let d = Endpoint(host: "d", port: 1)
        #expect(penalties.order([a, b], from: d, at: self.at(0)) == [d, a, b])
        penalties.penalize(a, at: self.at(0))
        #expect(!penalties.isPenalized(a, at: self.at(0)))
    }
}
