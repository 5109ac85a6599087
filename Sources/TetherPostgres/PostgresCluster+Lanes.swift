import PostgresNIO
public import TetherCore
import TetherGateway

// A lane (an outbox's reliable messages) is held by one node at a time, under a fence that grows
// at each claim (`tether_lanes`): a node claims it, asking a live node that holds it to let go,
// and releases it when it no longer uses it.
extension PostgresCluster {
    public func releaseLane(_ fence: LaneFence) {
        self.state.withLockedValue { $0.releases.append(fence) }
        self.writes.ring()
    }

    public func claimLane(_ outbox: OutboxID) async throws -> LaneFence {
        guard let node = self.nodeID else {
            throw MessageStoreError(code: .storage, message: "the node has not joined its cluster yet")
        }
        do {
            return try await self.claimLane(outbox, as: node)
        } catch {
            // PostgreSQL's own words in the gateway's log, not PSQLError's generic description.
            throw PostgresMessageStore.storageError(error)
        }
    }

    private func claimLane(_ outbox: OutboxID, as node: Int64) async throws -> LaneFence {
        let start = ContinuousClock.now
        var pause = Duration.milliseconds(20)
        var asked: Int64?
        var lastAsked = start
        let space = PostgresSchema.lockSpace
        let timeout = Self.seconds(self.configuration.nodeTimeout)
        while true {
            let epoch = Int64(bitPattern: outbox.epoch)
            let rows = try await self.query(
                """
                INSERT INTO tether_lanes AS l (client, epoch, node, fence) VALUES (\(outbox.client), \(epoch), \(node), 1)
                ON CONFLICT (client, epoch) DO UPDATE SET node = excluded.node, fence = l.fence + 1, claimed_at = now()
                WHERE l.node IS NULL OR l.node = excluded.node OR NOT EXISTS (
                    SELECT 1 FROM tether_nodes n
                    WHERE n.id = l.node AND n.seen_at > now() - make_interval(secs => \(timeout))
                        AND EXISTS (
                            SELECT 1 FROM pg_locks k WHERE k.locktype = 'advisory' AND k.granted
                                AND k.classid::bigint = \(Int64(space)) AND k.objid::bigint = n.id AND k.objsubid = 2))
                RETURNING l.fence
                """
            )
            for fence in try rows.map({ try $0.decode(Int64.self) }) {
                return LaneFence(outbox: outbox, token: UInt64(bitPattern: fence))
            }
            // A live node holds it: ask it to let go (again every second), and try again.
            var holder: Int64?
            for value in try await self.query(
                "SELECT node FROM tether_lanes WHERE client = \(outbox.client) AND epoch = \(epoch)"
            ).map({ try $0.decode(Int64?.self) }) {
                holder = value
            }
            let now = ContinuousClock.now
            if let holder, holder != asked || now - lastAsked >= .seconds(1) {
                _ = try await self.query(
                    """
                    WITH s AS (
                        INSERT INTO tether_signals (node, kind, key)
                        VALUES (\(holder), \(ClusterSignal.Kind.releaseLane.rawValue), \(Self.key(of: outbox)))
                    )
                    SELECT pg_notify('tether_node_' || \(holder), '')
                    """
                )
                asked = holder
                lastAsked = now
            }
            guard now - start < self.configuration.claimTimeout else {
                throw MessageStoreError(
                    code: .storage,
                    message:
                        "the lane of \(outbox) is held by node \(holder.map(String.init) ?? "?"), which did not let it go within \(self.configuration.claimTimeout)"
                )
            }
            try await Task.sleep(for: pause)
            pause = min(pause * 2, .milliseconds(250))
        }
    }
}
