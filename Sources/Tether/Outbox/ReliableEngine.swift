import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import TetherCore

/// What the engine needs from the current connection.
protocol ReliableSink: AnyObject, Sendable {
    /// Sends these messages (in addition to those already queued).
    func enqueue(_ records: [OutboxRecord])
    /// A queued or unacknowledged message expired: send its tombstone instead.
    func replace(with tombstone: OutboxRecord)
    /// Tells the gateway that every delivery up to `sequence` was processed.
    func acknowledgeDeliveries(upTo sequence: UInt64)
}

/// What the client's reliable engine hears from a connection.
struct ReliableCallbacks: Sendable {
    var acknowledged: @Sendable ([Frame.MessageAck.Entry]) -> Void
    var sent: @Sendable ([UInt64]) -> Void
    /// A DELIVERY arrived on a connection whose WELCOME announced this delivery epoch.
    var delivery: @Sendable (Frame.Delivery, _ epoch: UInt64) -> DeliveryVerdict
}

/// What to do with an inbound DELIVERY.
typealias DeliveryVerdict = InboxMachine.Verdict

/// The client's reliable messaging (PROTOCOL.md, section 9): the outbox (messages accepted
/// durably, kept until acknowledged) and the inbox (deliveries handed to the app once, in
/// order, checkpointed).
///
/// Accepting messages uses group commit: the first caller that finds no commit running commits
/// every message waiting at that moment in one transaction, and numbers them only once that
/// succeeds, so a failed commit leaves no gap in any conversation. The other callers wait for
/// their group's commit. Removals, expirations and the delivery checkpoint are written in
/// groups too, by ``runMaintenance()``, which runs inside ``TetherClient/run()``.
final class ReliableEngine: Sendable {
    private struct PendingSend {
        var topic: String
        var conversation: String
        var priority: MessagePriority
        var expiresAt: Int64?
        var body: ByteBuffer
        var ticket: SendTicket
    }

    private enum Load {
        case notLoaded
        case loading([CheckedContinuation<Void, any Error>])
        case loaded
        case failed(TetherError)
    }

    private struct State {
        var load = Load.notLoaded
        var finished = false
        // Outbox
        var epoch: UInt64 = 0
        var nextID: UInt64 = 1
        var conversations: [String: UInt64] = [:]
        var records: [UInt64: OutboxRecord] = [:]
        var waiting: [PendingSend] = []
        var committing = false
        var capacityWaiters: [Int: CheckedContinuation<Void, any Error>] = [:]
        var nextWaiterID = 0
        var outcomes: [UInt64: MessageOutcome] = [:]
        var outcomeOrder = CircularBuffer<UInt64>()
        var outcomeWaiters: [UInt64: [CheckedContinuation<MessageOutcome?, Never>]] = [:]
        var reportedSent: Set<UInt64> = []
        var expiryTimers: [UInt64: Scheduled<Void>] = [:]
        var toRemove: [UInt64] = []
        var toExpire: [UInt64] = []
        var sink: (any ReliableSink)?
        // Inbox
        var inbox = InboxMachine(checkpoint: nil)
        /// The application's consumer, suspended until a delivery arrives.
        var consumer: CheckedContinuation<Frame.Delivery?, Never>?
        var consuming = false
    }

    /// How many finished outcomes are remembered for ``outcome(of:)``.
    static let rememberedOutcomes = 10_000

