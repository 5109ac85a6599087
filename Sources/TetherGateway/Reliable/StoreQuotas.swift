import Atomics
import TetherCore
import TetherNIO

/// The quotas on what reliable deliveries may take of the store besides each recipient's: the
/// whole store's (deliveries and bytes waiting, ``GatewayConfiguration/Limits-swift.struct/maxStoredDeliveries``)
/// and each sender's (what one client's messages may store per minute,
/// ``GatewayConfiguration/Limits-swift.struct/maxDeliveriesPerSenderPerMinute``).
///
/// The store's usage is read from the store about once a second (``refresh(from:)``) and grows
/// with every commit in between; a lane's batch takes its room at its start, so lanes
/// committing in the same second may pass the quota by what they add together.
final class StoreQuotas: Sendable {
    private let limits: GatewayConfiguration.Limits
    /// The store's usage, as last read plus what was committed since; negative: not known.
    private let storedDeliveries = ManagedAtomic<Int>(-1)
    private let storedBytes = ManagedAtomic<Int>(0)
    /// What each sender may still store, refilled continuously at its quota per minute.
    private let senders = TetherLock<[String: SenderRoom]>([:])

    private struct SenderRoom {
        var deliveries: Double
        var bytes: Double
        var updated: TetherInstant
    }

    init(limits: GatewayConfiguration.Limits) {
        self.limits = limits
    }

    /// Reads the store's usage again.
    func refresh(from store: any MessageStore) async {
        guard let total = try? await store.totalUsage() else { return }
        self.storedBytes.store(total.bytes, ordering: .relaxed)
        self.storedDeliveries.store(total.deliveries, ordering: .relaxed)
    }

    /// The store's usage as the gateway counts it; `nil` before the store told it.
    var storeUsage: StreamUsage? {
        let deliveries = self.storedDeliveries.load(ordering: .relaxed)
        guard deliveries >= 0 else { return nil }
        return StreamUsage(deliveries: deliveries, bytes: self.storedBytes.load(ordering: .relaxed))
    }

    /// What a batch of `sender`'s messages may add to the store.
    func allowances(for sender: String, now: TetherInstant) -> [ReliableLaneMachine.Allowance] {
        var allowances: [ReliableLaneMachine.Allowance] = []
        allowances.reserveCapacity(2)
        let limits = self.limits
        if let usage = self.storeUsage {
            allowances.append(
                .init(
                    deliveries: max(0, limits.maxStoredDeliveries - usage.deliveries),
                    bytes: max(0, limits.maxStoredDeliveryBytes - usage.bytes)
                ) { deliveries in
                    deliveries
                        ? "the store holds its maximum of \(limits.maxStoredDeliveries) deliveries waiting"
                        : "the store holds its maximum of \(limits.maxStoredDeliveryBytes) bytes of deliveries waiting"
                }
            )
        }
        let room = self.room(of: sender, now: now)
        allowances.append(
            .init(deliveries: Self.whole(room.deliveries), bytes: Self.whole(room.bytes)) { deliveries in
                deliveries
                    ? "'\(sender)' stored its quota of \(limits.maxDeliveriesPerSenderPerMinute) deliveries in the last minute"
                    : "'\(sender)' stored its quota of \(limits.maxDeliveryBytesPerSenderPerMinute) bytes of deliveries in the last minute"
            }
        )
        return allowances
    }

    /// `sender`'s messages stored `deliveries` deliveries of `bytes` bytes in all.
    func stored(by sender: String?, deliveries: Int, bytes: Int, now: TetherInstant) {
        guard deliveries > 0 else { return }
        if self.storedDeliveries.load(ordering: .relaxed) >= 0 {
            self.storedDeliveries.wrappingIncrement(by: deliveries, ordering: .relaxed)
            self.storedBytes.wrappingIncrement(by: bytes, ordering: .relaxed)
        }
        guard let sender else { return }
        self.senders.withLockedValue { senders in
            var room = Self.refilled(senders[sender], limits: self.limits, now: now)
            room.deliveries -= Double(deliveries)
            room.bytes -= Double(bytes)
            senders[sender] = room
        }
    }

    private func room(of sender: String, now: TetherInstant) -> SenderRoom {
        self.senders.withLockedValue { senders in
            let room = Self.refilled(senders[sender], limits: self.limits, now: now)
            // A sender whose room is full again is forgotten: the map holds the recent senders only.
            if room.deliveries >= Double(self.limits.maxDeliveriesPerSenderPerMinute),
                room.bytes >= Double(self.limits.maxDeliveryBytesPerSenderPerMinute)
            {
                senders[sender] = nil
            } else {
                senders[sender] = room
            }
            return room
        }
    }

    /// `room` rounded down, at most `Int.max`: a limit of `Int.max` is `2^63` as a `Double`,
    /// which `Int(_:)` cannot hold.
    static func whole(_ room: Double) -> Int {
        room >= Double(Int.max) ? Int.max : Int(max(0, room))
    }

    private static func refilled(_ room: SenderRoom?, limits: GatewayConfiguration.Limits, now: TetherInstant) -> SenderRoom {
        let deliveries = Double(limits.maxDeliveriesPerSenderPerMinute)
        let bytes = Double(limits.maxDeliveryBytesPerSenderPerMinute)
        guard var room else { return SenderRoom(deliveries: deliveries, bytes: bytes, updated: now) }
        let minutes =
            max(0, Double((now - room.updated).components.attoseconds) / 1e18 + Double((now - room.updated).components.seconds)) / 60
        room.deliveries = min(deliveries, room.deliveries + deliveries * minutes)
        room.bytes = min(bytes, room.bytes + bytes * minutes)
        room.updated = now
        return room
    }
}
