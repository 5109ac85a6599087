import Atomics
import TetherCore
import TetherNIO

/// The lanes of the outboxes whose clients are connected: one ``ReliableLaneMachine`` per
/// outbox, whose batches run one at a time across all of the outbox's connections.
///
/// When a connection drops while its messages are being processed, the client sends them again
/// on a new connection at once. Without a lane, the new connection could run a handler for a
/// message the old one is still processing, and its side effects would happen twice (the
/// store's conflict check only keeps the deliveries from doubling). With one, the new
/// connection waits for the old batch, then finds those messages processed and only
/// acknowledges them.
///
/// A connection checks its outbox's lane out when it is established and in when it is done
/// (closed, its last task ended): a lane lives while any connection of its outbox, or a batch
/// of one, does. This holds within one gateway process; gateways that share a store need the
/// store's claim (a lease with a fencing token).
final class ReliableLanes: Sendable {
    /// One outbox's lane.
    final class Lane: @unchecked Sendable {
        // Unchecked: `machine` is read and written only by the holder of `turn`, which one
        // batch at a time holds.

        let turn = LaneTurn()
        /// What the lane knows of its outbox's conversations, and the batch under way.
        var machine: ReliableLaneMachine
        /// In a cluster, this node's claim on the lane, once a batch claimed it.
        var fence: LaneFence?

        init(_ configuration: ReliableLaneMachine.Configuration) {
            self.machine = ReliableLaneMachine(configuration: configuration)
        }
    }

    private let lanes = TetherLock<[OutboxID: (lane: Lane, users: Int)]>([:])
    private let limits: GatewayConfiguration.Limits
    private let cluster: (any GatewayCluster)?

    init(limits: GatewayConfiguration.Limits, cluster: (any GatewayCluster)? = nil) {
        self.limits = limits
        self.cluster = cluster
    }

    /// Keeps an outbox's lane alive until the matching ``checkIn(_:)``.
    func checkOut(_ outbox: OutboxID) -> Lane {
        self.cluster?.clientArrived(outbox.client)
        return self.lanes.withLockedValue { lanes in
            if let entry = lanes[outbox] {
                lanes[outbox] = (entry.lane, entry.users + 1)
                return entry.lane
            }
            let lane = Lane(
                ReliableLaneMachine.Configuration(
                    outbox: outbox,
                    maxDeliveriesPerRecipient: self.limits.maxDeliveriesPerRecipient,
                    maxDeliveryBytesPerRecipient: self.limits.maxDeliveryBytesPerRecipient
                )
            )
            lanes[outbox] = (lane, 1)
            return lane
        }
    }

    /// Lets an outbox's lane go once nobody uses it.
    func checkIn(_ outbox: OutboxID) {
        let released = self.lanes.withLockedValue { lanes -> Lane? in
            guard let entry = lanes[outbox] else { return nil }
            lanes[outbox] = entry.users > 1 ? (entry.lane, entry.users - 1) : nil
            return entry.users > 1 ? nil : entry.lane
        }
        guard let cluster = self.cluster else { return }
        cluster.clientLeft(outbox.client)
        // Its last user is done, and with it the last batch: nobody holds the turn.
        if let fence = released?.fence { cluster.releaseLane(fence) }
    }

    /// Whether a connection of this node uses the lane of `outbox`.
    func isInUse(_ outbox: OutboxID) -> Bool {
        self.lanes.withLockedValue { $0[outbox] != nil }
    }

    /// The outboxes with a lane checked out: those of the connected clients.
    var inUse: [OutboxID] { self.lanes.withLockedValue { Array($0.keys) } }
}

/// The turn of a lane: held by one batch at a time, handed to the next in order of arrival.
///
/// Taking a free turn and giving it back with nobody waiting cost one atomic operation each;
/// the lock is taken only when batches of one outbox meet (a reconnection while a batch of the
/// old connection runs).
final class LaneTurn: Sendable {
    /// 0: free; 1: held; 2: held, and batches wait.
    private let state = ManagedAtomic<Int>(0)
    private let waiters = TetherLock<[CheckedContinuation<Void, Never>]>([])

    /// Takes the turn, waiting for it if another batch holds it. Not cancellable: a batch that
    /// waits must run (its messages were taken from the connection).
    func acquire() async {
        if self.state.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged { return }
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let acquired = self.waiters.withLockedValue { waiters -> Bool in
                while true {
                    if self.state.compareExchange(expected: 0, desired: 1, ordering: .acquiring).exchanged { return true }
                    if self.state.compareExchange(expected: 1, desired: 2, ordering: .relaxed).exchanged
                        || self.state.load(ordering: .relaxed) == 2
                    {
                        waiters.append(continuation)
                        return false
                    }
                }
            }
            if acquired { continuation.resume() }
        }
    }

    /// Gives the turn back, or hands it to the batch that waited longest.
    func release() {
        if self.state.compareExchange(expected: 1, desired: 0, ordering: .releasing).exchanged { return }
        let next = self.waiters.withLockedValue { waiters -> CheckedContinuation<Void, Never> in
            let next = waiters.removeFirst()
            if waiters.isEmpty { self.state.store(1, ordering: .releasing) }  // held by `next`, nobody waits
            return next
        }
        next.resume()
    }
}