    let configuration: ClientConfiguration.Reliability
    private let eventLoop: any EventLoop
    private let logger: Logger
    private let state = NIOLockedValueBox(State())
    let events = Broadcaster<MessageEvent>(bufferSize: 100_000)
    private let wakeup = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))

    init(configuration: ClientConfiguration.Reliability, eventLoop: any EventLoop, logger: Logger) {
        self.configuration = configuration
        self.eventLoop = eventLoop
        self.logger = logger
    }

    // MARK: Loading

    /// Loads the outbox on first use: the first caller loads it, later ones wait for that.
    func loadIfNeeded() async throws(TetherError) {
        enum Next { case done(Result<Void, TetherError>), load, wait }
        let next: Next = self.state.withLockedValue { state in
            switch state.load {
            case .loaded: return .done(.success(()))
            case .failed(let error): return .done(.failure(error))
            case .loading: return .wait
            case .notLoaded:
                state.load = .loading([])
                return .load
            }
        }
        switch next {
        case .done(let result):
            try result.get()
        case .load:
            try await self.load().get()
        case .wait:
            do {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    let result: Result<Void, TetherError>? = self.state.withLockedValue { state in
                        switch state.load {
                        case .loaded: return .success(())
                        case .failed(let error): return .failure(error)
                        case .notLoaded: return .failure(TetherError(code: .storage, message: "the outbox is not loaded"))
                        case .loading(var waiters):
                            waiters.append(continuation)
                            state.load = .loading(waiters)
                            return nil
                        }
                    }
                    if let result { continuation.resume(with: result.mapError { $0 as any Error }) }
                }
            } catch {
                throw error as? TetherError ?? TetherError(code: .storage, message: "\(error)")
            }
        }
    }

    private func load() async -> Result<Void, TetherError> {
        let result: Result<OutboxSnapshot, TetherError>
        do {
            result = .success(try await self.configuration.outbox.load())
        } catch {
            result = .failure(TetherError(code: .storage, message: "cannot load the outbox: \(error)", cause: error))
        }
        let (waiters, expired) = self.state.withLockedValue { state -> ([CheckedContinuation<Void, any Error>], [OutboxRecord]) in
            guard case .loading(let waiters) = state.load else { return ([], []) }
            switch result {
            case .failure(let error):
                state.load = .failed(error)
                return (waiters, [])
            case .success(let snapshot):
                state.load = .loaded
                state.epoch = snapshot.epoch
                state.nextID = snapshot.nextID
                state.conversations = snapshot.conversations
                for record in snapshot.records { state.records[record.id] = record }
                state.inbox = InboxMachine(checkpoint: snapshot.checkpoint)
                return (waiters, snapshot.records.filter { !$0.expired && $0.expiresAt != nil })
            }
        }
        for record in expired { self.scheduleExpiry(record) }
        let loaded = result.map { _ in () }
        for waiter in waiters { waiter.resume(with: loaded.mapError { $0 as any Error }) }
        return loaded
    }

    // MARK: Accepting messages

    /// Accepts a message durably; returns once it is stored.
    func send(
        topic: String,
        body: ByteBuffer,
        conversation: String,
        priority: MessagePriority,
        ttl: Duration?
    ) async throws(TetherError) -> MessageReceipt {
        guard !topic.isEmpty, topic.utf8.count <= Int(UInt16.max), conversation.utf8.count <= Int(UInt16.max) else {
            throw TetherError(code: .invalidArgument, message: "the topic must be 1 to 65535 bytes and the conversation at most 65535")
        }
        if let ttl, ttl <= .zero {
            throw TetherError(code: .invalidArgument, message: "the time to live must be positive")
        }
        try await self.loadIfNeeded()
        let expiresAt = ttl.map { WallClock.milliseconds() + max(1, $0.wholeMilliseconds) }
        let ticket = SendTicket()
        let send = PendingSend(
            topic: topic,
            conversation: conversation,
            priority: priority,
            expiresAt: expiresAt,
            body: body,
            ticket: ticket
        )

        while true {
            enum Admission { case lead, follow, full, shutDown }
            let admission: Admission = self.state.withLockedValue { state in
                if state.finished { return .shutDown }
                guard state.records.count + state.waiting.count < self.configuration.capacity else { return .full }
                state.waiting.append(send)
                if state.committing { return .follow }
                state.committing = true
                return .lead
            }
            switch admission {
            case .shutDown:
                throw TetherError(code: .shutdown, message: "the client is shut down")
            case .full where self.configuration.whenFull == .fail:
                throw TetherError(code: .outboxFull, message: "the outbox holds \(self.configuration.capacity) unacknowledged messages")
            case .full:
                try await self.waitForCapacity()
                continue
            case .lead:
                await self.commitWaiting()
            case .follow:
                break
            }
            return try await ticket.value
        }
    }

    /// Commits every waiting message in groups until none waits.
    private func commitWaiting() async {
        while true {
            let group: (sends: [PendingSend], records: [OutboxRecord], nextID: UInt64, conversations: [String: UInt64])? =
                self.state.withLockedValue { state in
                    guard !state.waiting.isEmpty else {
                        state.committing = false
                        return nil
                    }
                    let sends = state.waiting
                    state.waiting.removeAll()
                    // Numbered in a copy: applied only if the commit succeeds.
                    var nextID = state.nextID
                    var conversations: [String: UInt64] = [:]
                    let records = sends.map { send in
                        let sequence = (conversations[send.conversation] ?? state.conversations[send.conversation] ?? 0) + 1
                        conversations[send.conversation] = sequence
                        defer { nextID += 1 }
                        return OutboxRecord(
                            id: nextID,
                            topic: send.topic,
                            conversation: send.conversation,
                            sequence: sequence,
                            priority: send.priority,
                            expiresAt: send.expiresAt,
                            body: send.body
                        )
                    }
                    return (sends, records, nextID, conversations)
                }
            guard let group else { return }
            do {
                try await self.configuration.outbox.append(group.records, nextID: group.nextID, conversations: group.conversations)
            } catch {
                let failure = TetherError(code: .storage, message: "the outbox could not store the message: \(error)", cause: error)
                self.logger.error("outbox commit failed", metadata: ["error": "\(error)"])
                for send in group.sends { send.ticket.resolve(.failure(failure)) }
                self.wakeCapacityWaiters()
                continue
            }
            let sink = self.state.withLockedValue { state in
                state.nextID = max(state.nextID, group.nextID)
                state.conversations.merge(group.conversations) { max($0, $1) }
                for record in group.records { state.records[record.id] = record }
                return state.sink
            }
            for (send, record) in zip(group.sends, group.records) {
                send.ticket.resolve(.success(MessageReceipt(id: record.id, conversation: record.conversation, sequence: record.sequence)))
                self.events.yield(MessageEvent(id: record.id, conversation: record.conversation, sequence: record.sequence, state: .queued))
                if record.expiresAt != nil { self.scheduleExpiry(record) }
            }
            sink?.enqueue(group.records)
        }
    }

    private func waitForCapacity() async throws(TetherError) {
        let id = self.state.withLockedValue { state in
            defer { state.nextWaiterID += 1 }
            return state.nextWaiterID
        }
        do {
            try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    let ready = self.state.withLockedValue { state -> Bool in
                        if state.records.count + state.waiting.count < self.configuration.capacity || state.finished { return true }
                        if Task.isCancelled { return true }
                        state.capacityWaiters[id] = continuation
                        return false
                    }
                    if ready { continuation.resume() }
                }
            } onCancel: {
                let waiter = self.state.withLockedValue { $0.capacityWaiters.removeValue(forKey: id) }
                waiter?.resume(throwing: CancellationError())
            }
        } catch {
            throw TetherError(code: .cancelled, message: "the send was cancelled while the outbox was full")
        }
        if Task.isCancelled { throw TetherError(code: .cancelled, message: "the send was cancelled while the outbox was full") }
    }

    private func wakeCapacityWaiters() {
        let waiters = self.state.withLockedValue { state in
            defer { state.capacityWaiters.removeAll() }
            return Array(state.capacityWaiters.values)
        }
        for waiter in waiters { waiter.resume() }
    }

    // MARK: Outcomes

    /// The outcome of a message, waiting for it if it is still pending.
    /// - Returns: `nil` for an id the outbox does not know (any more).
    func outcome(of id: UInt64) async -> MessageOutcome? {
        await withCheckedContinuation { (continuation: CheckedContinuation<MessageOutcome?, Never>) in
            let known: MessageOutcome?? = self.state.withLockedValue { state in
                if let outcome = state.outcomes[id] { return .some(outcome) }
                guard let record = state.records[id] else { return .some(nil) }
                if record.expired { return .some(.expired) }
                state.outcomeWaiters[id, default: []].append(continuation)
                return .none
            }
            if let known { continuation.resume(returning: known) }
        }
    }

    /// The messages accepted but not finished yet, oldest first.
    func pending() async throws(TetherError) -> [MessageReceipt] {
        try await self.loadIfNeeded()
        return self.state.withLockedValue { state in
            state.records.values.filter { !$0.expired }.sorted { $0.id < $1.id }.map {
                MessageReceipt(id: $0.id, conversation: $0.conversation, sequence: $0.sequence)
            }
        }
    }

    /// Records a final outcome (under the lock) and returns the waiters to resume.
    private static func finish(
        _ id: UInt64,
        with outcome: MessageOutcome,
        in state: inout State
    ) -> [CheckedContinuation<MessageOutcome?, Never>] {
        state.outcomes[id] = outcome
        state.outcomeOrder.append(id)
        while state.outcomeOrder.count > Self.rememberedOutcomes, let oldest = state.outcomeOrder.popFirst() {
            state.outcomes[oldest] = nil
        }
        return state.outcomeWaiters.removeValue(forKey: id) ?? []
    }

    // MARK: Connection events

    /// A connection with reliable delivery was established.
    /// - Parameters:
    ///   - sink: The connection.
    ///   - deliveryEpoch: The delivery epoch its WELCOME announced.
    ///   - resume: The resume point its HELLO carried.
    /// - Returns: Every message to send, by id.
    func attach(_ sink: any ReliableSink, deliveryEpoch: UInt64, resume: Frame.Hello.Resume?) -> [OutboxRecord] {
        let (records, acknowledge) = self.state.withLockedValue { state in
            state.sink = sink
            // DELIVERYs can arrive, and the app process them, before the connection is attached:
            // their checkpoint may be saved already, with no connection to acknowledge it on.
            // Acknowledge it now, or the gateway, its window full, would wait for this forever.
            let acknowledge = state.inbox.attached(epoch: deliveryEpoch, resume: resume)
            return (state.records.values.sorted { $0.id < $1.id }, acknowledge)
        }
        if let acknowledge { sink.acknowledgeDeliveries(upTo: acknowledge) }
        self.wakeup.continuation.yield()  // a checkpoint of a new epoch may be due
        return records
    }

    /// The connection closed.
    func detach(_ sink: any ReliableSink) {
        self.state.withLockedValue { state in
            guard state.sink === sink else { return }
            state.sink = nil
            state.inbox.detached()
        }
    }

    /// What HELLO says about this client: its outbox epoch, and where its deliveries stand.
    func helloFields() async throws(TetherError) -> (outboxEpoch: UInt64, resume: Frame.Hello.Resume?) {
        try await self.loadIfNeeded()
        return self.state.withLockedValue { state in
            (state.epoch, state.inbox.resumePoint)
        }
    }

    /// Messages were sent for the first time on a connection.
    func sent(_ ids: [UInt64]) {
        let firsts = self.state.withLockedValue { state in
            ids.compactMap { id -> OutboxRecord? in
                guard let record = state.records[id], state.reportedSent.insert(id).inserted else { return nil }
                return record
            }
        }
        for record in firsts {
            self.events.yield(MessageEvent(id: record.id, conversation: record.conversation, sequence: record.sequence, state: .sent))
        }
    }

    /// The gateway acknowledged messages.
    func acknowledged(_ entries: [Frame.MessageAck.Entry]) {
        var finished: [(OutboxRecord, MessageOutcome, [CheckedContinuation<MessageOutcome?, Never>])] = []
        let timers = self.state.withLockedValue { state -> [Scheduled<Void>] in
            var timers: [Scheduled<Void>] = []
            for entry in entries {
                guard let record = state.records.removeValue(forKey: entry.id) else { continue }
                state.reportedSent.remove(entry.id)
                state.toRemove.append(entry.id)
                if let timer = state.expiryTimers.removeValue(forKey: entry.id) { timers.append(timer) }
                guard !record.expired else { continue }  // its outcome was reported when it expired
                let outcome: MessageOutcome = entry.status == .ok ? .acknowledged : .refused(entry.status)
                finished.append((record, outcome, Self.finish(entry.id, with: outcome, in: &state)))
            }
            return timers
        }
        for timer in timers { timer.cancel() }
        for (record, outcome, waiters) in finished {
            for waiter in waiters { waiter.resume(returning: outcome) }
            self.events.yield(
                MessageEvent(id: record.id, conversation: record.conversation, sequence: record.sequence, state: .finished(outcome))
            )
        }
        self.wakeCapacityWaiters()
        self.wakeup.continuation.yield()
    }

    // MARK: Expiry

    private func scheduleExpiry(_ record: OutboxRecord) {
        guard let expiresAt = record.expiresAt else { return }
        let remaining = TimeAmount.milliseconds(max(0, expiresAt - WallClock.milliseconds()))
        let id = record.id
        let timer = self.eventLoop.scheduleTask(in: remaining) { self.expire(id) }
        let stale = self.state.withLockedValue { state -> Bool in
            guard state.records[id] != nil else { return true }
            state.expiryTimers[id] = timer
            return false
        }
        if stale { timer.cancel() }
    }

    private func expire(_ id: UInt64) {
        let result = self.state.withLockedValue {
            state -> (OutboxRecord, [CheckedContinuation<MessageOutcome?, Never>], (any ReliableSink)?)? in
            state.expiryTimers[id] = nil
            guard var record = state.records[id], !record.expired else { return nil }
            record.expired = true
            record.body = ByteBuffer()
            state.records[id] = record
            state.toExpire.append(id)
            return (record, Self.finish(id, with: .expired, in: &state), state.sink)
        }
        guard let (tombstone, waiters, sink) = result else { return }
        for waiter in waiters { waiter.resume(returning: .expired) }
        self.events.yield(
            MessageEvent(id: id, conversation: tombstone.conversation, sequence: tombstone.sequence, state: .finished(.expired))
        )
        sink?.replace(with: tombstone)
        self.wakeup.continuation.yield()
    }

    // MARK: Deliveries

    /// A DELIVERY arrived on a connection to the gateway store `epoch`.
    func receive(_ delivery: Frame.Delivery, epoch: UInt64) -> DeliveryVerdict {
        let (verdict, handOut) = self.state.withLockedValue {
            state -> (DeliveryVerdict, (CheckedContinuation<Frame.Delivery?, Never>, Frame.Delivery)?) in
            let verdict = state.inbox.received(delivery, epoch: epoch)
            guard verdict == .accepted, let consumer = state.consumer, let next = state.inbox.next() else { return (verdict, nil) }
            state.consumer = nil
            state.consuming = false
            return (verdict, (consumer, next))
        }
        if let (consumer, next) = handOut { consumer.resume(returning: next) }
        return verdict
    }

    /// The next delivery for the app; the one handed out before is processed from now on.
    /// - Returns: `nil` once the client has stopped.
    func nextDelivery() async throws(TetherError) -> Frame.Delivery? {
        let immediate: Result<Frame.Delivery?, TetherError>? = self.state.withLockedValue { state in
            guard !state.consuming else {
                return .failure(TetherError(code: .invalidArgument, message: "another task is already consuming the deliveries"))
            }
            if let next = state.inbox.next() { return .success(next) }
            if state.finished { return .success(nil) }
            state.consuming = true
            return nil
        }
        self.wakeup.continuation.yield()  // the previous one may be processed: checkpoint it
        if let immediate { return try immediate.get() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Frame.Delivery?, Never>) in
                let ready: Frame.Delivery?? = self.state.withLockedValue { state in
                    if let next = state.inbox.next() {
                        state.consuming = false
                        return .some(next)
                    }
                    if state.finished || Task.isCancelled {
                        state.consuming = false
                        return .some(nil)
                    }
                    state.consumer = continuation
                    return .none
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            let consumer = self.state.withLockedValue { state -> CheckedContinuation<Frame.Delivery?, Never>? in
                defer { state.consumer = nil; state.consuming = false }
                return state.consumer
            }
            consumer?.resume(returning: nil)
        }
    }

    /// The app processed the delivery with this sequence (it was handed out and not yet processed).
    func acknowledgeDelivery(_ sequence: UInt64) throws(TetherError) {
        let known = self.state.withLockedValue { $0.inbox.acknowledge(sequence) }
        guard known else {
            throw TetherError(code: .invalidArgument, message: "delivery \(sequence) is not the one the app holds")
        }
        self.wakeup.continuation.yield()
    }

    /// The consumer stopped (its loop ended or threw): the delivery it held and did not
    /// acknowledge is handed out again.
    func consumerEnded() {
        self.state.withLockedValue { state in
            state.inbox.consumerStopped()
            state.consuming = false
        }
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
        let work = self.state.withLockedValue { state in
            defer {
                state.toRemove.removeAll()
                state.toExpire.removeAll()
            }
            return (state.toRemove, state.toExpire, state.inbox.takeCheckpointToSave())
        }
        do {
            if !work.1.isEmpty { try await self.configuration.outbox.markExpired(work.1) }
            if !work.0.isEmpty { try await self.configuration.outbox.remove(work.0) }
        } catch {
            // Not fatal: a message not removed is sent again and deduplicated.
            self.logger.error("outbox maintenance failed", metadata: ["error": "\(error)"])
        }
        guard let checkpoint = work.2 else { return }
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

    /// The client stopped: consumers end, senders waiting for room fail, maintenance flushes and ends.
    func finish() {
        let (consumer, waiters, timers) = self.state.withLockedValue { state in
            state.finished = true
            defer {
                state.consumer = nil
                state.capacityWaiters.removeAll()
                state.expiryTimers.removeAll()
            }
            return (state.consumer, Array(state.capacityWaiters.values), Array(state.expiryTimers.values))
        }
        consumer?.resume(returning: nil)
        for waiter in waiters { waiter.resume() }
        for timer in timers { timer.cancel() }
        self.wakeup.continuation.finish()
    }
}

