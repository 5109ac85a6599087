public import Foundation
public import NIOCore
public import TetherCore

/// Where the gateway keeps the state of reliable delivery (PROTOCOL.md, section 9): which
/// messages of each conversation it processed, and the deliveries each recipient has not yet
/// acknowledged.
///
/// Two implementations come with Tether: ``SQLiteMessageStore`` (a file, the default for a
/// single gateway) and ``InMemoryMessageStore`` (tests). A server database plugs in by
/// implementing this protocol.
///
/// Implementations must make ``commit(processed:deliveries:)`` atomic: the processed messages
/// and the deliveries their handlers produced are stored together or not at all.
public protocol MessageStore: Sendable {
    /// Identifies this store's delivery sequence numbers; sent to clients in WELCOME. It must
    /// stay the same for the life of the store and differ between stores.
    var epoch: UInt64 { get }

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

    /// The last sequence an outbox's conversation had processed, 0 if none.
    func lastProcessed(_ outbox: OutboxID, conversation: String) async throws -> UInt64

    /// The outcome recorded for an already processed message: ``StatusCode/ok`` unless it was refused.
    func outcome(_ outbox: OutboxID, conversation: String, sequence: UInt64) async throws -> StatusCode

    /// The outcome and the message id recorded for an already processed message, if the store
    /// still has them: it keeps those of the last 10,000 sequences of each conversation. `nil`
    /// for an older one (it was processed; its outcome is no longer known).
    ///
    /// The default implementation answers ``outcome(_:conversation:sequence:)`` without an id:
    /// such a store cannot tell a conflicting duplicate from a retransmission.
    func recordedOutcome(_ outbox: OutboxID, conversation: String, sequence: UInt64) async throws -> RecordedOutcome?

    /// Atomically records processed messages and appends deliveries.
    ///
    /// The messages of an outbox's conversation must appear in sequence order, each directly
    /// following the conversation's last processed sequence (or the one before it in `processed`).
    /// - Returns: The sequence numbers given to `deliveries`, in order.
    /// - Throws: ``MessageStoreError`` with code ``MessageStoreError/Code/conflict`` if a
    ///   sequence does not follow (someone processed it meanwhile); nothing is written then.
    func commit(processed: [ProcessedMessage], deliveries: [NewDelivery]) async throws -> [DeliveryReceipt]

    /// Up to `limit` deliveries of `recipient` with a sequence above `sequence`, oldest first.
    func deliveries(for recipient: String, after sequence: UInt64, limit: Int) async throws -> [StoredDelivery]

    /// Forgets the deliveries of `recipient` up to and including `sequence`.
    func acknowledge(recipient: String, upTo sequence: UInt64) async throws

    /// How many deliveries `recipient` has waiting, and their body bytes: what its quota
    /// counts (``GatewayConfiguration/Limits-swift.struct/maxDeliveriesPerRecipient``).
    func usage(of recipient: String) async throws -> StreamUsage
}

extension MessageStore {
    public func recordedOutcome(_ outbox: OutboxID, conversation: String, sequence: UInt64) async throws -> RecordedOutcome? {
        RecordedOutcome(status: try await self.outcome(outbox, conversation: conversation, sequence: sequence))
    }

    /// Counts the waiting deliveries by reading them all; implement it with a query.
    public func usage(of recipient: String) async throws -> StreamUsage {
        let waiting = try await self.deliveries(for: recipient, after: 0, limit: .max)
        return StreamUsage(deliveries: waiting.count, bytes: waiting.reduce(0) { $0 + $1.body.readableBytes })
    }
}

/// What a recipient has waiting in the store.
public struct StreamUsage: Sendable, Hashable {
    public var deliveries: Int
    /// The deliveries' body bytes.
    public var bytes: Int

    public init(deliveries: Int, bytes: Int) {
        self.deliveries = deliveries
        self.bytes = bytes
    }
}

/// One outbox of a client: the numbering of the reliable messages of one device or one
/// installation of the app (PROTOCOL.md, section 9.1). A client id may have several.
public struct OutboxID: Sendable, Hashable, CustomStringConvertible {
    /// The client id the outbox's connections authenticated as.
    public var client: String
    /// The outbox epoch the client sent in HELLO.
    public var epoch: UInt64

    public init(client: String, epoch: UInt64) {
        self.client = client
        self.epoch = epoch
    }

    public var description: String { "\(self.client)#\(String(self.epoch, radix: 16))" }
}

/// A reliable message the gateway processed, with its outcome.
public struct ProcessedMessage: Sendable, Hashable {
    /// The outbox that sent it.
    public var outbox: OutboxID
    public var conversation: String
    public var sequence: UInt64
    /// ``StatusCode/ok``, or why it was refused.
    public var status: StatusCode
    /// The client's id of the message: with it, a store tells a retransmission (same id) from
    /// a conflicting duplicate (another message claiming the same sequence).
    public var messageID: UInt64?

    public init(outbox: OutboxID, conversation: String, sequence: UInt64, status: StatusCode = .ok, messageID: UInt64? = nil) {
        self.outbox = outbox
        self.conversation = conversation
        self.sequence = sequence
        self.status = status
        self.messageID = messageID
    }
}

/// What a store remembers of a processed message: its outcome, and its id if it was recorded.
public struct RecordedOutcome: Sendable, Hashable {
    /// ``StatusCode/ok``, or why it was refused.
    public var status: StatusCode
    /// The client's id of the message that had this sequence; `nil` if not recorded.
    public var messageID: UInt64?

    public init(status: StatusCode, messageID: UInt64? = nil) {
        self.status = status
        self.messageID = messageID
    }
}

/// A delivery to append to a recipient's stream.
public struct NewDelivery: Sendable, Hashable {
    /// The recipient's client id.
    public var recipient: String
    public var topic: String
    public var body: ByteBuffer

    public init(recipient: String, topic: String, body: ByteBuffer) {
        self.recipient = recipient
        self.topic = topic
        self.body = body
    }
}

/// A delivery a recipient has not acknowledged yet.
public struct StoredDelivery: Sendable, Hashable {
    public var sequence: UInt64
    public var topic: String
    public var body: ByteBuffer

    public init(sequence: UInt64, topic: String, body: ByteBuffer) {
        self.sequence = sequence
        self.topic = topic
        self.body = body
    }
}

/// Where an appended delivery landed.
public struct DeliveryReceipt: Sendable, Hashable {
    public var recipient: String
    public var sequence: UInt64

    public init(recipient: String, sequence: UInt64) {
        self.recipient = recipient
        self.sequence = sequence
    }
}

/// A failure of a ``MessageStore``.
public struct MessageStoreError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        enum Wrapped: Hashable, Sendable { case conflict, storage, invalidArgument }
        let wrapped: Wrapped

        /// A processed message did not follow its conversation's last sequence.
        public static let conflict = Code(wrapped: .conflict)
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

/// How many outcomes (status and message id) per conversation a store remembers: to answer
/// retransmissions with the same status, and to tell a conflicting duplicate (another message
/// with a sequence already processed) from a retransmission. A client retransmits only what
/// it has in flight, far fewer.
let outcomeWindow: UInt64 = 10_000
