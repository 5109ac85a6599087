import Atomics
import Foundation
import Logging
import NIOCore
import TetherCore
import TetherNIO

/// The client's reliable messaging (PROTOCOL.md, section 9): the storage I/O and the waiting
/// callers around two pure machines, ``OutboxMachine`` (messages accepted durably, kept until
/// acknowledged or expired) and ``InboxMachine`` (deliveries handed to the app once, in order,
/// checkpointed). The connection's own window of messages in flight is in its state machine.
///
/// Accepting messages uses group commit: the first caller that finds no commit running commits
/// every message waiting at that moment in one transaction, numbered only once that succeeds,
/// so a failed commit leaves no gap in any conversation; the other callers wait for their
/// group's commit. Removals, expirations and the delivery checkpoint are written in groups too,
/// by ``runMaintenance()``, which runs inside ``TetherClient/run()``. One timer, on the client's
/// event loop, expires messages.
final class ReliableEngine: Sendable {
    enum Load {
        case notLoaded
        case loading([CheckedContinuation<Void, any Error>])
        case loaded
        case failed(TetherError)
    }

    struct State {
        var load = Load.notLoaded
        var finished = false
        /// The outbox, once loaded.
        var outbox: OutboxMachine?
        var inbox = InboxMachine(checkpoint: nil)
        /// The connection messages go to, while there is one.
        var sink: (any ReliableSink)?
        /// Who waits for each queued send's receipt, by the send's token.
        var tickets: [UInt64: SendTicket] = [:]
        var nextToken: UInt64 = 0
        var capacityWaiters: [UInt64: CheckedContinuation<Void, any Error>] = [:]
        var outcomeWaiters: [UInt64: [CheckedContinuation<MessageOutcome?, Never>]] = [:]
        /// The application's consumer of deliveries, suspended until one arrives.
        var consumer: CheckedContinuation<Frame.Delivery?, Never>?
        var consuming = false
        /// The expiry timer, and the wall-clock time it fires at.
        var expiryTimer: (at: Int64, callback: ClockCallback)?

        mutating func token() -> UInt64 {
            defer { self.nextToken += 1 }
            return self.nextToken
        }
    }

    /// How many finished outcomes are remembered for ``outcome(of:)``.
    static let rememberedOutcomes = 10_000

