import Testing

@testable import TetherCore

@Suite("Subscription machine")
struct SubscriptionMachineTests {
    static let epoch: UInt64 = 0xBEEF

    func at(_ offset: UInt64, epoch: UInt64 = Self.epoch) -> ChannelPosition {
        ChannelPosition(epoch: epoch, offset: offset)
    }

    /// A machine subscribed after `offset`.
    func subscribed(after offset: UInt64, recover: Bool = true) -> SubscriptionMachine {
        var machine = SubscriptionMachine(recover: recover)
        _ = machine.connected()
        _ = machine.subscribed(startingAfter: self.at(offset), gap: nil)
        return machine
    }

    @Test("first subscription: from the top; then each publication that follows is delivered, duplicates dropped")
    func firstSubscription() {
        var machine = SubscriptionMachine(recover: true)
        #expect(machine.connected() == .subscribe(from: nil))
        #expect(machine.received(self.at(1)) == .drop)  // not subscribed yet
        #expect(machine.subscribed(startingAfter: self.at(5), gap: nil) == .report(.subscribed(recovered: true)))
        #expect(machine.received(self.at(6)) == .deliver)
        #expect(machine.received(self.at(6)) == .drop)
        #expect(machine.received(self.at(4)) == .drop)
        #expect(machine.received(self.at(7)) == .deliver)
        #expect(machine.position == self.at(7))
    }

    @Test("a publication that skips offsets, or comes from another epoch, is not delivered: subscribe again from the position")
    func outOfOrder() {
        var machine = self.subscribed(after: 5)
        #expect(machine.received(self.at(8)) == .resubscribe(from: self.at(5)))
        #expect(machine.state == .subscribing(position: self.at(5)))
        #expect(machine.received(self.at(6)) == .drop)  // the old stream, until the answer
        #expect(machine.subscribed(startingAfter: self.at(5), gap: nil) == .report(.subscribed(recovered: true)))
        #expect(machine.received(self.at(6)) == .deliver)
        #expect(machine.received(self.at(1, epoch: 7)) == .resubscribe(from: self.at(6)))
    }

    @Test("a gateway that cannot fill a hole: after one resubscription from the same position, the gap is reported and delivery goes on")
    func holeNotFilled() {
        var machine = self.subscribed(after: 5)
        #expect(machine.received(self.at(9)) == .resubscribe(from: self.at(5)))
        #expect(machine.subscribed(startingAfter: self.at(5), gap: nil) == .report(.subscribed(recovered: true)))
        #expect(machine.received(self.at(9)) == .reportGapAndDeliver(ChannelGap(after: self.at(5), resumesAt: self.at(9))))
        #expect(machine.received(self.at(10)) == .deliver)
        // A later hole gets its own resubscription first.
        #expect(machine.received(self.at(12)) == .resubscribe(from: self.at(10)))
        // And a new connection tries again, whatever the last one did.
        machine.disconnected()
        #expect(machine.connected() == .subscribe(from: self.at(10)))
        _ = machine.subscribed(startingAfter: self.at(10), gap: nil)
        #expect(machine.received(self.at(12)) == .resubscribe(from: self.at(10)))
    }

    @Test("across a reconnect it subscribes from its position and goes on without duplicates")
    func reconnect() {
        var machine = self.subscribed(after: 0)
        #expect(machine.received(self.at(1)) == .deliver)
        #expect(machine.received(self.at(2)) == .deliver)
        machine.disconnected()
        #expect(machine.state == .waiting(position: self.at(2)))
        #expect(machine.received(self.at(3)) == .drop)
        #expect(machine.connected() == .subscribe(from: self.at(2)))
        // The gateway starts before the position (it could not tell): those are dropped.
        #expect(machine.subscribed(startingAfter: self.at(1), gap: nil) == .report(.subscribed(recovered: true)))
        #expect(machine.received(self.at(2)) == .drop)
        #expect(machine.received(self.at(3)) == .deliver)
    }

    @Test("the gateway's gap is reported, and the publications from where it resumes are delivered")
    func gap() {
        var machine = self.subscribed(after: 3)
        machine.disconnected()
        #expect(machine.connected() == .subscribe(from: self.at(3)))
        let gap = ChannelGap(after: self.at(3), resumesAt: self.at(10))
        #expect(machine.subscribed(startingAfter: self.at(9), gap: gap) == .report(.gap(gap)))
        #expect(machine.received(self.at(10)) == .deliver)
    }

    @Test("an answer past the position with no gap named is a gap when recovering; skipped on purpose otherwise")
    func skipped() {
        var recovering = self.subscribed(after: 3)
        recovering.disconnected()
        _ = recovering.connected()
        #expect(
            recovering.subscribed(startingAfter: self.at(8), gap: nil)
                == .report(.gap(ChannelGap(after: self.at(3), resumesAt: self.at(9))))
        )

