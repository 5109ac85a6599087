import NIOConcurrencyHelpers

/// Serializes the processing of each client's reliable messages across its connections.
///
/// When a connection drops while its messages are being processed, the client sends them again
/// on a new connection at once. Without a lane, the new connection could run a handler for a
/// message that the old one is still processing, and its side effects would happen twice (the
/// store's conflict check only keeps the deliveries from doubling). With one, the new connection
/// waits for the old batch, then finds those messages processed and only acknowledges them.
///
/// This holds within one gateway process; gateways sharing a database need the store's claim.
final class ClientLanes: Sendable {
    /// One client's lane.
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

    private let lanes = NIOLockedValueBox<[String: (lane: Lane, users: Int)]>([:])

    /// Keeps a client's lane (and its cache) alive until the matching ``checkIn(_:)``.
    func checkOut(_ client: String) -> Lane {
        self.lanes.withLockedValue { lanes in
            if let entry = lanes[client] {
                lanes[client] = (entry.lane, entry.users + 1)
                return entry.lane
            }
            let lane = Lane()
            lanes[client] = (lane, 1)
            return lane
        }
    }

    /// Lets a client's lane go once nobody uses it.
    func checkIn(_ client: String) {
        self.lanes.withLockedValue { lanes in
            guard let entry = lanes[client] else { return }
            lanes[client] = entry.users > 1 ? (entry.lane, entry.users - 1) : nil
        }
    }

    /// Runs `body` while holding the client's lane: no other `exclusively` call for the same
    /// client runs at the same time.
    /// - Throws: `CancellationError` if the task is cancelled while waiting; what `body` throws.
    func exclusively<T: Sendable>(_ client: String, _ body: (Lane) async throws -> T) async throws -> T {
        let lane = self.checkOut(client)
        defer { self.checkIn(client) }
        try await lane.turn.acquire()
        defer { lane.turn.release() }
        return try await body(lane)
    }
}
