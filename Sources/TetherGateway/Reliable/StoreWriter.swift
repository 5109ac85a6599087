import TetherCore
import TetherNIO

/// Writes to the gateway's message store with **group commit**: the writes that arrive while
/// one is under way — every connection's batches, and the acknowledgements of deliveries —
/// go together in the next call to ``MessageStore/apply(_:)`` (one transaction in the SQLite
/// store), each still atomic on its own.
///
/// No task of its own: the first writer to find a round slot free leads, takes everything
/// waiting, applies it, answers the others, and hands the lead to the first of those that
/// arrived meanwhile, which leads the next round with its own write. A store may take several
/// rounds at once (``MessageStore/concurrentApplies``, PostgreSQL's): writes then wait only
/// when every slot is busy.
///
/// ```swift
/// let receipts = try await writer.commit(StoreWrite(processed: processed, deliveries: deliveries))
/// ```
final class StoreWriter: Sendable {
    let store: any MessageStore

    private enum Role: Sendable {
        case done(Result<[DeliveryReceipt], MessageStoreError>)
        /// Lead a round; `promoted`: handed the lead by the last round, with writes waiting.
        case lead(promoted: Bool)
    }

    private struct Waiting: Sendable {
        var write: StoreWrite
        var continuation: CheckedContinuation<Role, Never>
    }

    private struct State {
        /// Rounds under way. Writes wait only while it is at ``StoreWriter/slots``.
        var leading = 0
        var waiting: [Waiting] = []
        /// Why the last round failed as a whole (a full disk, the database unreachable); `nil`
        /// once a round succeeds.
        var failing: String?
    }

    private let state = TetherLock(State())
    /// How many rounds may be under way at once.
    private let slots: Int
    /// Where each round's duration, size and failure are counted.
    private let metrics: GatewayMetrics?
    private let clock: any TetherClock

    init(store: any MessageStore, metrics: GatewayMetrics? = nil, clock: any TetherClock = SystemClock()) {
        self.store = store
        self.slots = max(1, store.concurrentApplies)
        self.metrics = metrics
        self.clock = clock
    }

    /// Writes waiting for the next round.
    var writesWaiting: Int { self.state.withLockedValue { $0.waiting.count } }

    /// Why the store refused the last round as a whole, or `nil` if it took it (`/ready` says
    /// so: a store that answers reads but cannot commit takes no reliable message). Kept in the
    /// round's own turn of the lock: no lock of its own.
    var failing: String? { self.state.withLockedValue { $0.failing } }

    /// Applies `write` atomically, with whatever other writes arrive meanwhile.
    /// - Returns: The receipts of its deliveries, in order.
    /// - Throws: ``MessageStoreError``: a conflict, or the store's failure.
    func commit(_ write: StoreWrite) async throws(MessageStoreError) -> [DeliveryReceipt] {
        let role = await withCheckedContinuation { (continuation: CheckedContinuation<Role, Never>) in
            let slots = self.slots
            let lead = self.state.withLockedValue { state -> Bool in
                guard state.leading < slots else {
                    state.waiting.append(Waiting(write: write, continuation: continuation))
                    return false
                }
                state.leading += 1
                return true
            }
            if lead { continuation.resume(returning: .lead(promoted: false)) }
        }
        switch role {
        case .done(let result):
            return try result.get()
        case .lead(let promoted):
            return try await self.lead(with: write, promoted: promoted)
        }
    }

    /// One round: this write and every one waiting, in one call to the store. A writer that
    /// found a slot free finds none waiting either (writes wait only while every slot is busy,
    /// and a round ends by handing its slot to the first writer waiting), so only a promoted
    /// one looks.
    private func lead(with own: StoreWrite, promoted: Bool) async throws(MessageStoreError) -> [DeliveryReceipt] {
        let others: [Waiting] =
            promoted
            ? self.state.withLockedValue { state in
                defer { state.waiting.removeAll() }
                return state.waiting
            } : []
        let writes = [own] + others.map(\.write)
        var results: [Result<[DeliveryReceipt], MessageStoreError>]
        var failing: String?
        let started = self.clock.now
        defer {
            if let metrics = self.metrics {
                metrics.commitDuration.recordNanoseconds((self.clock.now - started).nanoseconds)
                metrics.commitWrites.record(writes.count)
            }
        }
        do {
            results = try await self.store.apply(writes)
            if results.count != writes.count {
                let error = MessageStoreError(code: .storage, message: "the store answered \(results.count) of \(writes.count) writes")
                results = Array(repeating: .failure(error), count: writes.count)
            }
        } catch {
            let failure = error as? MessageStoreError ?? MessageStoreError(code: .storage, message: "\(error)")
            results = Array(repeating: .failure(failure), count: writes.count)
            failing = failure.message
            self.metrics?.storeFailures.increment()
        }
        let next = self.state.withLockedValue { state -> Waiting? in
            state.failing = failing
            guard !state.waiting.isEmpty else {
                state.leading -= 1
                return nil
            }
            return state.waiting.removeFirst()
        }
        for (waiting, result) in zip(others, results.dropFirst()) {
            waiting.continuation.resume(returning: .done(result))
        }
        next?.continuation.resume(returning: .lead(promoted: true))
        return try results[0].get()
    }
}
