public import TetherCore

/// Checks what one channel subscriber received against the channel: every publication from
/// where it started to the channel's top once and in order, or inside a gap event that says
/// exactly which ones were lost.
public struct ChannelCheck: Codable, Sendable, Hashable {
    /// What a subscriber heard, in order.
    public enum Heard: Sendable, Hashable {
        case publication(ChannelPosition)
        /// A gap event, and how many publications of the channel had been asked for when it
        /// came (the channel's top cannot be higher).
        case gap(ChannelGap, publishedBy: UInt64)
    }

    /// Publications received (each counted once).
    public var received = 0
    /// Publications received twice or more, or older than one received before: must be 0.
    public var duplicates = 0
    /// Publications skipped with no gap event that covers them: must be 0.
    public var silentlyLost = 0
    /// Gap events, and the publications they said were lost.
    public var gaps = 0
    public var missedInGaps = 0
    /// A gap event that does not start at the last publication received, or that the next
    /// publication does not follow: must be 0.
    public var inexactGaps = 0
    /// A gap event that resumes later than the oldest publication a history of `history`
    /// could still hold (the gateway skipped publications it had): must be 0.
    public var unjustifiedGaps = 0
    /// A publication of another epoch than the first one's (with no gap event before it).
    public var epochChanges = 0
    /// The offset of the last publication received (0: none).
    public var last: UInt64 = 0
    /// What was heard around the first anomaly, if any.
    public var firstAnomaly: String?
    /// The publications before the first one received: published before the subscriber first
    /// subscribed (from the top, as the lab's subscribers do).
    public var before: UInt64 = 0

    public init() {}

    /// Checks `heard` (from the subscriber's first publication on) against the channel's
    /// `epoch` and the publications its history keeps.
    /// - Returns: The tally; ``caughtUp(to:)`` says whether it reached the top.
    public static func check(_ heard: [Heard], epoch: UInt64, history: Int) -> ChannelCheck {
        var check = ChannelCheck()
        var last: ChannelPosition?
        var pendingGap: ChannelGap?
        for (index, item) in heard.enumerated() {
            let before = check.anomalies
            switch item {
            case .gap(let gap, let publishedBy):
                check.gaps += 1
                check.missedInGaps += Int(gap.missed ?? 0)
                // It starts at the last publication received, or, when it follows another gap
                // (the subscriber subscribed again before the next publication came), where
                // that one resumed.
                let expected = pendingGap.map { ChannelPosition(epoch: $0.resumesAt.epoch, offset: $0.resumesAt.offset - 1) } ?? last
                if let expected, gap.after != expected { check.inexactGaps += 1 }
                // A history of `history` at top T keeps T - history + 1 and after; T is at most
                // what was asked for.
                if gap.resumesAt.offset + UInt64(max(0, history - 1)) > publishedBy { check.unjustifiedGaps += 1 }
                pendingGap = gap
            case .publication(let position):
                guard position.epoch == epoch else {
                    check.epochChanges += 1
                    break
                }
                if last == nil, pendingGap == nil { check.before = position.offset - 1 }
                if let gap = pendingGap {
                    pendingGap = nil
                    if position != gap.resumesAt { check.inexactGaps += 1 }
                    if let previous = last, position.offset <= previous.offset {
                        check.duplicates += 1
                        break
                    }
                } else if let previous = last {
                    if position.offset <= previous.offset {
                        check.duplicates += 1
                        break
                    }
                    if position.offset > previous.offset + 1 { check.silentlyLost += Int(position.offset - previous.offset - 1) }
                }
                check.received += 1
                last = position
            }
            if check.firstAnomaly == nil, check.anomalies != before {
                check.firstAnomaly = heard[max(0, index - 3)...min(heard.count - 1, index + 2)].map(\.description).joined(separator: ", ")
            }
        }
        check.last = last?.offset ?? 0
        return check
    }

    /// Anomalies counted so far.
    private var anomalies: Int { self.duplicates + self.silentlyLost + self.inexactGaps + self.unjustifiedGaps + self.epochChanges }

    /// Whether the subscriber ends at the channel's top.
    public func caughtUp(to top: UInt64) -> Bool { self.last == top }

    /// Whether nothing was lost silently, doubled or reported inexactly.
    public var isClean: Bool {
        self.duplicates == 0 && self.silentlyLost == 0 && self.inexactGaps == 0 && self.unjustifiedGaps == 0 && self.epochChanges == 0
    }
}

extension ChannelCheck.Heard: CustomStringConvertible {
    public var description: String {
        switch self {
        case .publication(let position): "\(position.epoch):\(position.offset)"
        case .gap(let gap, let publishedBy): "gap(\(gap.after.offset) → \(gap.resumesAt.offset), \(publishedBy) asked)"
        }
    }
}
