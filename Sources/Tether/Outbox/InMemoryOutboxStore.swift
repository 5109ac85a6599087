import TetherNIO

/// An ``OutboxStore`` in memory: messages survive reconnects, not the process.
public final class InMemoryOutboxStore: OutboxStore {
    private let state: TetherLock<OutboxSnapshot>

    /// An empty outbox with a random epoch.
    public init() {
        self.state = TetherLock(
            OutboxSnapshot(epoch: UInt64.random(in: 1...UInt64.max), nextID: 1, conversations: [:], records: [], checkpoint: nil)
        )
    }

    public func load() async throws -> OutboxSnapshot {
        self.state.withLockedValue { $0 }
    }

    public func append(_ records: [OutboxRecord], nextID: UInt64, conversations: [String: UInt64]) async throws {
        self.state.withLockedValue { state in
            state.records += records
            state.nextID = max(state.nextID, nextID)
            state.conversations.merge(conversations) { max($0, $1) }
        }
    }

    public func markExpired(_ ids: [UInt64]) async throws {
        let expired = Set(ids)
        self.state.withLockedValue { state in
            for index in state.records.indices where expired.contains(state.records[index].id) {
                state.records[index].expired = true
                state.records[index].body.clear()
            }
        }
    }

    public func remove(_ ids: [UInt64]) async throws {
        let removed = Set(ids)
        self.state.withLockedValue { state in state.records.removeAll { removed.contains($0.id) } }
    }

    public func saveCheckpoint(_ checkpoint: DeliveryCheckpoint) async throws {
        self.state.withLockedValue { $0.checkpoint = checkpoint }
    }
}
