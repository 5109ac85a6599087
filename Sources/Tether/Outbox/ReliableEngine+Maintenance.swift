import Foundation
import Logging
import TetherCore
import TetherNIO

extension ReliableEngine {
    // MARK: Expiry

    /// Makes the one expiry timer fire when the next message expires.
    func armExpiryTimer() {
        self.state.withLockedValue { state in
            guard !state.finished, let next = state.outbox?.nextExpiry else { return }
            if let armed = state.expiryTimer {
                guard next < armed.at else { return }
                armed.callback.cancel()
            }
            let delay = Duration.milliseconds(max(0, next - self.clock.wallClockMilliseconds))
            state.expiryTimer = (next, self.clock.schedule(at: self.clock.now + delay, on: self.eventLoop) { self.expiryTimerFired() })
        }
    }

    private func expiryTimerFired() {
        let now = self.clock.wallClockMilliseconds
        let (tombstones, finished, sink, depth) = self.state.withLockedValue { state in
            state.expiryTimer = nil
            let tombstones = state.outbox?.expire(now: now) ?? []
            let finished = tombstones.map { ($0, MessageOutcome.expired, state.outcomeWaiters.removeValue(forKey: $0.id) ?? []) }
            return (tombstones, finished, state.sink, state.outbox?.depth ?? 0)
        }
        self.report(finished, depth: depth)
        for tombstone in tombstones { sink?.replace(with: tombstone) }
        if !tombstones.isEmpty { self.wakeup.continuation.yield() }
        self.armExpiryTimer()
    }

    // MARK: Maintenance

    /// Writes removals, expirations and the delivery checkpoint in groups, and acknowledges
    /// processed deliveries once their checkpoint is stored. Runs until ``finish()``.
    func runMaintenance() async {
        for await _ in self.wakeup.stream {
            await self.flush()
        }
        await self.flush()
    }

    private func flush() async {
        let (work, checkpoint) = self.state.withLockedValue { state in
            (state.outbox?.takeStorageWork() ?? (remove: [], expire: []), state.inbox.takeCheckpointToSave())
        }
        do {
            if !work.expire.isEmpty { try await self.configuration.outbox.markExpired(work.expire) }
            if !work.remove.isEmpty { try await self.configuration.outbox.remove(work.remove) }
        } catch {
            // Not fatal: a message not removed is sent again and deduplicated.
            self.logger.error("outbox maintenance failed", metadata: ["error": "\(error)"])
        }
        guard let checkpoint else { return }
        do {
            try await self.configuration.outbox.saveCheckpoint(checkpoint)
        } catch {
            // Not acknowledged either: after a crash, the gateway sends those deliveries again.
            self.logger.error("cannot save the delivery checkpoint", metadata: ["error": "\(error)"])
            self.state.withLockedValue { $0.inbox.checkpointFailed() }
            return
        }
        let acknowledgement: (UInt64, any ReliableSink)? = self.state.withLockedValue { state in
            guard let sequence = state.inbox.checkpointSaved(checkpoint), let sink = state.sink else { return nil }
            return (sequence, sink)
        }
        if let (sequence, sink) = acknowledgement { sink.acknowledgeDeliveries(upTo: sequence) }
    }
}
