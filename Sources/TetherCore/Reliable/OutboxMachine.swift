package import NIOCore

/// The client's outbox (PROTOCOL.md, section 9.1), with no I/O: which messages are accepted and
/// not finished, how the next ones are numbered, which wait to be committed to storage, when
/// each expires, how each ended, and what storage must remove or mark expired.
///
/// Accepting is a **group commit**: ``admit(_:)`` queues a message (if the outbox has room);
/// the caller that finds no commit running leads one: it takes every queued message as one group
/// (``takeGroup()``), numbered tentatively, writes it, and reports ``groupCommitted(_:)`` (the
/// numbering is applied) or ``groupFailed(_:)`` (nothing is: no conversation gets a gap). The
/// per-connection window and retransmissions are ``OutboxWindow``'s, inside the connection.
///
/// Expiry times are wall-clock milliseconds (they survive a restart); the driver arms one timer
/// for ``nextExpiry`` and calls ``expire(now:)``.
///
/// ```swift
/// var outbox = OutboxMachine(snapshot: try await store.load(), capacity: 10_000)
/// guard case .accepted(lead: true) = outbox.admit(send) else { ... }
/// while let group = outbox.takeGroup() {
///     try await store.append(group.records, nextID: group.nextID, conversations: group.conversations)
///     _ = outbox.groupCommitted(group)
/// }
/// ```
package struct OutboxMachine: Sendable {
    /// A message the application hands over, not yet numbered.
    package struct Send: Sendable, Hashable {
        package var topic: String
        package var conversation: String
        package var priority: MessagePriority
        /// Wall-clock milliseconds, or `nil` if it does not expire.
        package var expiresAt: Int64?
        package var body: ByteBuffer
        /// The driver's token for whoever waits for this send's receipt.
        package var token: UInt64
        /// The sender's trace, sent with the message while this process runs.
        package var traceContext: TraceContext?

        package init(
            topic: String,
            conversation: String,
            priority: MessagePriority,
            expiresAt: Int64?,
            body: ByteBuffer,
            token: UInt64,
            traceContext: TraceContext? = nil
        ) {
            self.topic = topic
            self.conversation = conversation
            self.priority = priority
            self.expiresAt = expiresAt
            self.body = body
            self.token = token
            self.traceContext = traceContext
        }
    }

    /// Messages taken for one commit, numbered tentatively.
    package struct Group: Sendable, Hashable {
        /// The records, in the order their sends were admitted.
        package var records: [OutboxRecord]
        /// Each record's send token, in the same order.
        package var tokens: [UInt64]
        /// The id the next message gets once this group is committed.
        package var nextID: UInt64
        /// The last sequence of each conversation in the group.
        package var conversations: [String: UInt64]
    }

    /// What ``admit(_:)`` decided.
    package enum Admission: Sendable, Hashable {
        /// Queued; with `lead`, the caller commits (no commit was running).
        case accepted(lead: Bool)
        /// The outbox holds `capacity` messages already: the send waits for room, or fails.
        case full
    }

    /// How a message stands, for ``outcome(of:)``.
    package enum Lookup: Sendable, Hashable {
        case finished(MessageOutcome)
        /// Accepted and not finished: wait for it.
        case pending
        /// Not known (any more).
        case unknown
    }

    /// The outbox's identity (PROTOCOL.md, section 9.1).
    package let epoch: UInt64
    package let capacity: Int
    /// How many finished outcomes are remembered.
    package let rememberedOutcomes: Int
    private var nextID: UInt64
    private var conversations: [String: UInt64]
    /// Accepted durably and not acknowledged (expired ones as tombstones), by id.
    package private(set) var records: [UInt64: OutboxRecord] = [:]
    private var queued: [Send] = []
    private var committing = false
    /// Messages of the group being committed: they count against the capacity meanwhile.
    private var inCommit = 0
    private var outcomes: [UInt64: MessageOutcome] = [:]
    private var outcomeOrder = CircularBuffer<UInt64>()
    private var reportedSent: Set<UInt64> = []
    private var expiries = DeadlineQueue<UInt64, Int64>()
    private var toRemove: [UInt64] = []
    private var toExpire: [UInt64] = []

    /// An outbox holding what storage returned.
    package init(snapshot: OutboxSnapshot, capacity: Int, rememberedOutcomes: Int = 10_000) {
        self.epoch = snapshot.epoch
        self.capacity = capacity
        self.rememberedOutcomes = rememberedOutcomes
        self.nextID = snapshot.nextID
        self.conversations = snapshot.conversations
        for record in snapshot.records {
            self.records[record.id] = record
            if !record.expired, let expiresAt = record.expiresAt { self.expiries.insert(record.id, deadline: expiresAt) }
        }
    }

    /// Whether a message could be admitted now.
    package var hasRoom: Bool { self.depth < self.capacity }

    /// The messages the outbox holds: accepted and not finished (tombstones included), queued,
    /// and being committed.
    package var depth: Int { self.records.count + self.queued.count + self.inCommit }

    // MARK: Accepting

    /// The application hands a message over.
    package mutating func admit(_ send: Send) -> Admission {
        guard self.hasRoom else { return .full }
        self.queued.append(send)
        defer { self.committing = true }
        return .accepted(lead: !self.committing)
    }

    /// The messages queued since the last group, numbered tentatively; `nil` when none is left
    /// (the commit ends, and the next ``admit(_:)`` leads one).
    package mutating func takeGroup() -> Group? {
        guard !self.queued.isEmpty else {
            self.committing = false
            return nil
        }
        let sends = self.queued
        self.queued.removeAll()
        self.inCommit = sends.count
        var nextID = self.nextID
        var conversations: [String: UInt64] = [:]
        var records: [OutboxRecord] = []
        records.reserveCapacity(sends.count)
        for send in sends {
            let sequence = (conversations[send.conversation] ?? self.conversations[send.conversation] ?? 0) + 1
            conversations[send.conversation] = sequence
            records.append(
                OutboxRecord(
                    id: nextID,
                    topic: send.topic,
                    conversation: send.conversation,
                    sequence: sequence,
                    priority: send.priority,
                    expiresAt: send.expiresAt,
                    body: send.body,
                    traceContext: send.traceContext
                )
            )
            nextID += 1
        }
        return Group(records: records, tokens: sends.map(\.token), nextID: nextID, conversations: conversations)
    }

    /// The group is stored: its numbering holds, and its messages are the outbox's.
    package mutating func groupCommitted(_ group: Group) {
        self.inCommit = 0
        self.nextID = max(self.nextID, group.nextID)
        self.conversations.merge(group.conversations) { max($0, $1) }
        for record in group.records {
            self.records[record.id] = record
            if let expiresAt = record.expiresAt { self.expiries.insert(record.id, deadline: expiresAt) }
        }
    }

    /// The group could not be stored: nothing of it is kept (its senders get the error), and
    /// the numbers it took are given out again.
    package mutating func groupFailed(_ group: Group) {
        self.inCommit = 0
    }

    // MARK: Connections

    /// Every unacknowledged message, oldest first: what a new connection sends.
    package var unacknowledged: [OutboxRecord] {
        self.records.values.sorted { $0.id < $1.id }
    }

    /// The accepted messages without an outcome, oldest first.
    package var unfinished: [OutboxRecord] {
        self.records.values.filter { !$0.expired }.sorted { $0.id < $1.id }
    }

    /// Messages were sent on a connection.
    /// - Returns: Those sent for the first time (reported once per message).
    package mutating func sent(_ ids: [UInt64]) -> [OutboxRecord] {
        ids.compactMap { id in
            guard let record = self.records[id], self.reportedSent.insert(id).inserted else { return nil }
            return record
        }
    }

    /// The gateway acknowledged messages.
    /// - Returns: The messages that finished now, with their outcomes (not those that had
    ///   expired: their outcome was told then).
    package mutating func acknowledged(_ entries: [Frame.MessageAck.Entry]) -> [(OutboxRecord, MessageOutcome)] {
        var finished: [(OutboxRecord, MessageOutcome)] = []
        for entry in entries {
            guard let record = self.records.removeValue(forKey: entry.id) else { continue }
            self.reportedSent.remove(entry.id)
            self.expiries.remove(entry.id)
            self.toRemove.append(entry.id)
            guard !record.expired else { continue }
            let outcome: MessageOutcome = entry.status == .ok ? .acknowledged : .refused(entry.status)
            self.remember(outcome, of: entry.id)
            finished.append((record, outcome))
        }
        return finished
    }

    // MARK: Expiry

    /// When the next message expires (wall-clock milliseconds), if any does.
    package var nextExpiry: Int64? {
        mutating get { self.expiries.earliest }
    }

    /// Expires the messages whose time to live ended by `now` (wall-clock milliseconds).
    /// - Returns: Their tombstones, which replace them on the connection.
    package mutating func expire(now: Int64) -> [OutboxRecord] {
        var tombstones: [OutboxRecord] = []
        for id in self.expiries.popExpired(at: now) {
            guard var record = self.records[id], !record.expired else { continue }
            record.expired = true
            record.body = ByteBuffer()
            self.records[id] = record
            self.toExpire.append(id)
            self.remember(.expired, of: id)
            tombstones.append(record)
        }
        return tombstones
    }

    // MARK: Outcomes and storage

    /// How message `id` stands.
    package func outcome(of id: UInt64) -> Lookup {
        if let outcome = self.outcomes[id] { return .finished(outcome) }
        guard let record = self.records[id] else { return .unknown }
        return record.expired ? .finished(.expired) : .pending
    }

    private mutating func remember(_ outcome: MessageOutcome, of id: UInt64) {
        self.outcomes[id] = outcome
        self.outcomeOrder.append(id)
        while self.outcomeOrder.count > self.rememberedOutcomes, let oldest = self.outcomeOrder.popFirst() {
            self.outcomes[oldest] = nil
        }
    }

    /// What storage must do now: remove acknowledged messages, mark expired ones.
    package mutating func takeStorageWork() -> (remove: [UInt64], expire: [UInt64]) {
        defer {
            self.toRemove.removeAll()
            self.toExpire.removeAll()
        }
        return (self.toRemove, self.toExpire)
    }
}
