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
/// **Confined to the client's event loop, without a lock.** The state lives on the event loop
/// that the client's connections use: the connection's events (messages sent, MESSAGE_ACKs,
/// DELIVERYs) and the expiry timer reach it there directly. The app's tasks reach it through
/// ``submit(_:)``: a lock-free queue of ``Command``s that the loop drains in batches (one hop
/// for every command queued meanwhile); a command that needs an answer carries the task's
/// continuation (a sender, its ``SendTicket``), which the loop resumes.
///
/// Accepting messages uses group commit: the messages admitted while no commit runs form a
/// group; the task of its first message stores it (the storage I/O runs in the app's tasks,
/// never on the loop), numbered only once that succeeds, so a failed commit leaves no gap in
/// any conversation; the others wait for their group's commit. Removals, expirations and the
/// delivery checkpoint are written in groups too, by ``runMaintenance()``, which runs inside
/// ``TetherClient/run()``. One timer, on the client's event loop, expires messages.
final class ReliableEngine: Sendable {
    /// What a task asks of the engine, run on its event loop.
    enum Command: Sendable {
        case load(UnsafeContinuation<LoadStep, Never>)
        case loaded(Result<OutboxSnapshot, TetherError>)
        case send(OutboxMachine.Send, SendTicket)
        case cancelSend(SendTicket)
        case committed(OutboxMachine.Group, leader: UInt64)
        case commitFailed(OutboxMachine.Group, leader: UInt64, TetherError)
        case outcome(UInt64, UnsafeContinuation<MessageOutcome?, Never>)
        case pending(UnsafeContinuation<[MessageReceipt], Never>)
        case helloFields(UnsafeContinuation<HelloFields, Never>)
        case attach(any ReliableSink, deliveryEpoch: UInt64, resume: Frame.Hello.Resume?)
        case detach(any ReliableSink)
        case nextDelivery(UnsafeContinuation<Result<Frame.Delivery?, TetherError>, Never>)
        case stopWaitingForDelivery
        case acknowledgeDelivery(UInt64)
        case consumerEnded
        case takeStorageWork(UnsafeContinuation<StorageWork, Never>)
        case checkpointSaved(DeliveryCheckpoint)
        case checkpointFailed
        case finish
    }

    /// What the loop tells a task that wants the outbox loaded.
    enum LoadStep: Sendable {
        case done(Result<Void, TetherError>)
        /// Nobody loads it yet: this task does, and reports with ``Command/loaded(_:)``.
        case load
    }

    /// What the loop tells a sender.
    enum SendStep: Sendable {
        case stored(MessageReceipt)
        case failed(TetherError)
        /// This sender stores the group (its message is the one with token `leader`), and
        /// reports with ``Command/committed(_:leader:)`` or ``Command/commitFailed(_:leader:_:)``.
        case lead(OutboxMachine.Group, leader: UInt64)
    }

    /// What HELLO says about this client: its outbox epoch, and where its deliveries stand.
    typealias HelloFields = (outboxEpoch: UInt64, resume: Frame.Hello.Resume?)

    /// Storage work for ``runMaintenance()``.
    struct StorageWork: Sendable {
        var remove: [UInt64] = []
        var expire: [UInt64] = []
        var checkpoint: DeliveryCheckpoint?

        var isEmpty: Bool { self.remove.isEmpty && self.expire.isEmpty && self.checkpoint == nil }
    }

    /// The states of ``runMaintenance()``: the loop hands work to an idle one (idle → busy),
    /// and marks a busy one's work due (busy → due), which it asks for when it is done.
    enum Maintenance {
        static let idle: UInt8 = 0
        static let busy: UInt8 = 1
        static let due: UInt8 = 2
    }

