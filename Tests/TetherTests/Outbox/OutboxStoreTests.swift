import Foundation
import NIOCore
import Testing
import Tether
import TetherTestSupport

/// The contract of ``OutboxStore``, checked against every implementation.
@Suite("Outbox stores")
struct OutboxStoreTests {
    enum Kind: String, CaseIterable, CustomStringConvertible {
        case inMemory, sqliteInMemory, sqliteFile
        var description: String { self.rawValue }
    }

    static func temporaryPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("tether-outbox-\(UUID().uuidString).sqlite").path
    }

    func make(_ kind: Kind) throws -> any OutboxStore {
        switch kind {
        case .inMemory: InMemoryOutboxStore()
        case .sqliteInMemory: try SQLiteOutboxStore.inMemory()
        case .sqliteFile: try SQLiteOutboxStore(path: Self.temporaryPath())
        }
    }

    func record(_ id: UInt64, _ conversation: String, _ sequence: UInt64, expiresAt: Int64? = nil) -> OutboxRecord {
        OutboxRecord(
            id: id,
            topic: "t",
            conversation: conversation,
            sequence: sequence,
            priority: id % 2 == 0 ? .high : .low,
            expiresAt: expiresAt,
            body: ByteBuffer(string: "body \(id)")
        )
    }

    @Test("a new outbox is empty, numbered from 1, with a random epoch", arguments: Kind.allCases)
    func empty(_ kind: Kind) async throws {
        let snapshot = try await self.make(kind).load()
        #expect(snapshot.nextID == 1 && snapshot.records.isEmpty && snapshot.conversations.isEmpty && snapshot.checkpoint == nil)
        #expect(snapshot.epoch != 0)
        #expect(try await self.make(kind).load().epoch != snapshot.epoch)
    }

    @Test("records, counters, expiry, removal and the checkpoint round-trip", arguments: Kind.allCases)
    func roundTrip(_ kind: Kind) async throws {
        let store = try self.make(kind)
        try await store.append(
            [self.record(1, "a", 1, expiresAt: 1_700_000_000_000), self.record(2, "a", 2)],
            nextID: 3,
            conversations: ["a": 2]
        )
        try await store.append([self.record(3, "b", 1)], nextID: 4, conversations: ["b": 1])
        try await store.markExpired([2])
        try await store.remove([1])
        try await store.saveCheckpoint(DeliveryCheckpoint(epoch: 9, lastSequence: 41))
        let snapshot = try await store.load()
        #expect(snapshot.nextID == 4)
        #expect(snapshot.conversations == ["a": 2, "b": 1])
        #expect(snapshot.records.map(\.id) == [2, 3])
        #expect(snapshot.records[0].expired && snapshot.records[0].body.readableBytes == 0, "an expired message keeps no body")
        #expect(snapshot.records[1] == self.record(3, "b", 1))
        #expect(snapshot.checkpoint == DeliveryCheckpoint(epoch: 9, lastSequence: 41))
    }

    @Test("counters never go back, even if an append reports smaller ones", arguments: Kind.allCases)
    func countersOnlyGrow(_ kind: Kind) async throws {
        let store = try self.make(kind)
        try await store.append([self.record(5, "a", 5)], nextID: 6, conversations: ["a": 5])
        try await store.remove([5])
        try await store.append([], nextID: 2, conversations: ["a": 1])
        let snapshot = try await store.load()
        #expect(snapshot.nextID == 6 && snapshot.conversations == ["a": 5], "ids and sequences are never reused")
    }

    @Test("a SQLite outbox survives a close and reopen")
    func persistence() async throws {
        let path = Self.temporaryPath()
        let epoch: UInt64
        do {
            let store = try SQLiteOutboxStore(path: path)
            epoch = try await store.load().epoch
            try await store.append([self.record(1, "a", 1)], nextID: 2, conversations: ["a": 1])
        }
        let snapshot = try await SQLiteOutboxStore(path: path).load()
        #expect(snapshot.epoch == epoch && snapshot.records.map(\.id) == [1] && snapshot.nextID == 2)
    }

    @Test("a SQLite outbox file is used by one store at a time; the lock goes with the store")
    func exclusive() async throws {
        let path = Self.temporaryPath()
        do {
            let first = try SQLiteOutboxStore(path: path)
            let error = #expect(throws: OutboxStoreError.self) { try SQLiteOutboxStore(path: path) }
            #expect(error?.message.contains("in use by another client") == true)
            _ = try await first.load()
        }
        // The store's last reference may still be held for a moment by the database pool's
        // reader that just answered `load()`; the lock goes when the store goes.
        try await eventually("the lock is released with the store", timeout: .seconds(5)) {
            (try? SQLiteOutboxStore(path: path)) != nil
        }
        _ = try await SQLiteOutboxStore(path: path).load()
    }

    @Test("channel positions: none until saved, the last one per channel kept, across a close and reopen")
    func channelPositions() async throws {
        let path = Self.temporaryPath()
        do {
            let store = try SQLiteOutboxStore(path: path)
            #expect(try await store.channelPosition(of: "room.lobby") == nil)
            try await store.saveChannelPositions([
                "room.lobby": ChannelPosition(epoch: .max, offset: 7), "ünïcödé": ChannelPosition(epoch: 3, offset: 1),
            ])
            try await store.saveChannelPositions(["room.lobby": ChannelPosition(epoch: .max, offset: 9)])
        }
        try await eventually("the lock is released with the store", timeout: .seconds(5)) {
            (try? SQLiteOutboxStore(path: path)) != nil
        }
        let store = try SQLiteOutboxStore(path: path)
        #expect(try await store.channelPosition(of: "room.lobby") == ChannelPosition(epoch: .max, offset: 9))
        #expect(try await store.channelPosition(of: "ünïcödé") == ChannelPosition(epoch: 3, offset: 1))
        #expect(try await store.channelPosition(of: "room") == nil)
        #expect(try await store.load().records.isEmpty, "the outbox itself is untouched")
    }
}
