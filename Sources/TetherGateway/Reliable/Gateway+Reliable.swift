public import Logging
public import NIOCore
import TetherCore

/// A reliable message as its handler receives it (PROTOCOL.md, section 9.1).
public struct ReliableMessage: Sendable {
    /// The outbox it came from: its sender's client id and outbox epoch (one per installation).
    public var outbox: OutboxID
    /// The client's id of the message, unique in its outbox.
    public var id: UInt64
    /// The topic the client sent it on; it selected this handler.
    public var topic: String
    /// The conversation (ordering key) it belongs to.
    public var conversation: String
    /// Its position in the conversation; handlers see 1, 2, 3, … each once.
    public var sequence: UInt64
    /// The message's content.
    public var body: ByteBuffer

    /// A key that names this message and no other, however often it is sent:
    /// `CLIENT/OUTBOX-EPOCH/ID` (the epoch in hexadecimal). Keep it with the message's side
    /// effects (a unique index) to make them happen once.
    public var idempotencyKey: String { "\(self.outbox.client)/\(String(self.outbox.epoch, radix: 16))/\(self.id)" }
}

/// What a message handler knows and may do: who sent the message, and deliveries that are
/// stored atomically with the message's processed mark, so they happen exactly once however
/// often the client retransmits.
///
/// It belongs to the handler's call: deliveries made after the handler returned would not be
/// committed, so the context cannot leave the call (it is not `Sendable`).
public final class MessageContext {
    /// The connection the message came on.
    public let connection: ConnectionInfo
    private let base: Logger
    private let connectionID: UInt64
    private let messageID: UInt64
    private let conversation: String
    private let pushes: Pusher
    private(set) var staged: [NewDelivery] = []

    /// A logger carrying the connection, message and conversation.
    ///
    /// Made on each use: most handlers never log, and adding metadata to a logger is not free
    /// (`StreamLogHandler` renders all of it again on every change).
    public var logger: Logger {
        var logger = self.base
        logger[metadataKey: "tether.connection"] = "\(self.connectionID)"
        logger[metadataKey: "tether.message"] = "\(self.messageID)"
        logger[metadataKey: "tether.conversation"] = "\(self.conversation)"
        return logger
    }

    init(connection: ConnectionInfo, base: Logger, connectionID: UInt64, message: Frame.Message, pushes: Pusher) {
        self.connection = connection
        self.base = base
        self.connectionID = connectionID
        self.messageID = message.id
        self.conversation = message.conversation
        self.pushes = pushes
    }

    /// Delivers a message reliably to a client id, if and only if this message's processing
    /// commits. The recipient gets it exactly once, in order, whether it is online now or later.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for an empty
    ///   recipient or a topic longer than 65,535 bytes.
    public func deliver(to recipient: String, topic: String, body: ByteBuffer) throws(GatewayError) {
        try Gateway.validateDelivery(recipient: recipient, topic: topic)
        self.staged.append(NewDelivery(recipient: recipient, topic: topic, body: body))
    }

    /// Pushes a message (not reliably: now, to whoever is connected; see ``Gateway/push(_:_:to:)``).
    /// It happens at least once per message: a handler may run again if its batch does not commit.
    @discardableResult
    public func push(_ topic: String, _ body: ByteBuffer, to target: PushTarget) throws(GatewayError) -> Int {
        try self.pushes.push(topic, body, to: target)
    }
}

@available(*, unavailable)
extension MessageContext: Sendable {}

extension Gateway {
    /// Handles a reliable message: returns normally to accept it, throws ``RequestError`` to
    /// refuse it for good (the client reports it failed with that status); any other error is
    /// treated as transient: the message is not acknowledged and the client sends it again.
    public typealias MessageHandler = @Sendable (ReliableMessage, MessageContext) async throws -> Void