    let configuration: ClientConfiguration.Reliability
    let eventLoop: any EventLoop
    /// The client's clock: expiry times are on its wall clock, and its timer fires them.
    let clock: any TetherClock
    let logger: Logger
    /// The client's statistics: finished messages and the outbox's depth.
    let statistics: ClientStatisticsRecorder?
    let state = TetherLock(State())
    let events = Broadcaster<MessageEvent>(bufferSize: 100_000)
    /// Wakes ``runMaintenance()``: storage work or a checkpoint may be due.
    let wakeup = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))

    init(
        configuration: ClientConfiguration.Reliability,
        eventLoop: any EventLoop,
        clock: any TetherClock,
        statistics: ClientStatisticsRecorder? = nil,
        logger: Logger
    ) {
        self.configuration = configuration
        self.eventLoop = eventLoop
        self.clock = clock
        self.statistics = statistics
        self.logger = logger
    }

    /// Set once the outbox is loaded: from then on ``loadIfNeeded()`` takes no lock.
    private let loaded = ManagedAtomic(false)

    // MARK: Loading

    /// Loads the outbox on first use: the first caller loads it, later ones wait for that.
    func loadIfNeeded() async throws(TetherError) {
        if self.loaded.load(ordering: .acquiring) { return }
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
        let waiters = self.state.withLockedValue { state -> [CheckedContinuation<Void, any Error>] in
            guard case .loading(let waiters) = state.load else { return [] }
            switch result {
            case .failure(let error):
                state.load = .failed(error)
            case .success(let snapshot):
                state.load = .loaded
                self.loaded.store(true, ordering: .releasing)
                state.outbox = OutboxMachine(
                    snapshot: snapshot,
                    capacity: self.configuration.capacity,
                    rememberedOutcomes: Self.rememberedOutcomes
                )
                state.inbox = InboxMachine(checkpoint: snapshot.checkpoint)
            }
            return waiters
        }
        self.armExpiryTimer()
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
        ttl: Duration?,
        traceContext: TraceContext? = nil
    ) async throws(TetherError) -> MessageReceipt {
        guard !topic.isEmpty, topic.utf8.count <= Int(UInt16.max), conversation.utf8.count <= Int(UInt16.max) else {
            throw TetherError(code: .invalidArgument, message: "the topic must be 1 to 65535 bytes and the conversation at most 65535")
        }
        if let ttl, ttl <= .zero {
            throw TetherError(code: .invalidArgument, message: "the time to live must be positive")
        }
        let expiresAt = ttl.map { self.clock.wallClockMilliseconds + max(1, $0.wholeMilliseconds) }
        let ticket = SendTicket()

        while true {
            enum Admission { case lead(OutboxMachine.Group?), follow, full, shutDown, notLoaded }
            // One lock admits the message, and finds out whether the outbox still has to load.
            let admission: Admission = self.state.withLockedValue { state in
                guard !state.finished else { return .shutDown }
                guard case .loaded = state.load else { return .notLoaded }
                let token = state.token()
                let send = OutboxMachine.Send(
                    topic: topic,
                    conversation: conversation,
                    priority: priority,
                    expiresAt: expiresAt,
                    body: body,
                    token: token,
                    traceContext: traceContext
                )
                switch state.outbox!.admit(send) {
                case .full:
                    return .full
                case .accepted(let lead):
                    state.tickets[token] = ticket
                    // The leader takes the first group in the same lock.
                    return lead ? .lead(state.outbox!.takeGroup()) : .follow
                }
            }
            switch admission {
            case .notLoaded:
                try await self.loadIfNeeded()
                continue
            case .shutDown:
                throw TetherError(code: .shutdown, message: "the client is shut down")
            case .full where self.configuration.whenFull == .fail:
                throw TetherError(code: .outboxFull, message: "the outbox holds \(self.configuration.capacity) unacknowledged messages")
            case .full:
                try await self.waitForCapacity()
                continue
            case .lead(let group):
                await self.commitQueued(startingWith: group)
            case .follow:
                break
            }
            return try await ticket.value
        }
    }

    /// Commits every queued message in groups until none is queued. The lock that settles a
    /// group also takes the next one.
    private func commitQueued(startingWith first: OutboxMachine.Group?) async {
        var next = first
        while let group = next {
            do {
                try await self.configuration.outbox.append(group.records, nextID: group.nextID, conversations: group.conversations)
            } catch {
                let failure = TetherError(code: .storage, message: "the outbox could not store the message: \(error)", cause: error)
                self.logger.error("outbox commit failed", metadata: ["error": "\(error)"])
                let tickets: [SendTicket]
                (tickets, next) = self.state.withLockedValue { state in
                    state.outbox!.groupFailed(group)
                    return (group.tokens.compactMap { state.tickets.removeValue(forKey: $0) }, state.outbox!.takeGroup())
                }
                for ticket in tickets { ticket.resolve(.failure(failure)) }
                self.wakeCapacityWaiters()
                continue
            }
            let (tickets, depth): ([SendTicket?], Int)
            (tickets, depth, next) = self.state.withLockedValue { state in
                state.outbox!.groupCommitted(group)
                // Each message's `.queued` event goes out before the connection can send it and
                // report `.sent` (publishing takes no lock). Then the group is handed to the
                // connection under the lock, before another sender can commit the next group: a
                // group that reached the connection after the next one would have a
                // conversation's message sent before the one it follows, and the gateway would
                // wait for that one's retransmission timeout (`committedOrder` in the tests).
                for record in group.records { self.events.yield(MessageEvent(record, .queued)) }
                state.sink?.enqueue(group.records)
                let tickets = group.tokens.map { state.tickets.removeValue(forKey: $0) }
                return (tickets, state.outbox!.depth, state.outbox!.takeGroup())
            }
            for (record, ticket) in zip(group.records, tickets) {
                ticket?.resolve(.success(MessageReceipt(id: record.id, conversation: record.conversation, sequence: record.sequence)))
            }
            if group.records.contains(where: { $0.expiresAt != nil }) { self.armExpiryTimer() }
            self.statistics?.outbox(depth: depth)
        }
    }

    private func waitForCapacity() async throws(TetherError) {
        let id = self.state.withLockedValue { $0.token() }
        do {
            try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                    let ready = self.state.withLockedValue { state -> Bool in
                        if state.outbox!.hasRoom || state.finished || Task.isCancelled { return true }
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
        guard (try? await self.loadIfNeeded()) != nil else { return nil }
        return await withCheckedContinuation { (continuation: CheckedContinuation<MessageOutcome?, Never>) in
            let known: MessageOutcome?? = self.state.withLockedValue { state in
                switch state.outbox!.outcome(of: id) {
                case .finished(let outcome): return .some(outcome)
                case .unknown: return .some(nil)
                case .pending:
                    state.outcomeWaiters[id, default: []].append(continuation)
                    return .none
                }
            }
            if let known { continuation.resume(returning: known) }
        }
    }

    /// The messages accepted but not finished yet, oldest first.
    func pending() async throws(TetherError) -> [MessageReceipt] {
        try await self.loadIfNeeded()
        return self.state.withLockedValue { state in
            state.outbox!.unfinished.map { MessageReceipt(id: $0.id, conversation: $0.conversation, sequence: $0.sequence) }
        }
    }

    /// Tells the waiters and the subscribers that messages finished, and the statistics the
    /// outbox's `depth` after them.
    func report(_ finished: [(OutboxRecord, MessageOutcome, [CheckedContinuation<MessageOutcome?, Never>])], depth: Int) {
        for (record, outcome, waiters) in finished {
            for waiter in waiters { waiter.resume(returning: outcome) }
            self.events.yield(MessageEvent(record, .finished(outcome)))
            self.statistics?.messageEnded(expired: outcome == .expired)
        }
        if !finished.isEmpty { self.statistics?.outbox(depth: depth) }
    }

    // MARK: Connection events

    /// A connection with reliable delivery was established: every unacknowledged message is
    /// handed to it to send, under the lock, so that a group committed meanwhile reaches it after
    /// them.
    /// - Parameters:
    ///   - sink: The connection.
    ///   - deliveryEpoch: The delivery epoch its WELCOME announced.
    ///   - resume: The resume point its HELLO carried.
    func attach(_ sink: any ReliableSink, deliveryEpoch: UInt64, resume: Frame.Hello.Resume?) {
        let acknowledge = self.state.withLockedValue { state in
            state.sink = sink
            sink.enqueue(state.outbox?.unacknowledged ?? [])
            // DELIVERYs can arrive, and the app process them, before the connection is attached:
            // their checkpoint may be saved already, with no connection to acknowledge it on.
            // Acknowledge it now, or the gateway, its window full, would wait for this forever.
            return state.inbox.attached(epoch: deliveryEpoch, resume: resume)
        }
        if let acknowledge { sink.acknowledgeDeliveries(upTo: acknowledge) }
        self.wakeup.continuation.yield()  // a checkpoint of a new epoch may be due
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
        return self.state.withLockedValue { state in (state.outbox!.epoch, state.inbox.resumePoint) }
    }

    /// Messages were sent for the first time on a connection.
    func sent(_ ids: [UInt64]) {
        let firsts = self.state.withLockedValue { $0.outbox?.sent(ids) ?? [] }
        for record in firsts { self.events.yield(MessageEvent(record, .sent)) }
    }

    /// The gateway acknowledged messages.
    func acknowledged(_ entries: [Frame.MessageAck.Entry]) {
        // One lock: the outcomes, who waits for them, and who waits for room.
        let (finished, depth, roomWaiters) = self.state.withLockedValue { state in
            let finished = (state.outbox?.acknowledged(entries) ?? []).map { record, outcome in
                (record, outcome, state.outcomeWaiters.removeValue(forKey: record.id) ?? [])
            }
            defer { state.capacityWaiters.removeAll() }
            return (finished, state.outbox?.depth ?? 0, Array(state.capacityWaiters.values))
        }
        self.report(finished, depth: depth)
        for waiter in roomWaiters { waiter.resume() }
        self.wakeup.continuation.yield()
    }

    /// The client stopped: consumers end, senders waiting for room fail, maintenance flushes and ends.
    func finish() {
        let (consumer, waiters, timer) = self.state.withLockedValue { state in
            state.finished = true
            defer {
                state.consumer = nil
                state.capacityWaiters.removeAll()
                state.expiryTimer = nil
            }
            return (state.consumer, Array(state.capacityWaiters.values), state.expiryTimer?.callback)
        }
        consumer?.resume(returning: nil)
        for waiter in waiters { waiter.resume() }
        timer?.cancel()
        self.wakeup.continuation.finish()
        self.events.finish()  // messageEvents end with the client
    }
}
