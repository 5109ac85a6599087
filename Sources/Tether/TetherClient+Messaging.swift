public import NIOCore
import TetherCore
import Tracing

extension TetherClient {
    /// Sends a message reliably: it reaches the gateway's handler for `topic` exactly once, in
    /// order within its conversation, across dropped connections, network switches and restarts
    /// of the app (with a ``SQLiteOutboxStore``) or of the gateway, or fails visibly.
    ///
    /// Returns as soon as the message is stored in the outbox; it is sent when connected, and
    /// again after reconnects, until the gateway acknowledges it. Follow it with
    /// ``outcome(of:)`` or ``messageEvents``.
    ///
    /// ```swift
    /// let receipt = try await client.send("chat.send", body: ByteBuffer(string: "hi"), conversation: "room-42")
    /// let outcome = await client.outcome(of: receipt)  // .acknowledged, .refused(status) or .expired
    /// ```
    /// - Parameters:
    ///   - topic: Selects the gateway's message handler.
    ///   - body: The message's content.
    ///   - conversation: The ordering key: messages with the same one are processed in the order
    ///     their `send` calls returned. Different conversations do not wait for each other.
    ///   - priority: High-priority conversations are sent before normal and low ones.
    ///   - ttl: After this long without an acknowledgement the message expires: it is no
    ///     longer processed and its outcome is ``MessageOutcome/expired``.
    /// - Returns: The message's id and place in its conversation.
    /// - Throws: ``TetherError``: ``TetherError/Code/invalidConfiguration`` without
    ///   ``ClientConfiguration/reliability``, ``TetherError/Code/outboxFull`` (when configured to
    ///   fail rather than wait), ``TetherError/Code/storage``, ``TetherError/Code/invalidArgument``,
    ///   ``TetherError/Code/cancelled`` (while waiting for room), ``TetherError/Code/shutdown``.
    public func send(
        _ topic: String,
        body: ByteBuffer,
        conversation: String = "",
        priority: MessagePriority = .normal,
        ttl: Duration? = nil
    ) async throws(TetherError) -> MessageReceipt {
        let engine = try self.reliableEngine()
        // A producer span for accepting the message; the gateway's span for processing it is its child.
        return try await self.withSpan(
            topic,
            ofKind: .producer,
            attributes: ["messaging.system": "tether", "messaging.destination.name": topic]
        ) {
            traceContext throws(TetherError) in
            try await engine.send(
                topic: topic,
                body: body,
                conversation: conversation,
                priority: priority,
                ttl: ttl,
                traceContext: traceContext
            )
        }
    }

    /// How a message ended, waiting for it if it has not yet.
    /// - Returns: `nil` if the outbox does not know the message (any more): outcomes are
    ///   remembered for the last 10,000 messages.
    public func outcome(of receipt: MessageReceipt) async -> MessageOutcome? {
        await self.reliable?.outcome(of: receipt.id)
    }

    /// How the message with this id ended (for messages sent before the app restarted).
    public func outcome(ofMessage id: UInt64) async -> MessageOutcome? {
        await self.reliable?.outcome(of: id)
    }

    /// The messages accepted by ``send(_:body:conversation:priority:ttl:)`` that have no outcome
    /// yet, oldest first, including those accepted before the app restarted (with a
    /// ``SQLiteOutboxStore``): an app can show them as "sending" and await their outcomes.
    ///
    /// ```swift
    /// for receipt in try await client.pendingMessages() {
    ///     print(receipt.id, await client.outcome(of: receipt) ?? .expired)
    /// }
    /// ```
    /// - Throws: ``TetherError`` with ``TetherError/Code/invalidConfiguration`` without
    ///   ``ClientConfiguration/reliability``, or ``TetherError/Code/storage`` if the outbox
    ///   cannot be loaded.
    public func pendingMessages() async throws(TetherError) -> [MessageReceipt] {
        try await self.reliableEngine().pending()
    }