/// The result of one ``ReliableEngine/send(topic:body:conversation:priority:ttl:)``, filled in by
/// whichever caller commits its group.
final class SendTicket: Sendable {
    private let state = NIOLockedValueBox<
        (result: Result<MessageReceipt, TetherError>?, waiter: CheckedContinuation<MessageReceipt, any Error>?)
    >(
        (nil, nil)
    )

    func resolve(_ result: Result<MessageReceipt, TetherError>) {
        let waiter = self.state.withLockedValue { state -> CheckedContinuation<MessageReceipt, any Error>? in
            state.result = result
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(with: result.mapError { $0 as any Error })
    }

    var value: MessageReceipt {
        get async throws(TetherError) {
            do {
                return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<MessageReceipt, any Error>) in
                    let result = self.state.withLockedValue { state -> Result<MessageReceipt, TetherError>? in
                        if let result = state.result { return result }
                        state.waiter = continuation
                        return nil
                    }
                    if let result { continuation.resume(with: result.mapError { $0 as any Error }) }
                }
            } catch {
                throw error as? TetherError ?? TetherError(code: .storage, message: "\(error)")
            }
        }
    }
}

/// The wall clock, for expiry times that survive a restart.
enum WallClock {
    static func milliseconds() -> Int64 {
        Int64((Date().timeIntervalSince1970 * 1000).rounded())
    }
}
