public import Foundation
import NIOCore
public import TetherCore

/// Where the gateway keeps the state of reliable delivery (PROTOCOL.md, section 9): which
/// messages of each conversation it processed, and the deliveries each recipient has not yet
/// acknowledged.
///
/// Two implementations come with Tether: ``SQLiteMessageStore`` (a file, the default for a
/// single gateway) and ``InMemoryMessageStore`` (tests). A server database plugs in by
/// implementing this protocol, and proves it with the contract suite every store passes
/// (`MessageStoreContract` in TetherGatewayTesting).
///
/// ## The contract
///
/// - **Writes are batched and atomic.** ``apply(_:)`` takes several ``StoreWrite``s — the
///   batches of several connections, and acknowledgements, gathered while the previous call ran
///   (group commit) — and applies each entirely or not at all, in order, ideally in one
///   transaction. A write whose processed messages do not follow their conversation's last
///   processed sequence is a **conflict**: it is left out, alone, with
///   ``MessageStoreError/Code/conflict``; the others are applied. A failure of the storage
///   itself throws, and then nothing was applied.
/// - **Durable before it returns.** The gateway answers MESSAGE_ACK only once `apply` returned
///   the write's result: a write must survive the process being killed from then on (the
///   SQLite store's WAL does; `fullSync` survives a power loss too).
/// - **Exactly once.** A processed message's outcome, sequence and message id, and the
///   deliveries its handler made, are one write: a retransmission finds the message processed
///   and the deliveries made once. Outcomes (status and message id) are kept for the last
///   ``messageStoreOutcomeWindow`` sequences of each conversation.
/// - **Deliveries** are numbered per recipient 1, 2, 3, … without gaps, in the order writes
///   append them, and kept until an acknowledgement covers them.
/// - **Reads see every write that returned.**
public protocol MessageStore: Sendable {
    /// Identifies this store's delivery sequence numbers; sent to clients in WELCOME. It must
    /// stay the same for the life of the store and differ between stores.
    var epoch: UInt64 { get }

    /// What a batch of an outbox's messages needs to be deduplicated: the last processed
    /// sequence of each of `conversations` (0 for one that processed nothing), and the outcome
    /// recorded for each of `outcomes` that the store still has.
    func dedupState(of outbox: OutboxID, conversations: Set<String>, outcomes: [ConversationSequence]) async throws -> DedupState

    /// How many calls to ``apply(_:)`` the gateway may have under way at once: 1 (the default)
    /// for a store with one writer, as SQLite; more for a server database, whose row locks keep
    /// concurrent groups that touch the same conversations or recipients in order (each group
    /// still reads the state the groups before it committed).
    var concurrentApplies: Int { get }

    /// Checks that the store answers (the admin listener's `/ready`): throws if it does not.
    /// A store in the process answers by default; a server database runs a trivial query.
    func checkReachable() async throws

    /// Applies writes, each atomically, in order; see the contract above.
    /// - Returns: One result per write, in order: the receipts of its deliveries (in order), or
    ///   the error that kept it out (``MessageStoreError/Code/conflict``).
    /// - Throws: ``MessageStoreError`` if the storage failed: nothing was applied.
    func apply(_ writes: [StoreWrite]) async throws -> [Result<[DeliveryReceipt], MessageStoreError>]

    /// Up to `limit` deliveries of `recipient` with a sequence above `sequence`, oldest first.
    func deliveries(for recipient: String, after sequence: UInt64, limit: Int) async throws -> [StoredDelivery]

    /// How many deliveries each of `recipients` has waiting, and their body bytes: what its
    /// quota counts (``GatewayConfiguration/Limits-swift.struct/maxDeliveriesPerRecipient``).
    func usage(of recipients: [String]) async throws -> [String: StreamUsage]

