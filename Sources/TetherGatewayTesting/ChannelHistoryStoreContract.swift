import Foundation
import NIOCore
import TetherCore
public import TetherGateway

/// The contract every ``ChannelHistoryStore`` meets (see the protocol's documentation), as
/// checks to run against a store: the SQLite store passes them in Tether's own tests; a store
/// of your own should pass them too.
///
/// Each check takes a fresh, empty store and throws ``MessageStoreContract/Violation`` where
/// the store breaks the contract.
///
/// ```swift
/// @Test(arguments: ChannelHistoryStoreContract.checks)
/// func contract(_ check: ChannelHistoryStoreContract.Check) async throws {
///     try await check.run(on: try MyStore(url: testDatabase))
/// }
/// ```
public enum ChannelHistoryStoreContract {
    /// One rule of the contract.
    public struct Check: Sendable, CustomStringConvertible {
        /// What it checks.
        public let name: String
        private let body: @Sendable (any ChannelHistoryStore) async throws -> Void

        init(_ name: String, _ body: @escaping @Sendable (any ChannelHistoryStore) async throws -> Void) {
            self.name = name
            self.body = body
        }

        /// Runs the check on a fresh, empty store.
        /// - Throws: ``MessageStoreContract/Violation``, or the store's own error.
        public func run(on store: any ChannelHistoryStore) async throws {
            try await self.body(store)
        }

        public var description: String { self.name }
    }

    /// Every check.
    public static let checks: [Check] = [
        Check("a channel's stream starts at offset 0 of an epoch that is not 0, and keeps it", streams),
        Check("publications get the next offsets of their channel, in order, and read back as written", appending),
        Check("reads page after an offset, oldest first; a read in another epoch is nil", reading),
        Check("an append keeps its channel's latest maxCount publications; the top stays", retentionByCount),
        Check("reads skip what is older than notBefore; trimming drops it; offsets go on from the top", retentionByAge),
    ]

    static let start = Date(timeIntervalSince1970: 1_800_000_000)

    static func expect(_ condition: Bool, _ message: @autoclosure () -> String) throws {
        if !condition { throw MessageStoreContract.Violation(description: message()) }
    }

    static func publication(
        _ channel: String,
        _ text: String,
        publisher: String = "p",
        at seconds: Double = 0,
        maxCount: Int = 1_000
    ) -> ChannelAppend {
        ChannelAppend(
            channel: channel,
            publisher: publisher,
            body: ByteBuffer(string: text),
            time: start + seconds,
            maxCount: maxCount
        )
    }

    static func texts(_ publications: [StoredPublication]?) -> [String] {
        (publications ?? []).map { String(buffer: $0.body) }
    }

    @Sendable static func streams(_ store: any ChannelHistoryStore) async throws {
        let head = try await store.head(of: "room.a", notBefore: start)
        try expect(head.epoch != 0, "a stream's epoch is never 0")
        try expect(head.top == 0 && head.oldest == nil, "a new stream is empty at offset 0, got \(head)")
        let again = try await store.head(of: "room.a", notBefore: start)
        try expect(again.epoch == head.epoch, "a stream keeps its epoch: \(head.epoch), then \(again.epoch)")
        let positions = try await store.appendPublications([publication("room.a", "one")])
        try expect(
            positions == [ChannelPosition(epoch: head.epoch, offset: 1)],
            "the first publication is at 1 of the epoch, got \(positions)"
        )
        let other = try await store.head(of: "room.b", notBefore: start)
        try expect(other.top == 0, "another channel has a stream of its own, got \(other)")
    }