    /// Registers the handler of reliable messages on `topic`, replacing any earlier one.
    ///
    /// Each message of a client's conversation reaches the handler once, in order, even across
    /// retransmissions, reconnects and gateway restarts (with a persistent ``MessageStore``).
    /// The deliveries the handler makes through ``MessageContext/deliver(to:topic:body:)`` are
    /// committed atomically with the message; its other side effects happen at least once, so
    /// use ``ReliableMessage/id`` as an idempotency key for them.
    ///
    /// ```swift
    /// gateway.onMessage("chat.send") { message, context in
    ///     try context.deliver(to: "bob", topic: "chat.message", body: message.body)
    /// }
    /// ```
    public func onMessage(_ topic: String, _ handler: @escaping MessageHandler) {
        self.register("onMessage(\"\(topic)\")") { $0.add(topic: topic, handler) }
    }

    /// Registers the handler of reliable messages on every topic that starts with `prefix` and
    /// has no handler of its own (``onMessage(_:_:)``); the longest matching prefix wins, and
    /// an empty prefix takes every topic. Register it before ``run()``.
    public func onMessage(prefix: String, _ handler: @escaping MessageHandler) {
        self.register("onMessage(prefix: \"\(prefix)\")") { $0.add(topicPrefix: prefix, handler) }
    }

    /// Delivers a message reliably to a client id, outside any message handler.
    /// - Returns: The delivery's sequence number in the recipient's stream.
    /// - Throws: ``GatewayError``: ``GatewayError/Code/notRunning`` without a message store,
    ///   ``GatewayError/Code/invalidArgument`` for a bad recipient or topic,
    ///   ``GatewayError/Code/quotaExceeded`` when the recipient has its quota of deliveries
    ///   waiting, or the store's failure.
    @discardableResult
    public func deliver(to recipient: String, topic: String, body: ByteBuffer) async throws(GatewayError) -> UInt64 {
        try await self.deliver(to: recipient, topic: topic, body: body, processed: [], with: try self.reliableServices())!
    }

    /// What became of a delivery made with an idempotency key.
    public enum KeyedDelivery: Sendable, Hashable {
        /// Stored now: the recipient gets it once, at this sequence of its stream.
        case delivered(sequence: UInt64)
        /// A delivery with the same key was made before: nothing was stored this time.
        case duplicate
    }

    /// Delivers a message reliably to a client id once per idempotency key, however often the
    /// call is repeated (a backend retrying after a timeout).
    ///
    /// The key is recorded in the same store write as the delivery, so two calls with one key
    /// store one delivery, even at the same moment on two nodes of a cluster. Keys are kept per
    /// day (UTC) for the store's outbox retention, and a call checks the day before too: a
    /// repeat is recognised for at least 24 hours after the first call.
    ///
    /// ```swift
    /// let result = try await gateway.deliver(to: "bob", topic: "order.shipped", body: body, idempotencyKey: "order-42-shipped")
    /// ```
    /// - Throws: ``GatewayError``: ``GatewayError/Code/invalidArgument`` for a key that is not
    ///   1 to 255 bytes, and as ``deliver(to:topic:body:)``.
    public func deliver(
        to recipient: String,
        topic: String,
        body: ByteBuffer,
        idempotencyKey key: String
    ) async throws(GatewayError) -> KeyedDelivery {
        guard (1...255).contains(key.utf8.count) else {
            throw GatewayError(code: .invalidArgument, message: "an idempotency key must be 1 to 255 bytes long")
        }
        let reliable = try self.reliableServices()
        let day = UInt64(max(0, self.clock.wallClockMilliseconds) / 86_400_000)
        let today = OutboxID(client: Self.keyedDeliveriesClient, epoch: day)
        do {
            let yesterday = OutboxID(client: Self.keyedDeliveriesClient, epoch: day &- 1)
            if try await reliable.store.lastProcessed(yesterday, conversation: key) > 0 { return .duplicate }
            // The day's outbox is kept (with its keys) for the outbox retention after its day.
            try await reliable.store.touchOutboxes([today], at: self.clock.wallClockDate)
        } catch {
            throw GatewayError(code: .storage, message: "could not read the store: \(error)")
        }
        let processed = ProcessedMessage(outbox: today, conversation: key, sequence: 1)
        guard let sequence = try await self.deliver(to: recipient, topic: topic, body: body, processed: [processed], with: reliable) else {
            return .duplicate
        }
        return .delivered(sequence: sequence)
    }

