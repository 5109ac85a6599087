/// Where a subscriber stands in a channel's stream of publications: everything up to `offset`
/// of the stream `epoch`.
///
/// Every publication in a channel with history gets the next offset (the first is 1); offset 0
/// is the position of a subscriber that has seen nothing of the stream. The epoch names one
/// life of the stream, never 0: it changes only when the history is lost (an in-memory history
/// that was dropped, a store that was reset), so that offsets of an earlier life are never
/// taken for offsets of this one. A channel without history has no positions (both 0).
///
/// ```swift
/// let position = ChannelPosition(epoch: 0x5eed, offset: 41)   // seen 1...41
/// ```
public struct ChannelPosition: Sendable, Hashable, CustomStringConvertible {
    /// The life of the stream the offset counts in.
    public var epoch: UInt64
    /// The last offset seen (0: none).
    public var offset: UInt64

    /// The position after `offset` publications of stream `epoch`.
    public init(epoch: UInt64, offset: UInt64) {
        self.epoch = epoch
        self.offset = offset
    }

    public var description: String { "\(self.offset)@\(String(self.epoch, radix: 16))" }
}

/// Publications a subscriber missed and cannot get any more: its history no longer reaches
/// back to them, or it was lost.
///
/// A subscriber that was at ``after`` receives the publications from ``resumesAt`` on; those
/// in between are gone. ``missed`` says how many when that is known (the same epoch); when the
/// stream's epoch changed, what was missed is unknown.
public struct ChannelGap: Sendable, Hashable, CustomStringConvertible {
    /// The last position the subscriber had.
    public var after: ChannelPosition
    /// The position the next publication it receives has.
    public var resumesAt: ChannelPosition

    /// A gap between `after` and `resumesAt`.
    public init(after: ChannelPosition, resumesAt: ChannelPosition) {
        self.after = after
        self.resumesAt = resumesAt
    }

    /// How many publications were lost, when both positions are in one epoch of a channel with
    /// history.
    public var missed: UInt64? {
        guard self.after.epoch == self.resumesAt.epoch, self.after.epoch != 0, self.resumesAt.offset > self.after.offset else { return nil }
        return self.resumesAt.offset - self.after.offset - 1
    }

    public var description: String {
        let count = self.missed.map { "\($0) publications" } ?? "an unknown number of publications"
        return "\(count) missed after \(self.after), resuming at \(self.resumesAt)"
    }

    /// Where a reader at `position` resumes in the stream of `epoch` whose last offset is
    /// `top` and whose oldest publication kept is `available` (`top + 1` when none is): the
    /// first offset it gets, and the gap before it when it cannot get all that followed its
    /// position. A position of another epoch, or past `top`, resumes at the oldest kept, with
    /// a gap of unknown size. What the in-memory history, the store's recoveries and its
    /// history pages share.
    package static func resuming(
        _ position: ChannelPosition,
        epoch: UInt64,
        top: UInt64,
        available: UInt64
    ) -> (first: UInt64, gap: ChannelGap?) {
        let sameStream = position.epoch == epoch && position.offset <= top
        // The first offset the reader needs, and the first one it can get.
        let wanted: UInt64 = sameStream ? position.offset + 1 : 1
        let first = max(wanted, available)
        guard !sameStream || wanted < available else { return (first, nil) }
        return (first, ChannelGap(after: position, resumesAt: ChannelPosition(epoch: epoch, offset: first)))
    }
}
