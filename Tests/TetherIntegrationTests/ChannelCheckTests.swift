import Testing
import TetherCore
import TetherLab

/// The lab's check of what a channel subscriber received: it must catch each anomaly.
@Suite("The lab's channel check")
struct ChannelCheckTests {
    static func p(_ offset: UInt64, epoch: UInt64 = 7) -> ChannelCheck.Heard { .publication(ChannelPosition(epoch: epoch, offset: offset)) }

    /// A gap event that came when 20 publications had been asked for (a history of 10 keeps 11…20 then).
    static func gap(_ after: UInt64, _ resumesAt: UInt64, publishedBy: UInt64 = 20) -> ChannelCheck.Heard {
        .gap(
            ChannelGap(after: ChannelPosition(epoch: 7, offset: after), resumesAt: ChannelPosition(epoch: 7, offset: resumesAt)),
            publishedBy: publishedBy
        )
    }

    @Test("every publication once, or in an exact gap: clean")
    func clean() {
        let check = ChannelCheck.check(
            [Self.p(3), Self.p(4), Self.gap(4, 9, publishedBy: 18), Self.p(9), Self.p(10)],
            epoch: 7,
            history: 10
        )
        #expect(check.isClean && check.received == 4 && check.gaps == 1 && check.missedInGaps == 4 && check.caughtUp(to: 10))
        #expect(check.before == 2, "subscribed after 2 were published")
        let gapFirst = ChannelCheck.check([Self.gap(0, 6), Self.p(6)], epoch: 7, history: 10)
        #expect(gapFirst.before == 0 && gapFirst.missedInGaps == 5 && gapFirst.isClean, "what it missed is in the gap")
        // Subscribed again before the first publication after a gap came: a second gap from
        // where the first resumed.
        let twice = ChannelCheck.check([Self.p(3), Self.gap(3, 8), Self.gap(7, 12, publishedBy: 25), Self.p(12)], epoch: 7, history: 10)
        #expect(twice.isClean && twice.missedInGaps == 8 && twice.gaps == 2)
        #expect(ChannelCheck.check([Self.p(3), Self.gap(3, 8), Self.gap(5, 12), Self.p(12)], epoch: 7, history: 10).inexactGaps == 1)
        #expect(!check.caughtUp(to: 11))
    }

    @Test("a publication twice, one skipped silently, a gap that does not start or end where it should: each counted")
    func anomalies() {
        #expect(ChannelCheck.check([Self.p(1), Self.p(2), Self.p(2)], epoch: 7, history: 10).duplicates == 1)
        #expect(ChannelCheck.check([Self.p(1), Self.p(3), Self.p(2)], epoch: 7, history: 10).duplicates == 1)
        #expect(ChannelCheck.check([Self.p(1), Self.p(4)], epoch: 7, history: 10).silentlyLost == 2)
        #expect(
            ChannelCheck.check([Self.p(1), Self.gap(2, 5), Self.p(5)], epoch: 7, history: 10).inexactGaps == 1,
            "starts past the last one"
        )
        #expect(
            ChannelCheck.check([Self.p(1), Self.gap(1, 5), Self.p(6)], epoch: 7, history: 10).inexactGaps == 1,
            "the next one is not where it resumes"
        )
        #expect(ChannelCheck.check([Self.p(1), Self.p(2, epoch: 8)], epoch: 7, history: 10).epochChanges == 1)
        #expect(!ChannelCheck.check([Self.p(1), Self.p(1)], epoch: 7, history: 10).isClean)
        // With 20 asked for, a history of 10 keeps 11 on: a gap that resumes at 12 skipped 11.
        #expect(ChannelCheck.check([Self.p(3), Self.gap(3, 12), Self.p(12)], epoch: 7, history: 10).unjustifiedGaps == 1)
        #expect(ChannelCheck.check([Self.p(3), Self.gap(3, 11), Self.p(11)], epoch: 7, history: 10).isClean)
    }
}