    enum Load {
        case notLoaded
        case loading([UnsafeContinuation<LoadStep, Never>])
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
        /// Who waits for each admitted send's receipt, by the send's token.
        var tickets: [UInt64: SendTicket] = [:]
        var nextToken: UInt64 = 0
        /// Sends waiting for room in the outbox, first come first admitted.
        var waitingForRoom = CircularBuffer<(OutboxMachine.Send, SendTicket)>()
        /// An admitted message found no commit running: one starts after the current batch of
        /// commands, so that the group takes all of them.
        var commitDue = false
        var outcomeWaiters: [UInt64: [UnsafeContinuation<MessageOutcome?, Never>]] = [:]
        /// The application's consumer of deliveries, suspended until one arrives.
        var consumer: UnsafeContinuation<Result<Frame.Delivery?, TetherError>, Never>?
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
    /// The state; on the event loop only.
    let state: NIOLoopBoundBox<State>
    /// The commands of the app's tasks, drained on the event loop.
    private let commands = SubmissionQueue<Command>()
    let events = Broadcaster<MessageEvent>(bufferSize: 100_000)
    /// The storage work the loop hands to ``runMaintenance()`` while it is idle.
    let storageWork = AsyncStream.makeStream(of: StorageWork.self)
    /// Whether ``runMaintenance()`` is idle, busy, or busy with more work due (``Maintenance``).
    let maintenance = ManagedAtomic<UInt8>(Maintenance.idle)
    /// Set on the loop once the outbox is loaded: from then on ``loadIfNeeded()`` does not hop.
    private let loaded = ManagedAtomic(false)
    /// The inbox's delivery handed out and its last processed sequence, published by the loop
    /// for ``acknowledgeDelivery(_:)``, which answers at once.
    let heldDelivery = ManagedAtomic<UInt64>(0)
    let processedDeliveries = ManagedAtomic<UInt64>(0)
    /// The consumer's wait for its next delivery was cancelled (see ``nextDelivery()``).
    let consumerCancelled = ManagedAtomic(false)

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
        self.state = .makeBoxSendingValue(State(), eventLoop: eventLoop)
    }

    // MARK: Commands

    /// Runs `command` on the event loop, after those submitted before it.
    func submit(_ command: Command) {
        if self.commands.push(command) {
            self.eventLoop.execute { self.runCommands() }
        }
    }

    private func runCommands() {
        for command in self.commands.takeAll() {
            switch command {
            case .load(let waiter): self.load(waiter)
            case .loaded(let result): self.loaded(result)
            case .send(let send, let ticket): self.admit(send, ticket)
            case .cancelSend(let ticket): self.cancelSend(ticket)
            case .committed(let group, let leader): self.committed(group, leader: leader)
            case .commitFailed(let group, let leader, let error): self.commitFailed(group, leader: leader, error)
            case .outcome(let id, let waiter): self.lookUpOutcome(of: id, for: waiter)
            case .pending(let waiter):
                waiter.resume(
                    returning:
                        self.state.value.outbox?.unfinished.map {
                            MessageReceipt(id: $0.id, conversation: $0.conversation, sequence: $0.sequence)
                        } ?? []
                )
            case .helloFields(let waiter):
                waiter.resume(returning: self.state.withValue { ($0.outbox?.epoch ?? 0, $0.inbox.resumePoint) })
            case .attach(let sink, let epoch, let resume): self.attached(sink, deliveryEpoch: epoch, resume: resume)
            case .detach(let sink): self.detached(sink)
            case .nextDelivery(let consumer): self.handOutDelivery(to: consumer)
            case .stopWaitingForDelivery: self.stopWaitingForDelivery()
            case .acknowledgeDelivery(let sequence): self.processed(sequence)
            case .consumerEnded: self.consumerStopped()
            case .takeStorageWork(let waiter): self.takeStorageWork(for: waiter)
            case .checkpointSaved(let checkpoint): self.checkpointSaved(checkpoint)
            case .checkpointFailed: self.state.value.inbox.checkpointFailed()
            case .finish: self.finished()
            }
        }
        self.startCommitIfDue()
    }

    // MARK: Loading

    /// Loads the outbox on first use: the first caller loads it, later ones wait for that.
    func loadIfNeeded() async throws(TetherError) {
        if self.loaded.load(ordering: .acquiring) { return }
        let step = await withUnsafeContinuation { self.submit(.load($0)) }
        switch step {
        case .done(let result):
            try result.get()
        case .load:
            let result: Result<OutboxSnapshot, TetherError>
            do {
                result = .success(try await self.configuration.outbox.load())
            } catch {
                result = .failure(TetherError(code: .storage, message: "cannot load the outbox: \(error)", cause: error))
            }
            self.submit(.loaded(result))  // this task's next commands come after it
            try result.map { _ in () }.get()
        }
    }

    private func load(_ waiter: UnsafeContinuation<LoadStep, Never>) {
        let step: LoadStep? = self.state.withValue { state in
            switch state.load {
            case .loaded: return .done(.success(()))
            case .failed(let error): return .done(.failure(error))
            case .loading(var waiters):
                waiters.append(waiter)
                state.load = .loading(waiters)
                return nil
            case .notLoaded:
                state.load = .loading([])
                return .load
            }
        }
        if let step { waiter.resume(returning: step) }
    }