    /// The deliveries every recipient has waiting, together, and their body bytes: what the
    /// store-wide quota counts (``GatewayConfiguration/Limits-swift.struct/maxStoredDeliveries``).
    /// The gateway asks about once a second, so it should not scan what it can count. `nil`: the
    /// store cannot tell (the default), and the store-wide quota is not enforced.
    func totalUsage() async throws -> StreamUsage?

    /// Records that `outboxes` are in use at `time`, creating the records of those not known
    /// yet: an outbox's conversation state is kept until it has not been seen for the gateway's
    /// retention (``forgetOutboxes(notSeenSince:)``).
    ///
    /// Each outbox of a client (each device, each installation) has its own conversation
    /// state: a new outbox numbers its conversations from 1 without disturbing the others.
    func touchOutboxes(_ outboxes: [OutboxID], at time: Date) async throws

    /// Forgets the outboxes last touched before `time`, with their conversation state.
    /// - Returns: How many were forgotten.
    func forgetOutboxes(notSeenSince time: Date) async throws -> Int
}

extension MessageStore {
    /// One writer at a time.
    public var concurrentApplies: Int { 1 }

    /// Always reachable: the store is in the process.
    public func checkReachable() async throws {}

    /// Applies one write.
    /// - Returns: The receipts of its deliveries, in order.
    /// - Throws: ``MessageStoreError``: a conflict, or the storage's failure.
    public func commit(_ write: StoreWrite) async throws -> [DeliveryReceipt] {
        try await self.apply([write])[0].get()
    }

    /// Atomically records processed messages and appends deliveries.
    /// - Returns: The sequence numbers given to `deliveries`, in order.
    public func commit(processed: [ProcessedMessage], deliveries: [NewDelivery]) async throws -> [DeliveryReceipt] {
        try await self.commit(StoreWrite(processed: processed, deliveries: deliveries))
    }

    /// Forgets the deliveries of `recipient` up to and including `sequence`.
    public func acknowledge(recipient: String, upTo sequence: UInt64) async throws {
        _ = try await self.commit(StoreWrite(acknowledgements: [recipient: sequence]))
    }

    /// A store that cannot tell: the store-wide quota is not enforced with it.
    public func totalUsage() async throws -> StreamUsage? { nil }

    /// How many deliveries `recipient` has waiting, and their body bytes.
    public func usage(of recipient: String) async throws -> StreamUsage {
        try await self.usage(of: [recipient])[recipient] ?? StreamUsage(deliveries: 0, bytes: 0)
    }

    /// The last sequence an outbox's conversation had processed, 0 if none.
    public func lastProcessed(_ outbox: OutboxID, conversation: String) async throws -> UInt64 {
        try await self.dedupState(of: outbox, conversations: [conversation], outcomes: []).lastProcessed[conversation] ?? 0
    }

    /// The outcome and message id recorded for an already processed message, if the store still has them.
    public func recordedOutcome(_ outbox: OutboxID, conversation: String, sequence: UInt64) async throws -> RecordedOutcome? {
        let position = ConversationSequence(conversation: conversation, sequence: sequence)
        return try await self.dedupState(of: outbox, conversations: [], outcomes: [position]).outcomes[position]
    }
}

/// A failure of a ``MessageStore``.
public struct MessageStoreError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        enum Wrapped: Hashable, Sendable { case conflict, fenced, storage, invalidArgument }
        let wrapped: Wrapped

        /// A processed message did not follow its conversation's last sequence.
        public static let conflict = Code(wrapped: .conflict)
        /// The write's ``StoreWrite/fence`` is no longer its lane's current claim: another
        /// gateway took the lane over. Nothing of the write was applied.
        public static let fenced = Code(wrapped: .fenced)
        /// The storage failed (I/O, corruption, …).
        public static let storage = Code(wrapped: .storage)
        /// An argument was invalid.
        public static let invalidArgument = Code(wrapped: .invalidArgument)

        public var description: String { "\(self.wrapped)" }
    }

    public var code: Code
    public var message: String

    public init(code: Code, message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(self.code): \(self.message)" }
}
