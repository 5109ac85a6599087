import Testing

@testable import TetherCore

@Suite("Alert monitor")
struct AlertMonitorTests {
    static let start = TetherInstant(nanoseconds: 0)

    @Test("reconnections raise one alert when they reach the threshold within the window, and again only after they fell below it")
    func reconnects() {
        var monitor = AlertMonitor(thresholds: .init(window: .seconds(60), reconnects: 3))
        #expect(monitor.reconnected(at: Self.start) == nil)
        #expect(monitor.reconnected(at: Self.start + .seconds(10)) == nil)
        #expect(monitor.reconnected(at: Self.start + .seconds(20)) == .reconnects(count: 3, window: .seconds(60)))
        #expect(monitor.reconnected(at: Self.start + .seconds(30)) == nil, "the same episode")
        #expect(monitor.reconnected(at: Self.start + .seconds(40)) == nil)
        // A quiet spell longer than the window: the count falls to one, and the next flap alerts again.
        #expect(monitor.reconnected(at: Self.start + .seconds(200)) == nil)
        #expect(monitor.reconnected(at: Self.start + .seconds(201)) == nil)
        #expect(monitor.reconnected(at: Self.start + .seconds(202)) == .reconnects(count: 3, window: .seconds(60)))
    }

    @Test("events older than the window do not count")
    func window() {
        var monitor = AlertMonitor(thresholds: .init(window: .seconds(10), heartbeatLosses: 2))
        #expect(monitor.heartbeatLost(at: Self.start) == nil)
        #expect(monitor.heartbeatLost(at: Self.start + .seconds(11)) == nil, "the first one left the window")
        #expect(monitor.heartbeatLost(at: Self.start + .seconds(12)) == .heartbeatLosses(count: 2, window: .seconds(10)))
    }

    @Test("a slow round trip alerts once until a round trip under the threshold; thresholds left out never alert")
    func roundTrip() {
        var monitor = AlertMonitor(thresholds: .init(window: .seconds(60), roundTrip: .milliseconds(500)))
        #expect(monitor.roundTrip(.milliseconds(100)) == nil)
        #expect(monitor.roundTrip(.milliseconds(900)) == .slowRoundTrip(.milliseconds(900)))
        #expect(monitor.roundTrip(.milliseconds(800)) == nil)
        #expect(monitor.roundTrip(.milliseconds(100)) == nil)
        #expect(monitor.roundTrip(.milliseconds(700)) == .slowRoundTrip(.milliseconds(700)))
        for second in 0..<100 {
            #expect(monitor.reconnected(at: Self.start + .seconds(second)) == nil)
            #expect(monitor.heartbeatLost(at: Self.start + .seconds(second)) == nil)
        }
    }
}
