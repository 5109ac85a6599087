import NIOCore

/// The gateway's processing of one outbox's reliable messages (PROTOCOL.md, section 9.1), with
/// no I/O: which messages are new, duplicates, conflicting duplicates or past a gap; which
/// handlers run, in what order; what a batch writes to the store; what each message is
/// answered, and when.
///
/// A **lane** is one outbox (a client id and an outbox epoch). Its batches run one at a time,
/// whichever connection of the outbox read them (its driver holds the lane meanwhile), so a
/// message is never decided "next" while another batch may still commit a higher sequence.
/// The machine keeps what it knows of the store (each conversation's last processed sequence,
/// the outcomes of recent messages) so that a batch reads the store only for what it has not
/// seen, and a retransmission is answered from memory.
///
/// A batch is driven step by step; each step says what the driver does next:
///
/// ```swift
/// var step = lane.begin(batch, answers: true, now: clock.now)
/// while true {
///     switch step {
///     case .load(let query):        step = lane.loaded(try await store.dedupState(…query…))
///     case .run(let message):       step = lane.handled(await runHandler(message))
///     case .loadUsage(let who):     step = lane.usageLoaded(try await store.usage(of: who))
///     case .commit(let write):      done = lane.committed(try await store.commit(write)); break loop
///     case .done(let done):         send(done.acks); break loop
///     }
/// }
/// ```
///
/// Only a commit makes a message processed: a handler's deliveries are written with the
/// message's outcome and sequence, atomically, and its acknowledgement waits for that commit.
package struct ReliableLaneMachine: Sendable {
    package struct Configuration: Sendable, Hashable {
        package var outbox: OutboxID
        /// Deliveries a recipient may have waiting in the store; one more is refused.
        package var maxDeliveriesPerRecipient: Int
        /// Delivery bytes a recipient may have waiting in the store.
        package var maxDeliveryBytesPerRecipient: Int
        /// Outcomes of the lane's recent messages kept in memory, to answer retransmissions.
        package var rememberedOutcomes: Int

        package init(
            outbox: OutboxID,
            maxDeliveriesPerRecipient: Int = .max,
            maxDeliveryBytesPerRecipient: Int = .max,
            rememberedOutcomes: Int = 4096
        ) {
            self.outbox = outbox
            self.maxDeliveriesPerRecipient = maxDeliveriesPerRecipient
            self.maxDeliveryBytesPerRecipient = maxDeliveryBytesPerRecipient
            self.rememberedOutcomes = rememberedOutcomes
        }
    }

    /// What a batch may add to the store beyond each recipient's quota: the room left in the
    /// store-wide quota, and in its sender's. Deliveries beyond are refused for good, as over a
    /// recipient's quota.
    package struct Allowance: Sendable, Hashable {
        package var deliveries: Int
        package var bytes: Int
        /// What the refusal says, given which of the two ran out.
        package var refusal: @Sendable (_ deliveries: Bool) -> String

        package init(deliveries: Int, bytes: Int, refusal: @escaping @Sendable (_ deliveries: Bool) -> String) {
            self.deliveries = deliveries
            self.bytes = bytes
            self.refusal = refusal
        }

        package static func == (lhs: Allowance, rhs: Allowance) -> Bool {
            lhs.deliveries == rhs.deliveries && lhs.bytes == rhs.bytes
        }

        package func hash(into hasher: inout Hasher) {
            hasher.combine(self.deliveries)
            hasher.combine(self.bytes)
        }
    }

    /// A MESSAGE as a connection received it.
    package struct Received: Sendable, Hashable {
        package var message: Frame.Message
        package var receivedAt: TetherInstant

        package init(_ message: Frame.Message, receivedAt: TetherInstant) {
            self.message = message
            self.receivedAt = receivedAt
        }
    }

    /// What the store must say before the batch can be decided.
    package struct Query: Sendable, Hashable {
        /// Conversations whose last processed sequence the lane does not know.
        package var conversations: Set<String>
        /// Positions of retransmissions whose recorded outcome the lane does not remember.
        package var outcomes: [ConversationSequence]
    }

    /// How a handler ended.
    package enum HandlerOutcome: Sendable, Hashable {
        /// Processed with this status (`ok`, or a final refusal: the handler's, a permission
        /// refusal, an unknown topic), with the deliveries it made.
        case processed(StatusCode, deliveries: [NewDelivery])
        /// Not now (the handler failed or answered `unavailable`): nothing is recorded, the
        /// conversation's later messages in the batch wait, the client sends them again.
        case transient
    }

    /// Something the driver should log.
    package enum Note: Sendable, Hashable {
        /// A message claimed a sequence another message had: refused for good.
        case conflict(conversation: String, sequence: UInt64, message: UInt64, earlier: UInt64)
        /// A handler's deliveries would pass a recipient's quota: refused for good.
        case quotaExceeded(String)
        /// The store could not be read: the messages that needed it are not taken now.
        case storeUnavailable
    }

    /// How a batch ended.
    package struct Done: Sendable, Hashable {
        /// The MESSAGE_ACK entries to send; empty for none.
        package var acks: [Frame.MessageAck.Entry] = []
        /// The deliveries the batch stored, by recipient, in order: to hand to their pumps.
        package var stored: [String: [StoredDelivery]] = [:]
        package var notes: [Note] = []
        /// What the batch decided, for the gateway's metrics.
        package var tally = Tally()
    }

    /// How many of a batch's messages ended which way.
    package struct Tally: Sendable, Hashable {
        /// Processed and committed: their handlers' deliveries are stored.
        package var processed = 0
        /// Of those, processed without their handler: their time to live ran out first.
        package var expired = 0
        /// Retransmissions of messages processed already, answered with their outcome.
        package var duplicates = 0
        /// Conflicting duplicates: another message claimed their sequence. Refused for good.
        package var conflicts = 0

        package init() {}
    }

    /// What the driver does next.
    package enum Step: Sendable, Hashable {
        /// Read this from the store, then call ``loaded(_:)`` (or ``loadFailed()``).
        case load(Query)
        /// Run this message's handler, then call ``handled(_:)``.
        case run(Frame.Message)
        /// Read these recipients' usage, then call ``usageLoaded(_:)`` (or ``usageFailed()``).
        case loadUsage([String])
        /// Write this, then call ``committed(_:)`` (or ``commitFailed()``).
        case commit(StoreWrite)
        /// The batch is over.
        case done(Done)
    }

    private struct InBatch {
        var id: UInt64
        var status: StatusCode
    }

    private struct Batch {
        var messages: [Received]
        var next = 0
        var answers: Bool
        var now: TetherInstant
        /// The last processed sequence of each conversation, this batch's included.
        var tentative: [String: UInt64] = [:]
        /// Outcomes the store returned for this batch's retransmissions.
        var loadedOutcomes: [ConversationSequence: RecordedOutcome] = [:]
        /// The outcomes asked for could not be read.
        var outcomesUnavailable = false
        var inBatch: [ConversationSequence: InBatch] = [:]
        /// Conversations whose later messages wait (a transient failure, the store unreadable).
        var blocked: Set<String> = []
        var processed: [ProcessedMessage] = []
        /// Answers that wait for the commit.
        var processedAcks: [Frame.MessageAck.Entry] = []
        /// Answers that do not: duplicates, conflicts, messages not taken now.
        var immediateAcks: [Frame.MessageAck.Entry] = []
        var staged: [NewDelivery] = []
        /// Each recipient's usage: the store's, plus what this batch staged.
        var usage: [String: StreamUsage] = [:]
        /// What the batch may still add: to the whole store, and as its sender.
        var allowances: [Allowance] = []
        /// The message whose handler runs, or whose deliveries wait for their quota check.
        var running: Frame.Message?
        var pending: (status: StatusCode, deliveries: [NewDelivery])?
        var notes: [Note] = []
        var duplicates = 0
        var conflicts = 0

        /// What was decided so far without a commit.
        var tally: Tally {
            var tally = Tally()
            tally.duplicates = self.duplicates
            tally.conflicts = self.conflicts
            return tally
        }
    }

    package let configuration: Configuration
    /// Each conversation's last processed sequence, as committed (for the ones known).
    private var lastProcessed: [String: UInt64] = [:]
    /// The outcomes of recent messages, and the order they leave in.
    private var recent: [ConversationSequence: InBatch] = [:]
    private var recentOrder = CircularBuffer<ConversationSequence>()
    private var batch: Batch?

    package init(configuration: Configuration) {
        self.configuration = configuration
    }

    /// Whether a batch is under way.
    package var isBusy: Bool { self.batch != nil }

    // MARK: Steps

    /// Starts a batch: the messages one connection received, in order.
    /// - Parameters:
    ///   - messages: The batch.
    ///   - answers: Whether the connection takes `unavailable` answers (the `message answers`
    ///     feature); without it, a message not taken now gets no answer.
    ///   - now: The clock's time, against which time-to-live is checked.
    /// - Parameter allowances: What the batch may add to the store, beyond each recipient's
    ///   quota (the store-wide quota's room, the sender's); none: only the recipients' quotas.
    package mutating func begin(_ messages: [Received], answers: Bool, now: TetherInstant, allowances: [Allowance] = []) -> Step {
        precondition(self.batch == nil, "a lane runs one batch at a time")
        var batch = Batch(messages: messages, answers: answers, now: now)
        batch.allowances = allowances
        var query = Query(conversations: [], outcomes: [])
        for received in messages {
            let message = received.message
            let position = ConversationSequence(conversation: message.conversation, sequence: message.sequence)
            if let last = self.lastProcessed[message.conversation] {
                batch.tentative[message.conversation] = last
                if message.sequence <= last, self.recent[position] == nil { query.outcomes.append(position) }
            } else {
                query.conversations.insert(message.conversation)
                query.outcomes.append(position)  // only a processed one has an outcome to return
            }
        }
        self.batch = batch
        if query.conversations.isEmpty && query.outcomes.isEmpty { return self.advance() }
        return .load(query)
    }

    /// The store answered the ``Step/load(_:)`` query.
    package mutating func loaded(_ state: DedupState) -> Step {
        self.modifyBatch { batch in
            for (conversation, last) in state.lastProcessed where batch.tentative[conversation] == nil {
                batch.tentative[conversation] = last
            }
            batch.loadedOutcomes.merge(state.outcomes) { $1 }
        }
        // A conversation the store did not mention has processed nothing.
        for received in self.batch!.messages where self.batch!.tentative[received.message.conversation] == nil {
            self.batch!.tentative[received.message.conversation] = 0
        }
        for (conversation, last) in self.batch!.tentative where self.lastProcessed[conversation] == nil {
            self.lastProcessed[conversation] = last
        }
        return self.advance()
    }

    /// The store could not answer the ``Step/load(_:)`` query: the messages that needed it are
    /// not taken now (the client sends them again).
    package mutating func loadFailed() -> Step {
        self.modifyBatch { batch in
            batch.outcomesUnavailable = true
            batch.notes.append(.storeUnavailable)
            for received in batch.messages where batch.tentative[received.message.conversation] == nil {
                batch.blocked.insert(received.message.conversation)
            }
        }
        return self.advance()
    }

    /// The handler of the message ``Step/run(_:)`` named ended.
    package mutating func handled(_ outcome: HandlerOutcome) -> Step {
        guard let message = self.batch?.running else { preconditionFailure("no handler was running") }
        switch outcome {
        case .transient:
            self.modifyBatch { batch in
                batch.running = nil
                batch.blocked.insert(message.conversation)
                Self.notTaken(message, in: &batch)
            }
            return self.advance()
        case .processed(let status, let deliveries):
            self.batch!.pending = (status, deliveries)
            // Most handlers deliver to recipients the batch knows already: no set to build.
            let known = self.batch!.usage
            if deliveries.contains(where: { known[$0.recipient] == nil }) {
                let unknown = Set(deliveries.map(\.recipient).filter { known[$0] == nil })
                return .loadUsage(unknown.sorted())
            }
            return self.checkQuotaAndRecord()
        }
    }

    /// The store answered the ``Step/loadUsage(_:)`` query.
    package mutating func usageLoaded(_ usage: [String: StreamUsage]) -> Step {
        self.modifyBatch { batch in
            for recipient in Set(batch.pending?.deliveries.map(\.recipient) ?? []) where batch.usage[recipient] == nil {
                batch.usage[recipient] = usage[recipient] ?? StreamUsage(deliveries: 0, bytes: 0)
            }
        }
        return self.checkQuotaAndRecord()
    }

    /// The store could not say the recipients' usage: the message is not taken now.
    package mutating func usageFailed() -> Step {
        guard let message = self.batch?.running else { preconditionFailure("no handler was running") }
        self.modifyBatch { batch in
            batch.running = nil
            batch.pending = nil
            batch.blocked.insert(message.conversation)
            batch.notes.append(.storeUnavailable)
            Self.notTaken(message, in: &batch)
        }
        return self.advance()
    }

    /// The ``Step/commit(_:)`` write is stored, its deliveries with these receipts (in order).
    package mutating func committed(_ receipts: [DeliveryReceipt]) -> Done {
        guard let batch = self.batch else { preconditionFailure("no batch was committing") }
        self.batch = nil
        for (conversation, last) in batch.tentative { self.lastProcessed[conversation] = last }
        for processed in batch.processed {  // in processing order: the oldest leave first
            let position = ConversationSequence(conversation: processed.conversation, sequence: processed.sequence)
            self.remember(InBatch(id: processed.messageID ?? 0, status: processed.status), at: position)
        }
        var done = Done(acks: batch.immediateAcks + batch.processedAcks, notes: batch.notes, tally: batch.tally)
        done.tally.processed = batch.processed.count
        done.tally.expired = batch.processed.count { $0.status == .deadlineExceeded }
        for (delivery, receipt) in zip(batch.staged, receipts) {
            done.stored[receipt.recipient, default: []].append(
                StoredDelivery(sequence: receipt.sequence, topic: delivery.topic, body: delivery.body, compressed: delivery.compressed)
            )
        }
        return done
    }

    /// The ``Step/commit(_:)`` write failed (the store, or a conflict): nothing of the batch
    /// was written; the client sends its messages again.
    package mutating func commitFailed() -> Done {
        guard let batch = self.batch else { preconditionFailure("no batch was committing") }
        self.batch = nil
        // What the lane believed of the store may be wrong now (a conflict means someone else
        // processed these conversations): it is read again.
        self.lastProcessed.removeAll()
        var acks = batch.immediateAcks
        if batch.answers { acks += batch.processedAcks.map { .init(id: $0.id, status: .unavailable) } }
        return Done(acks: acks, notes: batch.notes + [.storeUnavailable], tally: batch.tally)
    }

    // MARK: Deciding

    /// Decides the batch's messages in order, up to the next one whose handler must run.
    private mutating func advance() -> Step {
        while self.batch!.next < self.batch!.messages.count {
            let received = self.batch!.messages[self.batch!.next]
            self.batch!.next += 1
            let message = received.message
            let position = ConversationSequence(conversation: message.conversation, sequence: message.sequence)
            let remembered = self.recent[position]
            switch Self.decide(received, at: position, remembered: remembered, in: &self.batch!) {
            case .answered:
                continue
            case .run:
                self.batch!.running = message
                return .run(message)
            case .process(let status):
                self.record(message, status: status, deliveries: [])
            }
        }
        return self.finish()
    }

    private enum Decision {
        /// Answered now, or not taken.
        case answered
        /// Its handler runs.
        case run
        /// Processed with this status without its handler.
        case process(StatusCode)
    }

    /// What happens to one message of the batch.
    private static func decide(
        _ received: Received,
        at position: ConversationSequence,
        remembered: InBatch?,
        in batch: inout Batch
    ) -> Decision {
        let message = received.message
        guard !batch.blocked.contains(message.conversation), let last = batch.tentative[message.conversation] else {
            Self.notTaken(message, in: &batch)
            return .answered
        }
        if message.sequence <= last {
            // Processed already. The same message again (a retransmission) gets the outcome it
            // had, without running the handler again; another message claiming its sequence (a
            // conflicting duplicate) is refused for good.
            if let earlier = batch.inBatch[position] {
                // Processed in this batch, not committed yet: its answer waits for the commit.
                if earlier.id == message.id {
                    batch.duplicates += 1
                    batch.processedAcks.append(.init(id: message.id, status: earlier.status))
                } else {
                    Self.conflict(message, earlier: earlier.id, in: &batch)
                }
                return .answered
            }
            let recorded: RecordedOutcome?
            if let remembered {
                recorded = RecordedOutcome(status: remembered.status, messageID: remembered.id)
            } else if let loaded = batch.loadedOutcomes[position] {
                recorded = loaded
            } else if batch.outcomesUnavailable {
                Self.notTaken(message, in: &batch)
                return .answered
            } else {
                recorded = nil  // older than the store remembers: it was processed, so `ok`
            }
            if let earlier = recorded?.messageID, earlier != message.id {
                Self.conflict(message, earlier: earlier, in: &batch)
            } else {
                batch.duplicates += 1
                batch.immediateAcks.append(.init(id: message.id, status: recorded?.status ?? .ok))
            }
            return .answered
        }
        guard message.sequence == last + 1 else {
            // An earlier message is missing; the client's retransmission fills the gap.
            Self.notTaken(message, in: &batch)
            return .answered
        }
        // The client gave up on it, or its time to live ran out before processing began:
        // recorded so that the conversation moves on.
        if message.expired { return .process(.deadlineExceeded) }
        if let ttl = message.ttl, received.receivedAt + ttl <= batch.now { return .process(.deadlineExceeded) }
        return .run
    }

    /// Checks the pending deliveries against their recipients' quotas, then records the message.
    private mutating func checkQuotaAndRecord() -> Step {
        guard let message = self.batch?.running, let pending = self.batch?.pending else {
            preconditionFailure("no handler outcome is pending")
        }
        var status = pending.status
        var deliveries = pending.deliveries
        // The usage the deliveries add, checked before any is counted (the batch's usage is
        // changed in place only if they all fit: no copy of it per message).
        var added: [(recipient: String, usage: StreamUsage)] = []
        for delivery in deliveries {
            let index = added.firstIndex { $0.recipient == delivery.recipient }
            var current = index.map { added[$0].usage } ?? self.batch!.usage[delivery.recipient]!
            current.deliveries += 1
            current.bytes += delivery.body.readableBytes
            let refusal: String
            if current.deliveries > self.configuration.maxDeliveriesPerRecipient {
                refusal = "'\(delivery.recipient)' has \(self.configuration.maxDeliveriesPerRecipient) deliveries waiting"
            } else if current.bytes > self.configuration.maxDeliveryBytesPerRecipient {
                refusal = "'\(delivery.recipient)' has over \(self.configuration.maxDeliveryBytesPerRecipient) bytes of deliveries waiting"
            } else {
                if let index { added[index].usage = current } else { added.append((delivery.recipient, current)) }
                continue
            }
            // Over the quota: the handler's deliveries are not stored; the sender learns it for good.
            self.batch!.notes.append(.quotaExceeded(refusal))
            status = .resourceExhausted
            deliveries = []
            added = []
            break
        }
        if !deliveries.isEmpty, let refusal = self.takeAllowances(for: deliveries) {
            // Over the store's quota or the sender's: refused for good, like a recipient's.
            self.batch!.notes.append(.quotaExceeded(refusal))
            status = .resourceExhausted
            deliveries = []
            added = []
        }
        for (recipient, usage) in added { self.batch!.usage[recipient] = usage }
        self.batch!.running = nil
        self.batch!.pending = nil
        self.record(message, status: status, deliveries: deliveries)
        return self.advance()
    }

    /// Takes what `deliveries` need from every allowance of the batch, if they all have it.
    /// - Returns: `nil` if they did (and took it), else why not.
    private mutating func takeAllowances(for deliveries: [NewDelivery]) -> String? {
        let count = deliveries.count
        let bytes = deliveries.reduce(0) { $0 + $1.body.readableBytes }
        for allowance in self.batch!.allowances {
            if count > allowance.deliveries { return allowance.refusal(true) }
            if bytes > allowance.bytes { return allowance.refusal(false) }
        }
        for index in self.batch!.allowances.indices {
            self.batch!.allowances[index].deliveries -= count
            self.batch!.allowances[index].bytes -= bytes
        }
        return nil
    }

    private mutating func record(_ message: Frame.Message, status: StatusCode, deliveries: [NewDelivery]) {
        let position = ConversationSequence(conversation: message.conversation, sequence: message.sequence)
        self.batch!.tentative[message.conversation] = message.sequence
        self.batch!.inBatch[position] = InBatch(id: message.id, status: status)
        self.batch!.processed.append(
            ProcessedMessage(
                outbox: self.configuration.outbox,
                conversation: message.conversation,
                sequence: message.sequence,
                status: status,
                messageID: message.id
            )
        )
        self.batch!.processedAcks.append(.init(id: message.id, status: status))
        self.batch!.staged += deliveries
    }

    private mutating func finish() -> Step {
        guard self.batch!.processed.isEmpty else {
            return .commit(StoreWrite(processed: self.batch!.processed, deliveries: self.batch!.staged))
        }
        let batch = self.batch!
        self.batch = nil
        return .done(Done(acks: batch.immediateAcks + batch.processedAcks, notes: batch.notes, tally: batch.tally))
    }

    private static func notTaken(_ message: Frame.Message, in batch: inout Batch) {
        if batch.answers { batch.immediateAcks.append(.init(id: message.id, status: .unavailable)) }
    }

    private static func conflict(_ message: Frame.Message, earlier: UInt64, in batch: inout Batch) {
        batch.conflicts += 1
        batch.notes.append(.conflict(conversation: message.conversation, sequence: message.sequence, message: message.id, earlier: earlier))
        batch.immediateAcks.append(.init(id: message.id, status: .invalidRequest))
    }

    private mutating func modifyBatch(_ body: (inout Batch) -> Void) {
        body(&self.batch!)
    }

    private mutating func remember(_ outcome: InBatch, at position: ConversationSequence) {
        if self.recent.updateValue(outcome, forKey: position) == nil { self.recentOrder.append(position) }
        while self.recentOrder.count > self.configuration.rememberedOutcomes, let oldest = self.recentOrder.popFirst() {
            self.recent[oldest] = nil
        }
    }
}