    @Sendable static func appending(_ store: any ChannelHistoryStore) async throws {
        let binary = ByteBuffer(bytes: [0, 255, 1, 254, 0])
        let positions = try await store.appendPublications([
            publication("a", "a1", publisher: "alice"),
            publication("b", "b1"),
            ChannelAppend(channel: "a", publisher: "", body: binary, time: start, maxCount: 10),
            ChannelAppend(channel: "a", publisher: "bob", body: ByteBuffer(), time: start, maxCount: 10),
        ])
        try expect(positions.map(\.offset) == [1, 1, 2, 3], "offsets per channel, in order: got \(positions.map(\.offset))")
        try expect(positions[0].epoch == positions[2].epoch, "one epoch per channel")
        let more = try await store.appendPublications([publication("a", "a4")])
        try expect(more.map(\.offset) == [4], "the next append goes on from the top, got \(more)")
        let read = try await store.publications(of: "a", epoch: positions[0].epoch, after: 0, limit: 10, notBefore: start)
        try expect(
            read?.map(\.offset) == [1, 2, 3, 4],
            "every publication is read back in order, got \(String(describing: read?.map(\.offset)))"
        )
        try expect(
            read?.map(\.publisher) == ["alice", "", "bob", "p"],
            "publishers are kept, got \(String(describing: read?.map(\.publisher)))"
        )
        try expect(read?[1].body == binary && read?[2].body.readableBytes == 0, "bodies are kept byte for byte")
        try expect(read?[0].time == start, "times are kept (to the millisecond)")
        let head = try await store.head(of: "a", notBefore: start)
        try expect(head.top == 4 && head.oldest == 1, "the head: top 4, oldest 1; got \(head)")
    }

    @Sendable static func reading(_ store: any ChannelHistoryStore) async throws {
        let positions = try await store.appendPublications((1...10).map { publication("c", "c\($0)") })
        let epoch = positions[0].epoch
        let page = try await store.publications(of: "c", epoch: epoch, after: 3, limit: 4, notBefore: start)
        try expect(texts(page) == ["c4", "c5", "c6", "c7"], "a page after 3 of 4: got \(texts(page))")
        let end = try await store.publications(of: "c", epoch: epoch, after: 10, limit: 4, notBefore: start)
        try expect(end?.isEmpty == true, "nothing after the top, got \(texts(end))")
        let otherEpoch = epoch == .max ? 1 : epoch + 1
        let lost = try await store.publications(of: "c", epoch: otherEpoch, after: 0, limit: 4, notBefore: start)
        try expect(lost == nil, "a read in another epoch is nil, got \(texts(lost))")
        let none = try await store.publications(of: "nothing", epoch: epoch, after: 0, limit: 4, notBefore: start)
        try expect(none == nil, "a read of a channel without a stream is nil")
    }

    @Sendable static func retentionByCount(_ store: any ChannelHistoryStore) async throws {
        _ = try await store.appendPublications((1...5).map { publication("d", "d\($0)", maxCount: 3) })
        let head = try await store.head(of: "d", notBefore: start)
        try expect(head.top == 5 && head.oldest == 3, "5 appended, 3 kept: top 5, oldest 3; got \(head)")
        let kept = try await store.publications(of: "d", epoch: head.epoch, after: 0, limit: 10, notBefore: start)
        try expect(texts(kept) == ["d3", "d4", "d5"], "the latest 3 are kept, got \(texts(kept))")
        _ = try await store.appendPublications([publication("d", "d6", maxCount: 1)])
        let after = try await store.head(of: "d", notBefore: start)
        try expect(after.top == 6 && after.oldest == 6, "a smaller count applies at the next append, got \(after)")
    }

    @Sendable static func retentionByAge(_ store: any ChannelHistoryStore) async throws {
        let positions = try await store.appendPublications((0..<6).map { publication("e", "e\($0 + 1)", at: Double($0) * 10) })
        let epoch = positions[0].epoch
        let recent = try await store.publications(of: "e", epoch: epoch, after: 0, limit: 10, notBefore: start + 25)
        try expect(texts(recent) == ["e4", "e5", "e6"], "published at or after +25 s: got \(texts(recent))")
        let head = try await store.head(of: "e", notBefore: start + 25)
        try expect(head.oldest == 4 && head.top == 6, "the oldest not before +25 s is 4, got \(head)")
        let dropped = try await store.trimPublications(before: start + 25)
        try expect(dropped == 3, "3 were published before +25 s, trimmed \(dropped)")
        let all = try await store.publications(of: "e", epoch: epoch, after: 0, limit: 10, notBefore: start)
        try expect(texts(all) == ["e4", "e5", "e6"], "trimmed ones are gone, got \(texts(all))")
        _ = try await store.trimPublications(before: start + 100)
        let empty = try await store.head(of: "e", notBefore: start)
        try expect(empty.epoch == epoch && empty.top == 6 && empty.oldest == nil, "the stream outlives its publications, got \(empty)")
        let next = try await store.appendPublications([publication("e", "e7", at: 100)])
        try expect(next == [ChannelPosition(epoch: epoch, offset: 7)], "offsets go on from the top, got \(next)")
    }
}
