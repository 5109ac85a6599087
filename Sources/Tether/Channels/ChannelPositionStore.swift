public import TetherCore

/// Where a client keeps how far each channel subscription got, so that an app started again
/// (after a week) resumes where it was (``ClientConfiguration/Channels-swift.struct/positions``).
///
/// ``SQLiteOutboxStore`` is one: the positions live in the same file as the outbox.
///
/// ```swift
/// let store = try SQLiteOutboxStore(path: documents.appendingPathComponent("tether.sqlite").path)
/// configuration.reliability = try .init(outbox: store)
/// configuration.channels.positions = store
/// ```
public protocol ChannelPositionStore: Sendable {
    /// The position kept for `channel`, if any.
    func channelPosition(of channel: String) async throws -> ChannelPosition?

    /// Keeps `positions`: for each channel, the last publication the app handled.
    func saveChannelPositions(_ positions: [String: ChannelPosition]) async throws
}

/// What a subscription's iterator needs to keep its position: where, and how often.
final class ChannelPositionSaver: Sendable {
    let store: any ChannelPositionStore
    let channel: String
    let interval: Duration
    let clock: any TetherClock

    init(store: any ChannelPositionStore, channel: String, interval: Duration, clock: any TetherClock) {
        self.store = store
        self.channel = channel
        self.interval = interval
        self.clock = clock
    }
}
