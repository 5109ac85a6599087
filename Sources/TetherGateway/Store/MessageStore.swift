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

    /// Records a client's outbox epoch. If the client had another one, its conversation state
    /// is forgotten first (its new outbox numbers from 1 again).
    /// - Returns: Whether the client's conversation state was reset.
    func registerOutbox(client: String, epoch: UInt64) async throws -> Bool

    /// The last sequence processed in a conversation, 0 if none.
    func lastProcessed(client: String, conversation: String) async throws -> UInt64

    /// The outcome recorded for an already processed message: ``StatusCode/ok`` unless it was refused.
    func outcome(client: String, conversation: String, sequence: UInt64) async throws -> StatusCode

    /// Atomically records processed messages and appends deliveries.
    ///
    /// The messages of a conversation must appear in sequence order, each directly following
    /// the conversation's last processed sequence (or the one before it in `processed`).
    /// - Returns: The sequence numbers given to `deliveries`, in order.
    /// - Throws: ``MessageStoreError`` with code ``MessageStoreError/Code/conflict`` if a
    ///   sequence does not follow (someone processed it meanwhile); nothing is written then.
    func commit(processed: [ProcessedMessage], deliveries: [NewDelivery]) async throws -> [DeliveryReceipt]

    /// Up to `limit` deliveries of `recipient` with a sequence above `sequence`, oldest first.
    func deliveries(for recipient: String, after sequence: UInt64, limit: Int) async throws -> [StoredDelivery]

    /// Forgets the deliveries of `recipient` up to and including `sequence`.
    func acknowledge(recipient: String, upTo sequence: UInt64) async throws
}

/// A reliable message the gateway processed, with its outcome.
public struct ProcessedMessage: Sendable, Hashable {
    public var client: String
    public var conversation: String
    public var sequence: UInt64
    /// ``StatusCode/ok``, or why it was refused.
    public var status: StatusCode

    public init(client: String, conversation: String, sequence: UInt64, status: StatusCode = .ok) {
        self.client = client
        self.conversation = conversation
        self.sequence = sequence
        self.status = status
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

/// How many refusals per conversation a store remembers, to answer retransmissions with the
/// same status. (Successes need no record: every sequence up to the last processed one is a
/// duplicate.)
let refusalWindow: UInt64 = 10_000
