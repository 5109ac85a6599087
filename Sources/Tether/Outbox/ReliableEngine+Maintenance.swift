import Foundation
import Logging
import TetherCore
import TetherNIO

extension ReliableEngine {
    // MARK: Expiry (on the event loop)

    /// Makes the one expiry timer fire when the next message expires.
    func armExpiryTimer() {
        let cancelled = self.state.withValue { state -> ClockCallback? in
            guard !state.finished, let next = state.outbox?.nextExpiry else { return nil }
            let armed = state.expiryTimer
            if let armed, next >= armed.at { return nil }
            let delay = Duration.milliseconds(max(0, next - self.clock.wallClockMilliseconds))
            state.expiryTimer = (next, self.clock.schedule(at: self.clock.now + delay, on: self.eventLoop) { self.expiryTimerFired() })
            return armed?.callback
        }
        cancelled?.cancel()
    }

    private func expiryTimerFired() {
        let now = self.clock.wallClockMilliseconds
        let (tombstones, finished, sink, depth) = self.state.withValue { state in
            state.expiryTimer = nil
            let tombstones = state.outbox?.expire(now: now) ?? []
            let finished = tombstones.map { ($0, MessageOutcome.expired, state.outcomeWaiters.removeValue(forKey: $0.id) ?? []) }
            return (tombstones, finished, state.sink, state.outbox?.depth ?? 0)
        }
        self.report(finished, depth: depth)
        for tombstone in tombstones { sink?.replace(with: tombstone) }
        if !tombstones.isEmpty { self.storageWorkDue() }
        self.armExpiryTimer()
    }

    // MARK: Maintenance

    /// Writes removals, expirations and the delivery checkpoint in groups, and acknowledges
    /// processed deliveries once their checkpoint is stored. Runs until ``finish()``.
    ///
    /// The loop hands it work while it is idle; work that becomes due while it is busy waits
    /// in the machines, and it asks for all of it at once when it is done: one storage call
    /// per burst, and no hop to the loop for a message sent alone.
    func runMaintenance() async {
        for await first in self.storageWork.stream {
            var work = first
            while true {
                await self.perform(work)
                let (idle, _) = self.maintenance.compareExchange(
                    expected: Maintenance.busy,
                    desired: Maintenance.idle,
                    ordering: .acquiringAndReleasing
                )
                if idle { break }
                self.maintenance.store(Maintenance.busy, ordering: .releasing)  // more was due: take it
                work = await withUnsafeContinuation { self.submit(.takeStorageWork($0)) }
            }
        }
        await self.perform(await withUnsafeContinuation { self.submit(.takeStorageWork($0)) })
    }

    private func perform(_ work: StorageWork) async {
        do {
            if !work.expire.isEmpty { try await self.configuration.outbox.markExpired(work.expire) }
            if !work.remove.isEmpty { try await self.configuration.outbox.remove(work.remove) }
        } catch {
            // Not fatal: a message not removed is sent again and deduplicated.
            self.logger.error("outbox maintenance failed", metadata: ["error": "\(error)"])
        }
        guard let checkpoint = work.checkpoint else { return }
        do {
            try await self.configuration.outbox.saveCheckpoint(checkpoint)
        } catch {
            // Not acknowledged either: after a crash, the gateway sends those deliveries again.
            self.logger.error("cannot save the delivery checkpoint", metadata: ["error": "\(error)"])
            self.submit(.checkpointFailed)
            return
        }
        self.submit(.checkpointSaved(checkpoint))
    }

    // MARK: On the event loop

    /// Storage work or a checkpoint may be due: handed to the maintenance task if it is idle,
    /// else marked due for it.
    func storageWorkDue() {
        guard !self.state.value.finished else { return }  // the last flush takes it
        while true {
            switch self.maintenance.load(ordering: .acquiring) {
            case Maintenance.idle:
                let (exchanged, _) = self.maintenance.compareExchange(
                    expected: Maintenance.idle,
                    desired: Maintenance.busy,
                    ordering: .acquiringAndReleasing
                )
                guard exchanged else { continue }
                let work = self.takeStorageWork()
                if work.isEmpty {
                    self.maintenance.store(Maintenance.idle, ordering: .releasing)  // only the loop leaves idle
                } else {
                    self.storageWork.continuation.yield(work)
                }
                return
            case Maintenance.busy:
                let (exchanged, _) = self.maintenance.compareExchange(
                    expected: Maintenance.busy,
                    desired: Maintenance.due,
                    ordering: .acquiringAndReleasing
                )
                if exchanged { return }
            default:
                return  // due already
            }
        }
    }

    func takeStorageWork(for waiter: UnsafeContinuation<StorageWork, Never>) {
        waiter.resume(returning: self.takeStorageWork())
    }

    private func takeStorageWork() -> StorageWork {
        self.state.withValue { state in
            let (remove, expire) = state.outbox?.takeStorageWork() ?? (remove: [], expire: [])
            return StorageWork(remove: remove, expire: expire, checkpoint: state.inbox.takeCheckpointToSave())
        }
    }

    func checkpointSaved(_ checkpoint: DeliveryCheckpoint) {
        let acknowledgement: (UInt64, any ReliableSink)? = self.state.withValue { state in
            guard let sequence = state.inbox.checkpointSaved(checkpoint), let sink = state.sink else { return nil }
            return (sequence, sink)
        }
        if let (sequence, sink) = acknowledgement { sink.acknowledgeDeliveries(upTo: sequence) }
    }
}
