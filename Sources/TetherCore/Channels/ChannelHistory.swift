import NIOCore

/// How much of a channel's history is kept: at most ``maxCount`` publications, none older than
/// ``maxAge``.
///
/// ```swift
/// let retention = try ChannelRetention(maxCount: 1_000, maxAge: .seconds(300))
/// ```
public struct ChannelRetention: Sendable, Hashable {
    /// The most publications kept; older ones go first.
    public var maxCount: Int
    /// How long a publication is kept.
    public var maxAge: Duration

    /// - Throws: ``ConfigurationError`` when `maxCount` is below 1 or `maxAge` is not positive.
    public init(maxCount: Int, maxAge: Duration) throws(ConfigurationError) {
        guard maxCount >= 1 else { throw ConfigurationError("a channel's history must keep at least 1 publication, got \(maxCount)") }
        guard maxAge > .zero else { throw ConfigurationError("a channel's history must keep publications for a positive time") }
        self.maxCount = maxCount
        self.maxAge = maxAge
    }
}

/// One channel's history, in memory: each publication appended gets the next offset of the
/// stream, and a subscriber that comes back with its last ``ChannelPosition`` gets what it
/// missed in order — or, where the history no longer reaches back, the ``ChannelGap`` before
/// what is left. No I/O; time is passed in.
///
/// The stream's position outlives its publications: once every publication has aged out, a
/// subscriber at the top still recovers (it missed nothing), and one behind it gets a gap
/// with the count of what it missed.
///
/// ```swift
/// var history = ChannelHistory<ByteBuffer>(epoch: .random(in: 1...(.max)), retention: retention)
/// let position = history.append(body, at: clock.now)
/// let recovery = history.recover(after: subscriber, limit: 500, at: clock.now)
/// if let gap = recovery.gap { tell(gap) }
/// for publication in recovery.publications { send(publication) }
/// ```
package struct ChannelHistory<Payload: Sendable>: Sendable {
    /// A publication kept.
    package struct Publication: Sendable {
        /// Its offset in the stream.
        package var offset: UInt64
        /// When it was appended: it ages out ``ChannelRetention/maxAge`` later.
        package var appendedAt: TetherInstant
        package var payload: Payload
        /// What the caller counts it as (its bytes, say), summed in ``keptWeight``.
        package var weight: Int
    }

    /// What a subscriber coming back gets.
    package struct Recovery: Sendable {
        /// What it missed and cannot get any more; `nil` when nothing it missed is lost.
        package var gap: ChannelGap?
        /// The publications that follow its position (after the gap, if any), in order,
        /// contiguous, at most the limit asked for.
        package var publications: [Publication]
        /// Whether more publications follow the last of ``publications``: ask again from it.
        package var more: Bool
    }

    /// The stream's life: changes only when its history is lost.
    package let epoch: UInt64
    package let retention: ChannelRetention
    /// The offset of the last publication appended (0: none yet).
    package private(set) var topOffset: UInt64
    /// The publications kept, oldest first, with contiguous offsets ending at ``topOffset``.
    private var kept = CircularBuffer<Publication>()
    /// The sum of the weights of the publications kept.
    package private(set) var keptWeight = 0

    /// An empty stream, or one whose publications up to `topOffset` are gone.
    /// - Parameter epoch: Not 0 (the epoch of channels without history); a random one, from
    ///   `UInt64.random(in: 1...(.max))`.
    package init(epoch: UInt64, retention: ChannelRetention, topOffset: UInt64 = 0) {
        precondition(epoch != 0, "epoch 0 is a channel without history")
        self.epoch = epoch
        self.retention = retention
        self.topOffset = topOffset
        self.kept = CircularBuffer(initialCapacity: min(retention.maxCount, 64))
    }

    /// The position after the last publication.
    package var top: ChannelPosition { ChannelPosition(epoch: self.epoch, offset: self.topOffset) }

    /// How many publications are kept (some may have aged out since the last append or trim).
    package var count: Int { self.kept.count }

    /// Appends a publication; drops the oldest beyond the retention.
    /// - Parameter weight: What it counts for in ``keptWeight`` while it is kept.
    /// - Returns: Its position.
    package mutating func append(_ payload: Payload, weight: Int = 0, at now: TetherInstant) -> ChannelPosition {
        self.topOffset += 1
        if self.kept.count == self.retention.maxCount { self.dropOldest() }
        self.kept.append(Publication(offset: self.topOffset, appendedAt: now, payload: payload, weight: weight))
        self.keptWeight += weight
        self.trim(at: now)
        return self.top
    }

    /// Drops the publications that aged out by `now`.
    package mutating func trim(at now: TetherInstant) {
        let cutoff = now - self.retention.maxAge
        while let first = self.kept.first, first.appendedAt <= cutoff { self.dropOldest() }
    }

    /// Drops the oldest publication kept, if any (to make room elsewhere): a subscriber that
    /// needed it gets a gap.
    package mutating func dropOldest() {
        guard let first = self.kept.popFirst() else { return }
        self.keptWeight -= first.weight
    }

    /// Whether no publication is kept at `now` (the stream's position stays).
    package func isEmpty(at now: TetherInstant) -> Bool { self.oldestKept(at: now) == nil }

    /// The offset of the oldest publication still kept at `now`, if any.
    private func oldestKept(at now: TetherInstant) -> (index: Int, offset: UInt64)? {
        let cutoff = now - self.retention.maxAge
        // Appends are in time order: the kept ones that aged out are a prefix.
        var low = 0
        var high = self.kept.count
        while low < high {
            let middle = (low + high) / 2
            if self.kept[self.kept.index(self.kept.startIndex, offsetBy: middle)].appendedAt <= cutoff {
                low = middle + 1
            } else {
                high = middle
            }
        }
        guard low < self.kept.count else { return nil }
        return (low, self.kept[self.kept.index(self.kept.startIndex, offsetBy: low)].offset)
    }

    /// What a subscriber gets after `position`: the publications that follow it, or the gap
    /// before the oldest still kept when the history no longer reaches back to it.
    ///
    /// A position of another epoch (the history was lost since), or one past the top (offsets
    /// this stream never gave), is answered with a gap of unknown size and everything kept.
    /// - Parameters:
    ///   - position: The subscriber's last position; `nil` for one that wants only what comes
    ///     next (nothing missed, no publications).
    ///   - limit: The most publications to return (at least 1); ``Recovery/more`` says whether
    ///     others follow.
    ///   - now: For the publications that aged out.
    package func recover(after position: ChannelPosition?, limit: Int, at now: TetherInstant) -> Recovery {
        precondition(limit >= 1, "a recovery returns at least one publication at a time")
        guard let position else { return Recovery(gap: nil, publications: [], more: false) }
        let oldest = self.oldestKept(at: now)
        let (first, gap) = ChannelGap.resuming(
            position,
            epoch: self.epoch,
            top: self.topOffset,
            available: oldest?.offset ?? self.topOffset + 1
        )
        guard let oldest, first <= self.topOffset else { return Recovery(gap: gap, publications: [], more: false) }
        let start = oldest.index + Int(first - oldest.offset)
        let end = min(self.kept.count, start + limit)
        let range = self.kept.index(self.kept.startIndex, offsetBy: start)..<self.kept.index(self.kept.startIndex, offsetBy: end)
        return Recovery(gap: gap, publications: Array(self.kept[range]), more: end < self.kept.count)
    }
}
