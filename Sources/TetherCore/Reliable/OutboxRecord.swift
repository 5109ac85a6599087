public import NIOCore

// The vocabulary of reliable messaging (PROTOCOL.md, section 9), shared by the client's
// machines, its outbox stores and the application.

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
    /// The sender's trace (``TetherCore/TraceContext``), sent with the message. Kept in memory
    /// only: outbox stores do not persist it, so a message sent again after a restart starts a
    /// trace of its own on the gateway.
    public var traceContext: TraceContext?

    public init(
        id: UInt64,
        topic: String,
        conversation: String,
        sequence: UInt64,
        priority: MessagePriority,
        expiresAt: Int64?,
        expired: Bool = false,
        body: ByteBuffer,
        traceContext: TraceContext? = nil
    ) {
        self.id = id
        self.topic = topic
        self.conversation = conversation
        self.sequence = sequence
        self.priority = priority
        self.expiresAt = expiresAt
        self.expired = expired
        self.body = body
        self.traceContext = traceContext
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

/// How a message ended.
public enum MessageOutcome: Sendable, Hashable, CustomStringConvertible {
    /// The gateway processed it (exactly once).
    case acknowledged
    /// The gateway refused it for good, with this status (from the handler, or
    /// ``StatusCode/unknownMethod`` if no handler takes its topic).
    case refused(StatusCode)
    /// Its time to live ran out before it was acknowledged. It will not be processed after that
    /// (unless it was already on its way: a message sent before it expired may still have been
    /// processed, as with a request that times out).
    case expired

    public var description: String {
        switch self {
        case .acknowledged: "acknowledged"
        case .refused(let status): "refused (\(status))"
        case .expired: "expired"
        }
    }
}

/// How far a client processed its deliveries.
public struct DeliveryCheckpoint: Sendable, Hashable {
    /// The gateway's delivery epoch the sequence belongs to.
    public var epoch: UInt64
    /// Every delivery up to this sequence was processed.
    public var lastSequence: UInt64

    public init(epoch: UInt64, lastSequence: UInt64) {
        self.epoch = epoch
        self.lastSequence = lastSequence
    }
}
