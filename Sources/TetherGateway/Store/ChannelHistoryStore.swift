public import Foundation
public import NIOCore
public import TetherCore

/// Where the gateway keeps the history of the channels whose rule says
/// ``GatewayConfiguration/Channels-swift.struct/Storage/store`` (PROTOCOL.md, section 12): a
/// publication is appended once, survives the gateway's restart, and is read by every
/// subscriber that comes back within the channel's retention.
///
/// ``SQLiteMessageStore`` is one: the channels' history lives in the same file as reliable
/// delivery's state. A store of your own proves itself with the contract suite every store
/// passes (`ChannelHistoryStoreContract` in TetherGatewayTesting).
///
/// ## The contract
///
/// - **A stream per channel**, at offset 0 of an epoch (never 0) until its first publication.
///   ``head(of:notBefore:)`` answers the same epoch before and after that first append, and
///   writes nothing (a client subscribing to channels nobody publishes to must not fill the
///   store). Each publication appended gets the next offset; offsets are never reused within
///   an epoch. The epoch changes only when the stream's history is lost (a new store).
/// - **Atomic and durable before it returns**: the publications of one call are appended in
///   order, all or none, and survive the process being killed once the call returned.
/// - **Retention**: an append drops the publications of its channel beyond its
///   ``ChannelAppend/maxCount`` latest; ``trimPublications(before:)`` drops those older than a
///   time. Reads skip those older than their `notBefore`. The stream's top outlives its
///   publications.
/// - **Reads see every append that returned.**
public protocol ChannelHistoryStore: Sendable {
    /// Appends publications, in order, each to its channel's stream; see the contract above.
    /// - Returns: Each publication's position, in order.
    /// - Throws: ``MessageStoreError``: nothing was appended.
    func appendPublications(_ publications: [ChannelAppend]) async throws -> [ChannelPosition]

    /// The state of `channel`'s stream: its epoch, its top (0 before its first publication), and
    /// its oldest publication published at or after `notBefore`.
    func head(of channel: String, notBefore: Date) async throws -> ChannelStreamHead

    /// Up to `limit` publications of `channel` after `offset`, oldest first, skipping those
    /// published before `notBefore`; `nil` if the channel's stream is not of `epoch` (its
    /// history was lost, or it has none).
    func publications(
        of channel: String,
        epoch: UInt64,
        after offset: UInt64,
        limit: Int,
        notBefore: Date
    ) async throws -> [StoredPublication]?

    /// Drops the publications published before `time`, of every channel (the streams stay).
    /// - Returns: How many were dropped.
    func trimPublications(before time: Date) async throws -> Int
}

/// A publication to append to a channel's stream (``ChannelHistoryStore``).
public struct ChannelAppend: Sendable, Hashable {
    /// The channel, 1 to 255 bytes of UTF-8.
    public var channel: String
    /// Who published it: a client id, or empty for the gateway or the backend.
    public var publisher: String
    public var body: ByteBuffer
    /// When it was published; reads with a later `notBefore` skip it.
    public var time: Date
    /// The most publications its channel keeps: this append drops the ones before them.
    public var maxCount: Int

    public init(channel: String, publisher: String, body: ByteBuffer, time: Date, maxCount: Int) {
        self.channel = channel
        self.publisher = publisher
        self.body = body
        self.time = time
        self.maxCount = maxCount
    }
}

/// Where a channel's stream is (``ChannelHistoryStore/head(of:notBefore:)``).
public struct ChannelStreamHead: Sendable, Hashable {
    /// The stream's epoch, never 0.
    public var epoch: UInt64
    /// The offset of its last publication; 0 if none yet.
    public var top: UInt64
    /// The offset of its oldest publication kept; `nil` when it keeps none (the next one
    /// appended gets `top + 1`).
    public var oldest: UInt64?

    public init(epoch: UInt64, top: UInt64, oldest: UInt64?) {
        self.epoch = epoch
        self.top = top
        self.oldest = oldest
    }

    /// The stream's position: after its last publication.
    public var position: ChannelPosition { ChannelPosition(epoch: self.epoch, offset: self.top) }

    /// An epoch for a channel's stream made from the store's own random epoch and the
    /// channel's name (FNV-1a, 64 bits; never 0): known before the stream's first publication,
    /// so that reading a channel needs no write, and different in another store (whose history
    /// is another).
    public static func derivedEpoch(store: UInt64, channel: String) -> UInt64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        func mix(_ byte: UInt8) {
            hash ^= UInt64(byte)
            hash = hash &* 0x0000_0100_0000_01b3
        }
        withUnsafeBytes(of: store.littleEndian) { for byte in $0 { mix(byte) } }
        for byte in channel.utf8 { mix(byte) }
        return hash == 0 ? 1 : hash
    }
}

/// A publication read back from a ``ChannelHistoryStore``.
public struct StoredPublication: Sendable, Hashable {
    public var offset: UInt64
    public var publisher: String
    public var body: ByteBuffer
    /// When it was published.
    public var time: Date

    public init(offset: UInt64, publisher: String, body: ByteBuffer, time: Date) {
        self.offset = offset
        self.publisher = publisher
        self.body = body
        self.time = time
    }
}