    private func loaded(_ result: Result<OutboxSnapshot, TetherError>) {
        let waiters = self.state.withValue { state -> [UnsafeContinuation<LoadStep, Never>] in
            guard case .loading(let waiters) = state.load else { return [] }
            switch result {
            case .failure(let error):
                state.load = .failed(error)
            case .success(let snapshot):
                state.load = .loaded
                state.outbox = OutboxMachine(
                    snapshot: snapshot,
                    capacity: self.configuration.capacity,
                    rememberedOutcomes: Self.rememberedOutcomes
                )
                state.inbox = InboxMachine(checkpoint: snapshot.checkpoint)
                self.loaded.store(true, ordering: .releasing)
            }
            return waiters
        }
        self.publishInbox()
        self.armExpiryTimer()
        let done = LoadStep.done(result.map { _ in () })
        for waiter in waiters { waiter.resume(returning: done) }
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
        try await self.loadIfNeeded()
        let send = OutboxMachine.Send(
            topic: topic,
            conversation: conversation,
            priority: priority,
            expiresAt: expiresAt,
            body: body,
            token: 0,  // given on the loop
            traceContext: traceContext
        )
        let ticket = SendTicket()
        let step = await withTaskCancellationHandler {
            await withUnsafeContinuation { continuation in
                ticket.continuation = continuation
                self.submit(.send(send, ticket))
            }
        } onCancel: {
            self.submit(.cancelSend(ticket))  // fails it if it still waits for room
        }
        switch step {
        case .stored(let receipt):
            return receipt
        case .failed(let error):
            throw error
        case .lead(let group, let leader):
            return try await self.commit(group, leader: leader)
        }
    }

    /// Stores a group, in the task of its first message, and reports to the loop.
    private func commit(_ group: OutboxMachine.Group, leader: UInt64) async throws(TetherError) -> MessageReceipt {
        do {
            try await self.configuration.outbox.append(group.records, nextID: group.nextID, conversations: group.conversations)
        } catch {
            let failure = TetherError(code: .storage, message: "the outbox could not store the message: \(error)", cause: error)
            self.logger.error("outbox commit failed", metadata: ["error": "\(error)"])
            self.submit(.commitFailed(group, leader: leader, failure))
            throw failure
        }
        self.submit(.committed(group, leader: leader))
        let record = group.records[group.tokens.firstIndex(of: leader)!]
        return MessageReceipt(id: record.id, conversation: record.conversation, sequence: record.sequence)
    }

    /// Admits a send, or queues it for room.
    private func admit(_ send: OutboxMachine.Send, _ ticket: SendTicket) {
        let answer: SendStep? = self.state.withValue { state in
            // Those that wait for room go first.
            if !state.finished && !state.waitingForRoom.isEmpty && !ticket.cancelled {
                state.waitingForRoom.append((send, ticket))
                return nil
            }
            return self.admit(send, ticket, &state)
        }
        if let answer { ticket.resume(answer) }
    }

    /// Admits a send, queues it for room (`nil`), or refuses it.
    private func admit(_ send: OutboxMachine.Send, _ ticket: SendTicket, _ state: inout State) -> SendStep? {
        if state.finished { return .failed(TetherError(code: .shutdown, message: "the client is shut down")) }
        guard state.outbox != nil else { return .failed(TetherError(code: .storage, message: "the outbox is not loaded")) }
        var send = send
        send.token = state.token()
        switch state.outbox!.admit(send) {
        case .full where self.configuration.whenFull == .fail:
            return .failed(
                TetherError(code: .outboxFull, message: "the outbox holds \(self.configuration.capacity) unacknowledged messages")
            )
        case .full where ticket.cancelled:
            return .failed(TetherError(code: .cancelled, message: "the send was cancelled while the outbox was full"))
        case .full:
            state.waitingForRoom.append((send, ticket))
            return nil
        case .accepted(let lead):
            state.tickets[send.token] = ticket
            if lead { state.commitDue = true }
            return nil
        }
    }

    /// Admits the sends waiting for room, as far as there is room.
    func admitWaitingSends() {
        var answers: [(SendTicket, SendStep)] = []
        self.state.withValue { state in
            guard let outbox = state.outbox else { return }
            var room = state.finished ? state.waitingForRoom.count : self.configuration.capacity - outbox.depth
            while room > 0, let (send, ticket) = state.waitingForRoom.popFirst() {
                if let answer = self.admit(send, ticket, &state) { answers.append((ticket, answer)) }
                room -= 1
            }
        }
        for (ticket, answer) in answers { ticket.resume(answer) }
    }

