import Testing

@testable import TetherCore

@Suite("Channel history")
struct ChannelHistoryTests {
    static let epoch: UInt64 = 0xC0FFEE

    func history(maxCount: Int = 100, maxAge: Duration = .seconds(60), appending count: Int = 0) throws -> ChannelHistory<Int> {
        var history = ChannelHistory<Int>(epoch: Self.epoch, retention: try ChannelRetention(maxCount: maxCount, maxAge: maxAge))
        for index in 0..<count { _ = history.append(index + 1, at: .zero) }
        return history
    }

    func at(_ offset: UInt64, epoch: UInt64 = Self.epoch) -> ChannelPosition {
        ChannelPosition(epoch: epoch, offset: offset)
    }

    @Test("publications get contiguous offsets from 1; the top follows them")
    func offsets() throws {
        var history = try self.history()
        #expect(history.top == self.at(0))
        #expect(history.append(10, at: .zero) == self.at(1))
        #expect(history.append(20, at: .zero) == self.at(2))
        #expect(history.top == self.at(2) && history.count == 2)
    }

    @Test("a subscriber with no position gets nothing and no gap; one from offset 0 gets everything kept")
    func freshAndFromTheStart() throws {
        let history = try self.history(appending: 5)
        let fresh = history.recover(after: nil, limit: 100, at: .zero)
        #expect(fresh.gap == nil && fresh.publications.isEmpty && !fresh.more)
        let all = history.recover(after: self.at(0), limit: 100, at: .zero)
        #expect(all.gap == nil && all.publications.map(\.offset) == [1, 2, 3, 4, 5] && all.publications.map(\.payload) == [1, 2, 3, 4, 5])
    }

    @Test("a subscriber within the history recovers what followed its position, in order, without a gap")
    func recovered() throws {
        let history = try self.history(appending: 10)
        let recovery = history.recover(after: self.at(7), limit: 100, at: .zero)
        #expect(recovery.gap == nil)
        #expect(recovery.publications.map(\.offset) == [8, 9, 10] && !recovery.more)
        let atTop = history.recover(after: self.at(10), limit: 100, at: .zero)
        #expect(atTop.gap == nil && atTop.publications.isEmpty)
    }

    @Test("beyond the count kept: the gap names what was missed, and what is kept follows")
    func gapByCount() throws {
        let history = try self.history(maxCount: 4, appending: 10)  // keeps 7...10
        #expect(history.count == 4)
        let recovery = history.recover(after: self.at(2), limit: 100, at: .zero)
        #expect(recovery.gap == ChannelGap(after: self.at(2), resumesAt: self.at(7)))
        #expect(recovery.gap?.missed == 4)  // 3, 4, 5, 6
        #expect(recovery.publications.map(\.offset) == [7, 8, 9, 10])
        // Right at the edge: 6 was the last one it had, 7 is kept: no gap.
        #expect(history.recover(after: self.at(6), limit: 100, at: .zero).gap == nil)
    }

    @Test("publications age out on the clock; the stream's position outlives them")
    func gapByAge() throws {
        var history = try self.history(maxAge: .seconds(10))
        _ = history.append(1, at: .zero)
        _ = history.append(2, at: .zero + .seconds(5))
        _ = history.append(3, at: .zero + .seconds(8))
        // At 12 s, the first has aged out (appended at 0), the others not.
        let partly = history.recover(after: self.at(0), limit: 100, at: .zero + .seconds(12))
        #expect(partly.gap == ChannelGap(after: self.at(0), resumesAt: self.at(2)))
        #expect(partly.publications.map(\.offset) == [2, 3])
        // At 20 s, all have: a subscriber at the top missed nothing; one behind it missed
        // what it had not seen, and resumes after the top.
        let later = TetherInstant.zero + .seconds(20)
        let atTop = history.recover(after: self.at(3), limit: 100, at: later)
        #expect(atTop.gap == nil && atTop.publications.isEmpty)
        let behind = history.recover(after: self.at(1), limit: 100, at: later)
        #expect(behind.gap == ChannelGap(after: self.at(1), resumesAt: self.at(4)) && behind.gap?.missed == 2)
        #expect(behind.publications.isEmpty)
        // Trimming drops them for good; appending goes on from the top.
        history.trim(at: later)
        #expect(history.count == 0)
        #expect(history.append(4, at: later) == self.at(4))
    }

    @Test("a position of another epoch, or past the top, gets a gap of unknown size and everything kept")
    func otherEpochOrPastTheTop() throws {
        let history = try self.history(appending: 3)
        let lost = history.recover(after: self.at(40, epoch: 1), limit: 100, at: .zero)
        #expect(lost.gap == ChannelGap(after: self.at(40, epoch: 1), resumesAt: self.at(1)))
        #expect(lost.gap?.missed == nil)
        #expect(lost.publications.map(\.offset) == [1, 2, 3])
        let ahead = history.recover(after: self.at(9), limit: 100, at: .zero)
        #expect(ahead.gap == ChannelGap(after: self.at(9), resumesAt: self.at(1)) && ahead.gap?.missed == nil)
        #expect(ahead.publications.map(\.offset) == [1, 2, 3])
    }

    @Test("a history that lost its publications but kept its position starts there")
    func keptPosition() throws {
        var history = ChannelHistory<Int>(
            epoch: Self.epoch,
            retention: try ChannelRetention(maxCount: 10, maxAge: .seconds(1)),
            topOffset: 50
        )
        let behind = history.recover(after: self.at(45), limit: 10, at: .zero)
        #expect(behind.gap?.missed == 5 && behind.gap?.resumesAt == self.at(51))
        #expect(history.append(0, at: .zero) == self.at(51))
    }

    @Test("recovery comes in pages of the limit: asked again from the last one, the pages join up")
    func pages() throws {
        let history = try self.history(maxCount: 1_000, appending: 1_000)
        var position = self.at(123)
        var offsets: [UInt64] = []
        var pages = 0
        while true {
            let page = history.recover(after: position, limit: 100, at: .zero)
            #expect(page.gap == nil)
            offsets += page.publications.map(\.offset)
            pages += 1
            guard page.more, let last = page.publications.last else { break }
            position = self.at(last.offset)
        }
        #expect(offsets == Array(124...1_000))
        #expect(pages == 9)
    }

    @Test("the weights of what is kept are summed through appends, the count and age limits, and drops of the oldest")
    func weights() throws {
        var history = try self.history(maxCount: 3, maxAge: .seconds(10))
        for (index, weight) in [10, 20, 30, 40].enumerated() {
            _ = history.append(index, weight: weight, at: .zero + .seconds(index))
        }
        #expect(history.keptWeight == 90, "the first dropped by the count")
        history.dropOldest()
        #expect(history.keptWeight == 70 && history.count == 2)
        #expect(!history.isEmpty(at: .zero + .seconds(12)))
        #expect(history.isEmpty(at: .zero + .seconds(13)), "both aged out by then, before a trim")
        history.trim(at: .zero + .seconds(13))
        #expect(history.keptWeight == 0 && history.count == 0 && history.topOffset == 4)
        history.dropOldest()
        #expect(history.keptWeight == 0, "dropping from an empty history does nothing")
    }

    @Test("a retention keeps at least one publication for a positive time")
    func retentionValidated() {
        #expect(throws: ConfigurationError.self) { try ChannelRetention(maxCount: 0, maxAge: .seconds(1)) }
        #expect(throws: ConfigurationError.self) { try ChannelRetention(maxCount: 1, maxAge: .zero) }
        #expect((try? ChannelRetention(maxCount: 1, maxAge: .milliseconds(1))) != nil)
    }
}
