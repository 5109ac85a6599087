import NIOCore
import Testing

@testable import TetherCore

@Suite("Delivery pump")
struct DeliveryPumpTests {
    static func deliveries(_ range: ClosedRange<UInt64>) -> [StoredDelivery] {
        range.map { StoredDelivery(sequence: $0, topic: "dm", body: ByteBuffer(string: "\($0)")) }
    }

    static let now = TetherInstant(nanoseconds: 1_000_000_000)

    @Test("on start it reads what waits after the resume point and records the resume point as acknowledged")
    func start() {
        var pump = DeliveryPump(resume: 5, window: 10)
        let actions = pump.start()
        #expect(actions.fetch?.after == 5 && actions.fetch?.limit == 10)
        #expect(actions.record == 5, "what the client has is acknowledged in the store")
        let sent = pump.fetched(Self.deliveries(6...8), limit: 10)
        #expect(sent.send.map(\.sequence) == [6, 7, 8] && sent.fetch == nil, "fewer than asked: nothing more waits")
        #expect(pump.lastSent == 8)
    }

    @Test("deliveries offered right after what was sent go out from memory, up to the window; the rest are read later")
    func offeredFromMemory() {
        var pump = DeliveryPump(resume: 0, window: 3)
        _ = pump.start()
        _ = pump.fetched([], limit: 3)
        let first = pump.offered(Self.deliveries(1...2))
        #expect(first.send.map(\.sequence) == [1, 2] && first.fetch == nil)
        let full = pump.offered(Self.deliveries(3...5))
        #expect(full.send.map(\.sequence) == [3], "the window holds three")
        let acked = pump.acknowledged(upTo: 3)
        #expect(acked.fetch?.after == 3 && acked.fetch?.limit == 3, "the rest is read from the store")
        #expect(acked.record == 3)
        #expect(acked.newlyAcknowledged == 3)
        #expect(pump.acknowledged(upTo: 99).newlyAcknowledged == 0, "nothing beyond what was sent")
    }

    @Test(
        "what the store forgot before the first delivery read (acknowledged on another connection of the client id) is said with the first, and is not in flight here"
    )
    func afterAcknowledgedElsewhere() {
        var shared = DeliveryPump(resume: 2, window: 4, sharedDeliveries: true)
        _ = shared.start()
        let jumped = shared.fetched(Self.deliveries(10...11), limit: 4)
        #expect(jumped.send.map(\.sequence) == [10, 11] && jumped.afterAcknowledged)
        #expect(shared.acknowledged == 9, "3...9 were acknowledged elsewhere: two in flight, not nine")
        let more = shared.offered(Self.deliveries(12...13))
        #expect(more.send.map(\.sequence) == [12, 13] && !more.afterAcknowledged, "the window of four holds them")

        var unaware = DeliveryPump(resume: 2, window: 4)
        _ = unaware.start()
        #expect(!unaware.fetched(Self.deliveries(10...11), limit: 4).afterAcknowledged, "a client without the feature is not told")
    }

    @Test("a gap, or an offer while a read is under way, makes it read from the store instead")
    func gapsAndRaces() {
        var pump = DeliveryPump(resume: 0, window: 10)
        _ = pump.start()  // reading
        let whileReading = pump.offered(Self.deliveries(1...1))
        #expect(whileReading.send.isEmpty && whileReading.fetch == nil, "the read under way may have missed it")
        let afterRead = pump.fetched([], limit: 10)
        #expect(afterRead.fetch?.after == 0, "read again: an offer came while reading")
        _ = pump.fetched(Self.deliveries(1...1), limit: 10)
        let gap = pump.offered(Self.deliveries(3...3))
        #expect(gap.send.isEmpty && gap.fetch?.after == 1, "2 is missing: read from the store")
    }

    @Test("acknowledgements are recorded one write at a time, the newest first; a failed write is retried with the next")
    func recording() {
        var pump = DeliveryPump(resume: 0, window: 10)
        _ = pump.start()
        _ = pump.fetched(Self.deliveries(1...5), limit: 10)
        #expect(pump.acknowledged(upTo: 2).record == 2)
        #expect(pump.acknowledged(upTo: 4).record == nil, "a write is under way")
        #expect(pump.recordFinished(true).record == 4, "then the newest")
        #expect(pump.recordFinished(false).record == nil)
        #expect(pump.recorded == 2)
        #expect(pump.acknowledged(upTo: 5).record == 5)
        #expect(pump.acknowledged(upTo: 99).record == nil, "nothing beyond what was sent is acknowledged")
        #expect(pump.acknowledged == 5)
    }

    @Test("a failed read is retried after the delay; while the connection is not writable nothing is read or sent")
    func retryAndWritability() {
        var pump = DeliveryPump(resume: 0, window: 10)
        _ = pump.start()
        pump.fetchFailed(now: Self.now)
        #expect(pump.timerFired(now: Self.now + .milliseconds(999)).fetch == nil)
        #expect(pump.timerFired(now: Self.now + DeliveryPump.retryDelay).fetch?.after == 0)
        _ = pump.fetched(Self.deliveries(1...1), limit: 10)
        #expect(pump.writabilityChanged(false).fetch == nil)
        let offered = pump.offered(Self.deliveries(2...2))
        #expect(offered.send.isEmpty, "not while the client does not read")
        #expect(pump.writabilityChanged(true).fetch?.after == 1)
    }
}
