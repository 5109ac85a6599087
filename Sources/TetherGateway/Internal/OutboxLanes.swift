import NIOConcurrencyHelpers

/// Serializes the processing of each outbox's reliable messages across its connections, and
/// knows which outboxes are connected.
///
/// When a connection drops while its messages are being processed, the client sends them again
/// on a new connection at once. Without a lane, the new connection could run a handler for a
/// message that the old one is still processing, and its side effects would happen twice (the
/// store's conflict check only keeps the deliveries from doubling). With one, the new connection
/// waits for the old batch, then finds those messages processed and only acknowledges them.
///
/// A lane belongs to one outbox (a client id and an outbox epoch), not to a client id: the
/// devices of one client number their messages independently, so their batches need not wait
/// for each other.
///
/// This holds within one gateway process; gateways sharing a database need the store's claim.
final class OutboxLanes: Sendable {
    /// One outbox's lane.
    final class Lane: Sendable {
        fileprivate let turn = AsyncSemaphore(permits: 1)
        private let cache = NIOLockedValueBox<[String: UInt64]>([:])

        /// The last processed sequence per conversation, as committed; read and written only
        /// while holding the lane.
        var lastProcessed: [String: UInt64] {
            get { self.cache.withLockedValue { $0 } }
            set { self.cache.withLockedValue { $0 = newValue } }
        }
    }

    private let lanes = NIOLockedValueBox<[OutboxID: (lane: Lane, users: Int)]>([:])

    /// Keeps an outbox's lane (and its cache) alive until the matching ``checkIn(_:)``.
    @discardableResult
    func checkOut(_ outbox: OutboxID) -> Lane {
        self.lanes.withLockedValue { lanes in
            if let entry = lanes[outbox] {
                lanes[outbox] = (entry.lane, entry.users + 1)
                return entry.lane
            }
            let lane = Lane()
            lanes[outbox] = (lane, 1)
            return lane
        }
    }

    /// Lets an outbox's lane go once nobody uses it.
    func checkIn(_ outbox: OutboxID) {
        self.lanes.withLockedValue { lanes in
            guard let entry = lanes[outbox] else { return }
            lanes[outbox] = entry.users > 1 ? (entry.lane, entry.users - 1) : nil
        }
    }

    /// The outboxes with a lane checked out: those of the connected clients, and those with a
    /// batch under way.
    var inUse: [OutboxID] { self.lanes.withLockedValue { Array($0.keys) } }

    /// Runs `body` while holding the outbox's lane: no other `exclusively` call for the same
    /// outbox runs at the same time.
    /// - Throws: `CancellationError` if the task is cancelled while waiting; what `body` throws.
    func exclusively<T: Sendable>(_ outbox: OutboxID, _ body: (Lane) async throws -> T) async throws -> T {
        let lane = self.checkOut(outbox)
        defer { self.checkIn(outbox) }
        try await lane.turn.acquire()
        defer { lane.turn.release() }
        return try await body(lane)
    }
}
