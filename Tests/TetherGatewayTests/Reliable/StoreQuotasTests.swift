import Testing

@testable import TetherCore
@testable import TetherGateway

@Suite("Store quotas")
struct StoreQuotasTests {
    @Test("quotas set to Int.max (turned off) give room without trapping, before and after deliveries are stored")
    func unlimited() throws {
        var limits = GatewayConfiguration.Limits.defaults
        limits.maxDeliveriesPerSenderPerMinute = .max
        limits.maxDeliveryBytesPerSenderPerMinute = .max
        limits.maxStoredDeliveries = .max
        limits.maxStoredDeliveryBytes = .max
        try limits.validate()
        let quotas = StoreQuotas(limits: limits)
        let start = TetherInstant(nanoseconds: 1_000_000_000)
        let first = quotas.allowances(for: "alice", now: start)
        #expect(first.map(\.deliveries) == [.max])
        #expect(first.map(\.bytes) == [.max])
        quotas.stored(by: "alice", deliveries: 150_000, bytes: 4_800_000, now: start)
        let later = quotas.allowances(for: "alice", now: start + .milliseconds(10))
        #expect(later.allSatisfy { $0.deliveries > 1 << 62 && $0.bytes > 1 << 62 })
    }

    @Test("the per-sender room: the default quota shrinks by what was stored and refills over the minute")
    func perSenderRoom() {
        var limits = GatewayConfiguration.Limits.defaults
        limits.maxDeliveriesPerSenderPerMinute = 600
        limits.maxDeliveryBytesPerSenderPerMinute = 60_000
        let quotas = StoreQuotas(limits: limits)
        let start = TetherInstant(nanoseconds: 1_000_000_000)
        #expect(quotas.allowances(for: "alice", now: start).map(\.deliveries) == [600])
        quotas.stored(by: "alice", deliveries: 600, bytes: 6_000, now: start)
        #expect(quotas.allowances(for: "alice", now: start).map(\.deliveries) == [0])
        #expect(quotas.allowances(for: "alice", now: start + .seconds(6)).map(\.deliveries) == [60])
        #expect(quotas.allowances(for: "bob", now: start).map(\.deliveries) == [600])
    }

    @Test("whole(_:) rounds down and holds Int.max's Double, 2^63")
    func whole() {
        #expect(StoreQuotas.whole(Double(Int.max)) == .max)
        #expect(StoreQuotas.whole(1e300) == .max)
        #expect(StoreQuotas.whole(41.9) == 41)
        #expect(StoreQuotas.whole(-3) == 0)
    }
}
