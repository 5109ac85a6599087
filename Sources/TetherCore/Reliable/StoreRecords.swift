public import NIOCore

// The records the gateway's reliable path reads from and writes to its message store. They
// live here, with the pure machine that decides them (``ReliableLaneMachine``); the store
// protocol and its implementations are the gateway's (TetherGateway's `MessageStore`).

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

/// A position in one conversation of an outbox.
public struct ConversationSequence: Sendable, Hashable {
    public var conversation: String
    public var sequence: UInt64

    public init(conversation: String, sequence: UInt64) {
        self.conversation = conversation
        self.sequence = sequence
    }
}

/// What a store knows of some conversations of one outbox: what a batch of its messages needs
/// to be deduplicated.
public struct DedupState: Sendable, Hashable {
    /// The last processed sequence of each conversation asked about (0 if none).
    public var lastProcessed: [String: UInt64]
    /// The outcome recorded for each position asked about, if the store still has it.
    public var outcomes: [ConversationSequence: RecordedOutcome]

    public init(lastProcessed: [String: UInt64] = [:], outcomes: [ConversationSequence: RecordedOutcome] = [:]) {
        self.lastProcessed = lastProcessed
        self.outcomes = outcomes
    }
}

/// A delivery to append to a recipient's stream.
public struct NewDelivery: Sendable, Hashable {
    /// The recipient's client id.
    public var recipient: String
    public var topic: String
    /// The payload, as it is stored: raw DEFLATE if ``compressed``.
    public var body: ByteBuffer
    /// Whether ``body`` is the payload compressed (PROTOCOL.md 2.5): the gateway stores a
    /// payload worth it compressed, and sends it as it is to a client that negotiated
    /// compression (inflated to one that did not).
    public var compressed: Bool

    public init(recipient: String, topic: String, body: ByteBuffer, compressed: Bool = false) {
        self.recipient = recipient
        self.topic = topic
        self.body = body
        self.compressed = compressed
    }
}

/// A delivery a recipient has not acknowledged yet.
public struct StoredDelivery: Sendable, Hashable {
    public var sequence: UInt64
    public var topic: String
    /// The payload, as it is stored: raw DEFLATE if ``compressed``.
    public var body: ByteBuffer
    /// Whether ``body`` is the payload compressed.
    public var compressed: Bool

    public init(sequence: UInt64, topic: String, body: ByteBuffer, compressed: Bool = false) {
        self.sequence = sequence
        self.topic = topic
        self.body = body
        self.compressed = compressed
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

/// One atomic write to a message store: processed messages with the deliveries their handlers
/// made, and deliveries recipients acknowledged. A store applies each write entirely or not at
/// all; it may apply several in one transaction (group commit).
public struct StoreWrite: Sendable, Hashable {
    /// Messages processed, in order: each conversation's must follow its last processed
    /// sequence, one after another, or the write is a conflict and nothing of it is applied.
    public var processed: [ProcessedMessage]
    /// Deliveries to append, in order; each recipient's get the next sequences of its stream.
    public var deliveries: [NewDelivery]
    /// For each recipient, the last delivery it acknowledged: those up to it are forgotten.
    public var acknowledgements: [String: UInt64]
    /// The claim on the lane of the outbox whose messages are processed, when gateways share
    /// the store (a cluster): a store that keeps claims applies the write only while the claim
    /// is still the lane's current one, and refuses it as ``fenced`` otherwise. `nil` for a
    /// single gateway, and for writes that process no message.
    public var fence: LaneFence?

    public init(processed: [ProcessedMessage] = [], deliveries: [NewDelivery] = [], acknowledgements: [String: UInt64] = [:]) {
        self.processed = processed
        self.deliveries = deliveries
        self.acknowledgements = acknowledgements
    }

    public init(
        processed: [ProcessedMessage] = [],
        deliveries: [NewDelivery] = [],
        acknowledgements: [String: UInt64] = [:],
        fence: LaneFence?
    ) {
        self.init(processed: processed, deliveries: deliveries, acknowledgements: acknowledgements)
        self.fence = fence
    }

    /// Whether the write changes nothing.
    public var isEmpty: Bool { self.processed.isEmpty && self.deliveries.isEmpty && self.acknowledgements.isEmpty }
}

/// A gateway's claim on the lane of one outbox, in a store shared by several gateways: only
/// the holder of the lane's current claim processes the outbox's messages. Each claim gets a
/// larger token than the last (a fencing token), so a gateway whose claim was taken over — it
/// looked dead, or its client moved — cannot commit with its old one.
public struct LaneFence: Sendable, Hashable, CustomStringConvertible {
    public var outbox: OutboxID
    /// The claim's token: larger than every earlier claim's on this lane.
    public var token: UInt64

    public init(outbox: OutboxID, token: UInt64) {
        self.outbox = outbox
        self.token = token
    }

    public var description: String { "\(self.outbox) fence \(self.token)" }
}

/// How many outcomes (status and message id) per conversation a store remembers: to answer
/// retransmissions with the same status, and to tell a conflicting duplicate (another message
/// with a sequence already processed) from a retransmission. A client retransmits only what
/// it has in flight, far fewer.
public let messageStoreOutcomeWindow: UInt64 = 10_000