    /// The outboxes of keyed deliveries: one per day, named so that no client can claim it
    /// (a client id starting with `$` is refused at the handshake).
    static let keyedDeliveriesClient = "$api"

    /// Reliable delivery's services.
    /// - Throws: ``GatewayError/Code/notRunning`` for a gateway without a message store.
    private func reliableServices() throws(GatewayError) -> ReliableServices {
        guard let reliable = self.reliable else {
            throw GatewayError(code: .notRunning, message: "reliable delivery needs a message store (Gateway(messageStore:))")
        }
        return reliable
    }

    /// Stores a delivery with `processed` in one write.
    /// - Returns: The delivery's sequence, or `nil` when `processed` conflicted (a key used before).
    private func deliver(
        to recipient: String,
        topic: String,
        body: ByteBuffer,
        processed: [ProcessedMessage],
        with reliable: ReliableServices
    ) async throws(GatewayError) -> UInt64? {
        try Self.validateDelivery(recipient: recipient, topic: topic)
        let limits = self.configuration.limits
        let usage: StreamUsage
        do {
            usage = try await reliable.store.usage(of: recipient)
        } catch {
            throw GatewayError(code: .storage, message: "could not read the store: \(error)")
        }
        if usage.deliveries + 1 > limits.maxDeliveriesPerRecipient {
            throw GatewayError(
                code: .quotaExceeded,
                message: "the delivery is refused: '\(recipient)' has \(limits.maxDeliveriesPerRecipient) deliveries waiting"
            )
        }
        var compressor = DeliveryCompressor(reliable.compression)
        let delivery = compressor.compress([NewDelivery(recipient: recipient, topic: topic, body: body)])[0]
        if usage.bytes + delivery.body.readableBytes > limits.maxDeliveryBytesPerRecipient {
            throw GatewayError(
                code: .quotaExceeded,
                message:
                    "the delivery is refused: '\(recipient)' has over \(limits.maxDeliveryBytesPerRecipient) bytes of deliveries waiting"
            )
        }
        if let stored = reliable.quotas.storeUsage {
            if stored.deliveries + 1 > limits.maxStoredDeliveries
                || stored.bytes + delivery.body.readableBytes > limits.maxStoredDeliveryBytes
            {
                throw GatewayError(
                    code: .quotaExceeded,
                    message:
                        "the delivery is refused: the store holds its maximum of \(limits.maxStoredDeliveries) deliveries or \(limits.maxStoredDeliveryBytes) bytes waiting"
                )
            }
        }
        let receipts: [DeliveryReceipt]
        do {
            receipts = try await reliable.writer.commit(StoreWrite(processed: processed, deliveries: [delivery]))
        } catch  where error.code == .conflict && !processed.isEmpty {
            return nil
        } catch {
            throw GatewayError(code: .storage, message: "could not store the delivery: \(error)")
        }
        let sequence = receipts[0].sequence
        reliable.quotas.stored(by: nil, deliveries: 1, bytes: delivery.body.readableBytes, now: self.clock.now)
        self.registry.offer(
            [recipient: [StoredDelivery(sequence: sequence, topic: topic, body: delivery.body, compressed: delivery.compressed)]]
        )
        return sequence
    }

    static func validateDelivery(recipient: String, topic: String) throws(GatewayError) {
        guard !recipient.isEmpty else {
            throw GatewayError(code: .invalidArgument, message: "a delivery needs a recipient client id")
        }
        guard !topic.isEmpty, topic.utf8.count <= Int(UInt16.max) else {
            throw GatewayError(code: .invalidArgument, message: "a delivery topic must be 1 to 65535 bytes long")
        }
    }
}