        var notRecovering = self.subscribed(after: 3, recover: false)
        notRecovering.disconnected()
        #expect(notRecovering.connected() == .subscribe(from: nil))
        #expect(notRecovering.subscribed(startingAfter: self.at(8), gap: nil) == .report(.subscribed(recovered: false)))
        #expect(notRecovering.received(self.at(9)) == .deliver)
    }

    @Test("a channel without history: everything delivered as it comes; a resubscription cannot recover and says so")
    func withoutHistory() {
        var machine = SubscriptionMachine(recover: true)
        #expect(machine.connected() == .subscribe(from: nil))
        let none = ChannelPosition(epoch: 0, offset: 0)
        #expect(machine.subscribed(startingAfter: none, gap: nil) == .report(.subscribed(recovered: true)))
        #expect(machine.received(none) == .deliver)
        #expect(machine.received(none) == .deliver)
        machine.disconnected()
        #expect(machine.connected() == .subscribe(from: nil), "no position to recover from")
        #expect(machine.subscribed(startingAfter: none, gap: nil) == .report(.subscribed(recovered: false)))
        #expect(machine.received(none) == .deliver)
        #expect(ChannelGap(after: none, resumesAt: ChannelPosition(epoch: 0, offset: 1)).missed == nil)
    }

    @Test("a saved position is where the first subscription recovers from")
    func savedPosition() {
        var machine = SubscriptionMachine(recover: true, position: self.at(42))
        #expect(machine.connected() == .subscribe(from: self.at(42)))
        #expect(machine.subscribed(startingAfter: self.at(42), gap: nil) == .report(.subscribed(recovered: true)))
        #expect(machine.received(self.at(43)) == .deliver)
    }

    @Test("ending it: UNSUBSCRIBE only when the gateway knows of it; nothing happens after")
    func ending() {
        var waiting = SubscriptionMachine(recover: true)
        #expect(waiting.unsubscribe() == .none)
        #expect(waiting.connected() == .none)

        var active = self.subscribed(after: 1)
        #expect(active.unsubscribe() == .unsubscribe)
        #expect(active.received(self.at(2)) == .drop)
        #expect(active.unsubscribe() == .none)

        var refused = SubscriptionMachine(recover: true)
        _ = refused.connected()
        refused.refused()
        #expect(refused.state == .ended)
        #expect(refused.subscribed(startingAfter: self.at(1), gap: nil) == .none)
        #expect(refused.connected() == .none)
    }

    /// A gateway with one channel's history and a subscriber whose connection is cut at random:
    /// publications sent while it is down are lost on the wire, the history keeps the last 30,
    /// and the subscriber recovers in pages of 7. Whatever the cuts, every offset reaches the
    /// app once and in order, or lies inside a gap that was reported.
    @Test(
        "random cuts against a history: every publication delivered once, in order, or inside a reported gap",
        arguments: [1, 2, 3, 4, 5] as [UInt64]
    )
    func randomCuts(seed: UInt64) throws {
        var random = SplitMix64(seed: seed)
        var history = ChannelHistory<Int>(epoch: Self.epoch, retention: try ChannelRetention(maxCount: 30, maxAge: .seconds(3_600)))
        var machine = SubscriptionMachine(recover: true)
        var connected = false
        var subscribedOnGateway = false
        var accounted: [UInt64] = []  // each offset delivered, or covered by a gap, in order
        var gaps = 0

        func handle(_ action: SubscriptionMachine.Action, publication: UInt64?) throws {
            switch action {
            case .deliver:
                accounted.append(try #require(publication))
            case .report(.gap(let gap)):
                gaps += 1
                #expect(gap.after.offset == (accounted.last ?? 0))
                accounted += Array(stride(from: gap.after.offset + 1, to: gap.resumesAt.offset, by: 1))
            case .subscribe(let from), .resubscribe(let from as ChannelPosition?):
                try subscribe(from: from)
            case .reportGapAndDeliver(let gap):
                Issue.record("seed \(seed): a gateway with a history filled every hole, yet \(gap) was delivered past")
            case .none, .drop, .report(.subscribed), .unsubscribe:
                break
            }
        }

        func subscribe(from position: ChannelPosition?) throws {
            // The gateway answers, then sends what the subscriber missed, page by page.
            var recovery = history.recover(after: position, limit: 7, at: .zero)
            let startingAfter =
                recovery.gap.map { ChannelPosition(epoch: $0.resumesAt.epoch, offset: $0.resumesAt.offset - 1) } ?? position ?? history.top
            subscribedOnGateway = true
            try handle(machine.subscribed(startingAfter: startingAfter, gap: recovery.gap), publication: nil)
            while true {
                for publication in recovery.publications {
                    try handle(
                        machine.received(ChannelPosition(epoch: Self.epoch, offset: publication.offset)),
                        publication: publication.offset
                    )
                }
                guard recovery.more, let last = recovery.publications.last else { break }
                recovery = history.recover(after: ChannelPosition(epoch: Self.epoch, offset: last.offset), limit: 7, at: .zero)
            }
        }

        try handle(machine.connected(), publication: nil)
        connected = true
        for step in 0..<5_000 {
            switch random.next() % 100 {
            case 0..<3 where connected:
                connected = false
                subscribedOnGateway = false
                machine.disconnected()
            case 0..<12 where !connected:
                connected = true
                try handle(machine.connected(), publication: nil)
            default:
                let position = history.append(step, at: .zero)
                if connected && subscribedOnGateway {
                    try handle(machine.received(position), publication: position.offset)
                }
            }
        }
        if !connected { try handle(machine.connected(), publication: nil) }
        let expected = Array(1...history.topOffset)
        let firstWrong =
            (0..<min(accounted.count, expected.count)).first { accounted[$0] != expected[$0] } ?? min(accounted.count, expected.count)
        #expect(
            accounted.count == expected.count && firstWrong == expected.count,
            """
            seed \(seed): \(accounted.count) offsets accounted for \(expected.count) published; the first out of place is \
            #\(firstWrong): \(accounted.dropFirst(firstWrong).prefix(5)) where \(expected.dropFirst(firstWrong).prefix(5)) was due
            """
        )
        #expect(gaps > 0, "seed \(seed): the cuts were meant to outrun the history at least once")
    }
}
