public import NIOCore

/// Where a client keeps the messages it accepted until the gateway acknowledges them, and how
/// far it processed its deliveries (PROTOCOL.md, section 9).
///
/// Two implementations come with Tether: ``SQLiteOutboxStore`` (a file in the app's storage,
/// which survives the app being killed) and ``InMemoryOutboxStore`` (tests, or apps that accept
/// losing unsent messages when they quit).
public protocol OutboxStore: Sendable {
    /// Reads everything the store holds; called once, before the client first uses it.
    func load() async throws -> OutboxSnapshot

    /// Appends messages and records the counters that numbered them, in one transaction.
    /// - Parameters:
    ///   - records: The new messages.
    ///   - nextID: The id the next message will get.
    ///   - conversations: The last sequence given in each conversation these messages belong to.
    func append(_ records: [OutboxRecord], nextID: UInt64, conversations: [String: UInt64]) async throws

    /// Marks messages expired: their bodies are dropped, they stay until acknowledged.
    func markExpired(_ ids: [UInt64]) async throws

    /// Removes acknowledged messages.
    func remove(_ ids: [UInt64]) async throws

    /// Records how far the client processed its deliveries.
    func saveCheckpoint(_ checkpoint: DeliveryCheckpoint) async throws
}

/// How urgently a message is sent, relative to the client's other messages.
public enum MessagePriority: UInt8, Sendable, Hashable, CaseIterable {
    case high = 0
    case normal = 1
    case low = 2
}

/// A message in the outbox.
public struct OutboxRecord: Sendable, Hashable {
    /// The client message id (PROTOCOL.md, section 4.10).
    public var id: UInt64
    public var topic: String
    public var conversation: String
    /// The message's position in its conversation, from 1.
    public var sequence: UInt64
    public var priority: MessagePriority
    /// When the message expires, in milliseconds since 1970 (wall clock, so that it survives a
    /// restart); `nil` if it does not.
    public var expiresAt: Int64?
    /// The time to live ran out: only a tombstone remains, sent until acknowledged.
    public var expired: Bool
    public var body: ByteBuffer

    public init(
        id: UInt64,
        topic: String,
        conversation: String,
        sequence: UInt64,
        priority: MessagePriority,
        expiresAt: Int64?,
        expired: Bool = false,
        body: ByteBuffer
    ) {
        self.id = id
        self.topic = topic
        self.conversation = conversation
        self.sequence = sequence
        self.priority = priority
        self.expiresAt = expiresAt
        self.expired = expired
        self.body = body
    }
}

/// Everything an outbox store holds.
public struct OutboxSnapshot: Sendable, Hashable {
    /// The outbox's identity, random, fixed when it was created (PROTOCOL.md, section 9.1).
    public var epoch: UInt64
    /// The id the next message gets.
    public var nextID: UInt64
    /// The last sequence given in each conversation.
    public var conversations: [String: UInt64]
    /// The messages not yet acknowledged, by id.
    public var records: [OutboxRecord]
    public var checkpoint: DeliveryCheckpoint?

    public init(
        epoch: UInt64,
        nextID: UInt64,
        conversations: [String: UInt64],
        records: [OutboxRecord],
        checkpoint: DeliveryCheckpoint?
    ) {
        self.epoch = epoch
        self.nextID = nextID
        self.conversations = conversations
        self.records = records
        self.checkpoint = checkpoint
    }
}

/// A failure of an ``OutboxStore``.
public struct OutboxStoreError: Error, Hashable, Sendable, CustomStringConvertible {
    public var message: String
    public init(message: String) { self.message = message }
    public var description: String { "outbox storage failed: \(self.message)" }
}
