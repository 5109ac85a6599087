import Foundation
import NIOCore
import Testing
import TetherGateway

/// The contract of ``MessageStore``, checked against every implementation.
@Suite("Message stores")
struct MessageStoreTests {
    enum Kind: String, CaseIterable, CustomStringConvertible {
        case inMemory, sqliteInMemory, sqliteFile
        var description: String { self.rawValue }
    }

    static func temporaryPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent("tether-store-\(UUID().uuidString).sqlite").path
    }

    func make(_ kind: Kind) throws -> any MessageStore {
        switch kind {
        case .inMemory: InMemoryMessageStore()
        case .sqliteInMemory: try SQLiteMessageStore.inMemory()
        case .sqliteFile: try SQLiteMessageStore(path: Self.temporaryPath())
        }
    }

    func body(_ text: String) -> ByteBuffer { ByteBuffer(string: text) }

    @Test("conversations advance one sequence at a time; a gap or a replay is a conflict that writes nothing", arguments: Kind.allCases)
    func ordering(_ kind: Kind) async throws {
        let store = try self.make(kind)
        #expect(try await store.lastProcessed(client: "a", conversation: "c") == 0)
        let receipts = try await store.commit(
            processed: [.init(client: "a", conversation: "c", sequence: 1), .init(client: "a", conversation: "c", sequence: 2)],
            deliveries: [.init(recipient: "b", topic: "t", body: self.body("one"))]
        )
        #expect(receipts == [.init(recipient: "b", sequence: 1)])
        #expect(try await store.lastProcessed(client: "a", conversation: "c") == 2)
        #expect(try await store.lastProcessed(client: "a", conversation: "other") == 0)

        for bad in [UInt64(2), 4] {
            await #expect(throws: MessageStoreError.self) {
                _ = try await store.commit(
                    processed: [.init(client: "a", conversation: "c", sequence: bad)],
                    deliveries: [.init(recipient: "b", topic: "t", body: self.body("must not be stored"))]
                )
            }
        }
        // A batch that is valid up to a conflicting message writes nothing either.
        await #expect(throws: MessageStoreError.self) {
            _ = try await store.commit(
                processed: [.init(client: "a", conversation: "c", sequence: 3), .init(client: "a", conversation: "c", sequence: 5)],
                deliveries: []
            )
        }
        #expect(try await store.lastProcessed(client: "a", conversation: "c") == 2)
        #expect(try await store.deliveries(for: "b", after: 0, limit: 10).map(\.body) == [self.body("one")])
    }

    @Test("refusals are remembered so a retransmission gets the same status", arguments: Kind.allCases)
    func refusals(_ kind: Kind) async throws {
        let store = try self.make(kind)
        _ = try await store.commit(
            processed: [
                .init(client: "a", conversation: "c", sequence: 1),
                .init(client: "a", conversation: "c", sequence: 2, status: .invalidRequest),
            ],
            deliveries: []
        )
        #expect(try await store.outcome(client: "a", conversation: "c", sequence: 1) == .ok)
        #expect(try await store.outcome(client: "a", conversation: "c", sequence: 2) == .invalidRequest)
        #expect(try await store.outcome(client: "x", conversation: "c", sequence: 2) == .ok)
    }

    @Test("deliveries are numbered per recipient from 1, kept until acknowledged, never renumbered", arguments: Kind.allCases)
    func deliveries(_ kind: Kind) async throws {
        let store = try self.make(kind)
        let first = try await store.commit(
            processed: [],
            deliveries: [
                .init(recipient: "b", topic: "t", body: self.body("b1")),
                .init(recipient: "c", topic: "t", body: self.body("c1")),
                .init(recipient: "b", topic: "u", body: self.body("b2")),
            ]
        )
        #expect(first == [.init(recipient: "b", sequence: 1), .init(recipient: "c", sequence: 1), .init(recipient: "b", sequence: 2)])
        let more = try await store.commit(
            processed: [],
            deliveries: (3...10).map { .init(recipient: "b", topic: "t", body: self.body("b\($0)")) }
        )
        #expect(more.map(\.sequence) == Array(3...10))

        #expect(try await store.deliveries(for: "b", after: 0, limit: 3).map(\.sequence) == [1, 2, 3])
        #expect(try await store.deliveries(for: "b", after: 8, limit: 10).map(\.sequence) == [9, 10])
        #expect(
            try await store.deliveries(for: "b", after: 1, limit: 1).first == StoredDelivery(sequence: 2, topic: "u", body: self.body("b2"))
        )

        try await store.acknowledge(recipient: "b", upTo: 9)
        #expect(try await store.deliveries(for: "b", after: 0, limit: 100).map(\.sequence) == [10])
        #expect(try await store.deliveries(for: "c", after: 0, limit: 100).map(\.sequence) == [1])
        let next = try await store.commit(processed: [], deliveries: [.init(recipient: "b", topic: "t", body: self.body("b11"))])
        #expect(next.map(\.sequence) == [11], "acknowledged numbers are never reused")
    }

    @Test("a new outbox epoch resets the client's conversations; the same one does not", arguments: Kind.allCases)
    func outboxEpochs(_ kind: Kind) async throws {
        let store = try self.make(kind)
        #expect(try await store.registerOutbox(client: "a", epoch: 7) == false)
        _ = try await store.commit(processed: [.init(client: "a", conversation: "c", sequence: 1, status: .invalidRequest)], deliveries: [])
        _ = try await store.commit(processed: [.init(client: "z", conversation: "c", sequence: 1)], deliveries: [])
        #expect(try await store.registerOutbox(client: "a", epoch: 7) == false)
        #expect(try await store.lastProcessed(client: "a", conversation: "c") == 1)
        #expect(try await store.registerOutbox(client: "a", epoch: 8) == true)
        #expect(try await store.lastProcessed(client: "a", conversation: "c") == 0)
        #expect(try await store.outcome(client: "a", conversation: "c", sequence: 1) == .ok)
        #expect(try await store.lastProcessed(client: "z", conversation: "c") == 1, "other clients keep their state")
    }

    @Test("a SQLite store keeps everything, and its epoch, across a close and reopen")
    func persistence() async throws {
        let path = Self.temporaryPath()
        let epoch: UInt64
        do {
            let store = try SQLiteMessageStore(path: path)
            epoch = store.epoch
            _ = try await store.registerOutbox(client: "a", epoch: 1)
            _ = try await store.commit(
                processed: [.init(client: "a", conversation: "c", sequence: 1)],
                deliveries: [.init(recipient: "b", topic: "t", body: self.body("kept"))]
            )
        }
        let reopened = try SQLiteMessageStore(path: path)
        #expect(reopened.epoch == epoch)
        #expect(try await reopened.lastProcessed(client: "a", conversation: "c") == 1)
        #expect(try await reopened.deliveries(for: "b", after: 0, limit: 10).map(\.body) == [self.body("kept")])
        #expect(try await reopened.registerOutbox(client: "a", epoch: 1) == false)
        #expect(try SQLiteMessageStore(path: Self.temporaryPath()).epoch != epoch, "another store has another epoch")
    }

    @Test("an unusable path is a clear error")
    func badPath() {
        #expect(throws: MessageStoreError.self) { try SQLiteMessageStore(path: "/nonexistent-directory/x/store.sqlite") }
    }
}