    private func cancelSend(_ ticket: SendTicket) {
        let waited = self.state.withValue { state -> Bool in
            guard let index = state.waitingForRoom.firstIndex(where: { $0.1 === ticket }) else {
                ticket.cancelled = true  // admitted already, or not arrived yet: then it may not wait
                return false
            }
            state.waitingForRoom.remove(at: index)
            return true
        }
        if waited {
            ticket.resume(.failed(TetherError(code: .cancelled, message: "the send was cancelled while the outbox was full")))
        }
    }

    /// Starts a commit if messages were admitted while none ran: the first message's task stores
    /// every message queued.
    func startCommitIfDue() {
        let lead = self.state.withValue { state -> (SendTicket, SendStep)? in
            guard state.commitDue else { return nil }
            state.commitDue = false
            return Self.takeGroup(&state)
        }
        if let (ticket, step) = lead { ticket.resume(step) }
    }

    /// The next group to store and its leader's ticket, if messages are queued.
    private static func takeGroup(_ state: inout State) -> (SendTicket, SendStep)? {
        guard let group = state.outbox?.takeGroup() else { return nil }
        let leader = group.tokens[0]
        return (state.tickets.removeValue(forKey: leader)!, .lead(group, leader: leader))
    }

    private func committed(_ group: OutboxMachine.Group, leader: UInt64) {
        let (sink, tickets, depth, next) = self.state.withValue { state in
            state.outbox!.groupCommitted(group)
            let tickets = group.tokens.map { state.tickets.removeValue(forKey: $0) }  // not the leader's
            return (state.sink, tickets, state.outbox!.depth, Self.takeGroup(&state))
        }
        for (record, ticket) in zip(group.records, tickets) {
            ticket?.resume(.stored(MessageReceipt(id: record.id, conversation: record.conversation, sequence: record.sequence)))
            self.events.yield(MessageEvent(record, .queued))
        }
        if group.records.contains(where: { $0.expiresAt != nil }) { self.armExpiryTimer() }
        sink?.enqueue(group.records)
        self.statistics?.outbox(depth: depth)
        if let (ticket, step) = next { ticket.resume(step) }
    }

    private func commitFailed(_ group: OutboxMachine.Group, leader: UInt64, _ failure: TetherError) {
        let (tickets, next) = self.state.withValue { state in
            state.outbox!.groupFailed(group)
            return (group.tokens.compactMap { state.tickets.removeValue(forKey: $0) }, Self.takeGroup(&state))
        }
        for ticket in tickets { ticket.resume(.failed(failure)) }
        if let (ticket, step) = next { ticket.resume(step) }
        self.admitWaitingSends()  // the group's room is free again
    }

    // MARK: Outcomes

    /// The outcome of a message, waiting for it if it is still pending.
    /// - Returns: `nil` for an id the outbox does not know (any more).
    func outcome(of id: UInt64) async -> MessageOutcome? {
        guard (try? await self.loadIfNeeded()) != nil else { return nil }
        return await withUnsafeContinuation { self.submit(.outcome(id, $0)) }
    }

    private func lookUpOutcome(of id: UInt64, for waiter: UnsafeContinuation<MessageOutcome?, Never>) {
        let known: MessageOutcome?? = self.state.withValue { state in
            switch state.outbox?.outcome(of: id) ?? .unknown {
            case .finished(let outcome): return .some(outcome)
            case .unknown: return .some(nil)
            case .pending:
                state.outcomeWaiters[id, default: []].append(waiter)
                return .none
            }
        }
        if let known { waiter.resume(returning: known) }
    }

    /// The messages accepted but not finished yet, oldest first.
    func pending() async throws(TetherError) -> [MessageReceipt] {
        try await self.loadIfNeeded()
        return await withUnsafeContinuation { self.submit(.pending($0)) }
    }

    /// Tells the waiters and the subscribers that messages finished, and the statistics the
    /// outbox's `depth` after them.
    func report(_ finished: [(OutboxRecord, MessageOutcome, [UnsafeContinuation<MessageOutcome?, Never>])], depth: Int) {
        for (record, outcome, waiters) in finished {
            for waiter in waiters { waiter.resume(returning: outcome) }
            self.events.yield(MessageEvent(record, .finished(outcome)))
            self.statistics?.messageEnded(expired: outcome == .expired)
        }
        if !finished.isEmpty { self.statistics?.outbox(depth: depth) }
    }
}