    /// Every message's state changes from now on: queued, sent, acknowledged, refused, expired.
    /// Ends when the client stops.
    public var messageEvents: AsyncStream<MessageEvent> {
        guard let reliable = self.reliable else { return AsyncStream { $0.finish() } }
        return reliable.events.subscribe()
    }

    /// The reliable deliveries the gateway sends this client: each once, in order, across
    /// reconnects and restarts.
    ///
    /// A delivery counts as processed when the loop asks for the next one, or when the app
    /// calls ``acknowledge(_:)``: only then is its checkpoint stored and the gateway told. A
    /// loop that ends or throws without either leaves the delivery it was given unprocessed:
    /// the next loop gets it again (and so does the app after a restart or a crash).
    ///
    /// ```swift
    /// for try await delivery in client.deliveries() {
    ///     try database.save(delivery)   // processed once the loop moves on; if save throws,
    /// }                                 // the next loop gets this delivery again
    /// ```
    /// - Important: One loop at a time: a second concurrent consumer gets
    ///   ``TetherError/Code/invalidArgument``.
    public func deliveries() -> DeliveryStream {
        DeliveryStream(engine: self.reliable)
    }

    /// Marks a delivery processed now, rather than when the loop asks for the next one: for a
    /// loop that stops right after a delivery it did process.
    ///
    /// ```swift
    /// for try await delivery in client.deliveries() {
    ///     try database.save(delivery)
    ///     if delivery.topic == "sync.done" {
    ///         try client.acknowledge(delivery)   // else the next loop gets it again
    ///         break
    ///     }
    /// }
    /// ```
    /// - Parameter delivery: The delivery the loop was given last.
    /// - Throws: ``TetherError`` with ``TetherError/Code/invalidArgument`` if it is not the
    ///   delivery the app holds (nor one processed already), or
    ///   ``TetherError/Code/invalidConfiguration`` without ``ClientConfiguration/reliability``.
    public func acknowledge(_ delivery: Delivery) throws(TetherError) {
        try self.reliableEngine().acknowledgeDelivery(delivery.sequence)
    }

    private func reliableEngine() throws(TetherError) -> ReliableEngine {
        guard let reliable = self.reliable else {
            throw TetherError(
                code: .invalidConfiguration,
                message: "reliable messaging is not configured: set ClientConfiguration.reliability"
            )
        }
        return reliable
    }
}

/// The reliable deliveries of a client, in order (see ``TetherClient/deliveries()``).
public struct DeliveryStream: AsyncSequence, Sendable {
    public typealias Element = Delivery
    public typealias Failure = TetherError

    let engine: ReliableEngine?

    public func makeAsyncIterator() -> Iterator {
        Iterator(consumer: Consumer(engine: self.engine))
    }

    public struct Iterator: AsyncIteratorProtocol {
        public typealias Element = Delivery
        public typealias Failure = TetherError

        let consumer: Consumer

        public mutating func next(isolation actor: isolated (any Actor)? = #isolation) async throws(TetherError) -> Delivery? {
            try await self.consumer.next()
        }

        public mutating func next() async throws(TetherError) -> Delivery? {
            try await self.consumer.next()
        }
    }

    /// Gives the delivery it holds back to the inbox when the loop ends, unless it was processed.
    final class Consumer: Sendable {
        let engine: ReliableEngine?

        init(engine: ReliableEngine?) {
            self.engine = engine
        }

        func next() async throws(TetherError) -> Delivery? {
            guard let engine = self.engine else {
                throw TetherError(
                    code: .invalidConfiguration,
                    message: "reliable messaging is not configured: set ClientConfiguration.reliability"
                )
            }
            return try await engine.nextDelivery().map { Delivery(sequence: $0.sequence, topic: $0.topic, body: $0.body) }
        }

        deinit {
            self.engine?.consumerEnded()
        }
    }
}
