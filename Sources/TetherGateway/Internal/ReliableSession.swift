import Logging
import NIOConcurrencyHelpers
import NIOCore
import TetherCore

/// Reliable delivery on one connection (PROTOCOL.md, section 9): processes the client's
/// MESSAGEs exactly once, in order per conversation, and pumps its DELIVERYs.
///
/// Two loops run for the connection's lifetime:
/// - ``runProcessor()`` takes the messages received so far as a batch, runs their handlers and
///   commits them with their deliveries atomically, then acknowledges them. It holds the
///   outbox's lane (``OutboxLanes``) meanwhile, so that a retransmission on another connection
///   never runs a handler twice. The conversation state belongs to the client's outbox (its
///   client id and outbox epoch): the devices of one client id are deduplicated separately.
/// - ``runPump(from:)`` sends the recipient's stored deliveries in order, at most
///   ``Gateway/deliveryWindow`` unacknowledged at a time.
final class ReliableSession: Sendable {
    private struct Received: Sendable {
        var message: Frame.Message
        var receivedAt: ContinuousClock.Instant
    }

    private struct State {
        var inbox = CircularBuffer<Received>()
        /// The body bytes of the messages in `inbox` and in the batch being processed.
        var bytes = 0
        /// Messages not taken since the last one that was (the inbox was full).
        var dropped = 0
        var pendingAck: UInt64?
        var finished = false
    }

    /// Messages waiting beyond this many are dropped; the client sends them again.
    static let maxInbox = 4096
    /// Messages processed in one batch (one transaction, one MESSAGE_ACK).
    static let maxBatch = 256

    private let services: GatewayServices
    private let store: any MessageStore
    private let connection: ConnectionInfo
    private let outbox: OutboxID
    /// Whether the client takes `unavailable` answers to messages not taken now (the
    /// `message answers` feature); without it, those get no answer.
    private let answers: Bool
    private let outbound: ConnectionOutbound
    /// Where the message handlers' tasks run.
    private let executor: (any TaskExecutor)?
    private let logger: Logger
    private let state = NIOLockedValueBox(State())
    /// The body bytes of reliable messages held in memory at most: the connection's inbound
    /// budget less what its frame reader may hold.
    private let byteBudget: Int
    private let messagesArrived: (stream: AsyncStream<Void>, continuation: AsyncStream<Void>.Continuation)
    private let pumpWakeups: (stream: AsyncStream<Void>, continuation: AsyncStream<Void>.Continuation)

    init(
        services: GatewayServices,
        store: any MessageStore,
        connection: ConnectionInfo,
        outbox: OutboxID,
        answers: Bool = false,
        outbound: ConnectionOutbound,
        executor: (any TaskExecutor)?,
        logger: Logger
    ) {
        self.services = services
        self.store = store
        self.connection = connection
        self.outbox = outbox
        self.answers = answers
        self.outbound = outbound
        self.executor = executor
        self.logger = logger
        let limits = services.configuration.limits
        self.byteBudget = limits.maxBufferedInboundBytes - limits.maxBodySize
        services.outboxLanes.checkOut(outbox)  // keeps the lane's cache while connected; see finish()
        self.messagesArrived = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
        self.pumpWakeups = AsyncStream.makeStream(bufferingPolicy: .bufferingNewest(1))
    }

    // MARK: Called by the connection's dispatcher, on its event loop

    /// A MESSAGE arrived. Beyond ``maxInbox`` messages or the byte budget waiting, it is not
    /// taken: the client sends it again after its retransmission timeout. A full inbox is
    /// logged once when it starts dropping and once when it takes messages again.
    func receive(_ message: Frame.Message) {
        let size = message.body.readableBytes
        let (accepted, dropped): (Bool, Int) = self.state.withLockedValue { state in
            guard state.inbox.count < Self.maxInbox, state.bytes + size <= self.byteBudget || state.bytes == 0 else {
                state.dropped += 1
                return (false, state.dropped)
            }
            state.inbox.append(Received(message: message, receivedAt: .now))
            state.bytes += size
            defer { state.dropped = 0 }
            return (true, state.dropped)
        }
        if !accepted, self.answers {
            self.outbound.send(.messageAck(.init(entries: [.init(id: message.id, status: .unavailable)])))
        }
        if accepted {
            if dropped > 0 {
                self.logger.info("reliable messages are taken again", metadata: ["dropped": "\(dropped)"])
            }
            self.messagesArrived.continuation.yield()
        } else if dropped == 1 {
            self.logger.warning(
                "too many reliable messages waiting; dropping them until the handlers catch up (the client sends them again)",
                metadata: ["limit-bytes": "\(self.byteBudget)", "limit-messages": "\(Self.maxInbox)"]
            )
        }
    }

    /// A DELIVERY_ACK arrived.
    func acknowledged(upTo sequence: UInt64) {
        self.state.withLockedValue { state in state.pendingAck = max(state.pendingAck ?? 0, sequence) }
        self.pumpWakeups.continuation.yield()
    }

    /// The connection is closing: both loops end.
    func finish() {
        let first = self.state.withLockedValue { state in
            defer { state.finished = true }
            return !state.finished
        }
        guard first else { return }
        self.services.outboxLanes.checkIn(self.outbox)
        self.messagesArrived.continuation.finish()
        self.pumpWakeups.continuation.finish()
    }

    // MARK: Processing the client's messages

    /// Processes the messages as they arrive, until ``finish()``. Must not be cancelled while
    /// a batch is under way (see `GatewayConnectionHandler`).
    func runProcessor() async {
        for await _ in self.messagesArrived.stream {
            while true {
                let batch: [Received] = self.state.withLockedValue { state in
                    // After the connection closed, acknowledgements cannot be sent: the client
                    // sends what is left again.
                    guard !state.finished else { return [] }
                    var batch: [Received] = []
                    while batch.count < Self.maxBatch, let next = state.inbox.popFirst() { batch.append(next) }
                    return batch
                }
                guard !batch.isEmpty else { break }
                defer {
                    let size = batch.reduce(0) { $0 + $1.message.body.readableBytes }
                    self.state.withLockedValue { $0.bytes -= size }
                }
                do {
                    try await self.services.outboxLanes.exclusively(self.outbox) { lane in
                        await self.process(batch, lastProcessed: &lane.lastProcessed)
                    }
                } catch {
                    break
                }
            }
        }
    }

    private func process(_ batch: [Received], lastProcessed: inout [String: UInt64]) async {
        var processed: [ProcessedMessage] = []
        var processedAcks: [Frame.MessageAck.Entry] = []
        var duplicateAcks: [Frame.MessageAck.Entry] = []
        /// `unavailable` answers to messages not taken now, with the answers feature.
        var notTaken: [Frame.MessageAck.Entry] = []
        func notTakenNow(_ message: Frame.Message) {
            if self.answers { notTaken.append(.init(id: message.id, status: .unavailable)) }
        }
        var staged: [NewDelivery] = []
        var tentative = lastProcessed
        /// The messages processed in this batch, by conversation and sequence: their ids and outcomes.
        var inBatch: [String: [UInt64: (id: UInt64, status: StatusCode)]] = [:]
        var blocked: Set<String> = []
        var quotas = RecipientQuotas(limits: self.services.configuration.limits, store: self.store)
        let outbox = self.outbox

        for received in batch {
            let message = received.message
            guard !blocked.contains(message.conversation) else {
                notTakenNow(message)
                continue
            }
            let last: UInt64
            if let known = tentative[message.conversation] {
                last = known
            } else {
                do {
                    last = try await self.store.lastProcessed(outbox, conversation: message.conversation)
                } catch {
                    self.logger.error("cannot read the message store", metadata: ["error": "\(error)"])
                    blocked.insert(message.conversation)
                    continue
                }
                tentative[message.conversation] = last
            }
            if message.sequence <= last {
                // Processed already. The same message again (a retransmission) gets the outcome
                // it had, without running the handler again; another message claiming its
                // sequence (a conflicting duplicate, PROTOCOL.md 9.1) is refused for good.
                if let earlier = inBatch[message.conversation]?[message.sequence] {
                    // Processed in this batch, not committed yet: its answer waits for the commit.
                    if earlier.id == message.id {
                        processedAcks.append(.init(id: message.id, status: earlier.status))
                    } else {
                        duplicateAcks.append(self.conflict(message, with: earlier.id))
                    }
                    continue
                }
                do {
                    let recorded = try await self.store.recordedOutcome(
                        outbox,
                        conversation: message.conversation,
                        sequence: message.sequence
                    )
                    if let earlierID = recorded?.messageID, earlierID != message.id {
                        duplicateAcks.append(self.conflict(message, with: earlierID))
                    } else {
                        duplicateAcks.append(.init(id: message.id, status: recorded?.status ?? .ok))
                    }
                } catch {
                    self.logger.error("cannot read the message store", metadata: ["error": "\(error)"])
                    notTakenNow(message)
                }
                continue
            }
            guard message.sequence == last + 1 else {
                // An earlier message is missing; the client's retransmission fills the gap.
                notTakenNow(message)
                continue
            }
            let stagedBefore = staged.count
            guard var status = await self.run(received, staging: &staged) else {
                blocked.insert(message.conversation)  // transient failure: no ack, later messages wait
                notTakenNow(message)
                continue
            }
            if staged.count > stagedBefore {
                switch await quotas.admit(staged[stagedBefore...]) {
                case .admitted:
                    break
                case .over(let refusal):
                    // The handler's deliveries are not stored; the sender learns it for good.
                    staged.removeSubrange(stagedBefore...)
                    status = .resourceExhausted
                    self.services.refusalLog.log(
                        self.logger,
                        .warning,
                        "a recipient's store quota is full",
                        metadata: ["reason": "\(refusal)"]
                    )
                case .unavailable(let error):
                    staged.removeSubrange(stagedBefore...)
                    self.logger.error("cannot read the message store", metadata: ["error": "\(error)"])
                    blocked.insert(message.conversation)
                    notTakenNow(message)
                    continue
                }
            }
            tentative[message.conversation] = message.sequence
            inBatch[message.conversation, default: [:]][message.sequence] = (message.id, status)
            processed.append(
                ProcessedMessage(
                    outbox: outbox,
                    conversation: message.conversation,
                    sequence: message.sequence,
                    status: status,
                    messageID: message.id
                )
            )
            processedAcks.append(.init(id: message.id, status: status))
        }

        var acks = duplicateAcks + notTaken
        if !processed.isEmpty {
            do {
                let receipts = try await self.store.commit(processed: processed, deliveries: staged)
                lastProcessed = tentative
                acks += processedAcks
                self.services.deliveryNotifier.notify(receipts.map(\.recipient))
            } catch {
                // A conflict (another connection of this outbox got there first) or a storage
                // failure: nothing was written; the client sends the messages again.
                self.logger.warning("could not commit reliable messages", metadata: ["error": "\(error)"])
                lastProcessed.removeAll()
                if self.answers { acks += processedAcks.map { .init(id: $0.id, status: .unavailable) } }
            }
        }
        if !acks.isEmpty {
            // Not awaited: the next batch need not wait for this one's MESSAGE_ACK to reach the
            // socket. What is acknowledged is committed; a lost ACK makes the client send again.
            self.outbound.send(.messageAck(.init(entries: acks)))
        }
    }

    /// The answer to a conflicting duplicate: `message` claims a sequence that the message
    /// `earlierID` had. Refused for good (`invalid request`): the client's outbox reused a
    /// sequence, which the gateway cannot process without losing one of the two messages.
    private func conflict(_ message: Frame.Message, with earlierID: UInt64) -> Frame.MessageAck.Entry {
        self.services.refusalLog.log(
            self.logger,
            .warning,
            "refusing a message whose sequence another message already had",
            metadata: [
                "conversation": "\(message.conversation)", "sequence": "\(message.sequence)",
                "message": "\(message.id)", "earlier": "\(earlierID)",
            ]
        )
        return .init(id: message.id, status: .invalidRequest)
    }

    /// Runs the handler of one message.
    /// - Returns: The outcome to record, or `nil` after a transient failure (not to record).
    private func run(_ received: Received, staging staged: inout [NewDelivery]) async -> StatusCode? {
        let message = received.message
        if message.expired {
            return .deadlineExceeded  // the client gave up on it; record it so the conversation moves on
        }
        if let ttl = message.ttl, received.receivedAt + ttl <= .now {
            return .deadlineExceeded
        }
        guard self.services.router.permits(.send(topic: message.topic), self.connection) else {
            return .permissionDenied  // a final refusal, recorded like a handler's
        }
        guard let handler = self.services.router.messageHandler(message.topic) else {
            return .unknownMethod
        }
        let context = MessageContext(connection: self.connection, base: self.logger, message: message, gateway: self.services.gateway)
        let reliableMessage = ReliableMessage(
            id: message.id,
            topic: message.topic,
            conversation: message.conversation,
            sequence: message.sequence,
            body: message.body
        )
        // In a task of its own, so that the time limit's cancellation ends the handler, not the
        // processor; the connection's timer holds it to the limit.
        let outcome: Result<Void, any Error> =
            await self.outbound.withTimeLimit(executor: self.executor) { () async -> Result<Void, any Error> in
                do {
                    try await handler(reliableMessage, context)
                    return .success(())
                } catch {
                    return .failure(error)
                }
            } ?? .failure(HandlerTimeout(limit: self.services.configuration.timeouts.handler))
        switch outcome {
        case .success:
            staged += context.takeStaged()
            return .ok
        case .failure(let error as RequestError) where error.status == .unavailable:
            // "Not now": a transient failure, not an outcome to record.
            context.logger.info("message handler answered unavailable; the client will send the message again")
            return nil
        case .failure(let error as RequestError):
            return error.status == .ok ? .internalError : error.status
        case .failure(let error):
            context.logger.error("message handler failed; the client will send the message again", metadata: ["error": "\(error)"])
            return nil
        }
    }

    // MARK: Pumping deliveries

    func runPump(from resume: UInt64) async {
        let recipient = self.connection.clientID
        let token = self.services.deliveryNotifier.register(self.pumpWakeups.continuation, for: recipient)
        defer { self.services.deliveryNotifier.unregister(token, recipient: recipient) }
        let window = UInt64(self.services.deliveryWindow)
        var lastSent = resume  // the client has everything up to its resume point
        var clientHas = resume  // acknowledged by the client: bounds the window
        var recorded: UInt64 = 0  // acknowledged in the store
        var wakeups = self.pumpWakeups.stream.makeAsyncIterator()
        // What the client already has may still be stored (its last acknowledgement was lost).
        if resume > 0 { self.acknowledged(upTo: resume) }

        while !Task.isCancelled {
            if let ack = self.state.withLockedValue({ state -> UInt64? in
                defer { state.pendingAck = nil }
                return state.pendingAck
            }) {
                let upTo = min(ack, lastSent)  // it cannot have what was not sent
                clientHas = max(clientHas, upTo)
                if upTo > recorded {
                    do {
                        try await self.store.acknowledge(recipient: recipient, upTo: upTo)
                        recorded = upTo
                    } catch {
                        if Task.isCancelled { return }  // the connection closed; the client's next one acknowledges again
                        self.logger.error("cannot record a delivery acknowledgement", metadata: ["error": "\(error)"])
                    }
                }
            }
            let inFlight = lastSent - clientHas
            if inFlight < window {
                do {
                    let batch = try await self.store.deliveries(for: recipient, after: lastSent, limit: Int(min(window - inFlight, 128)))
                    if let last = batch.last {
                        try await self.outbound.write(
                            contentsOf: batch.map { .delivery(.init(sequence: $0.sequence, topic: $0.topic, body: $0.body)) }
                        )
                        lastSent = last.sequence
                        continue
                    }
                } catch let error as MessageStoreError {
                    if Task.isCancelled { return }  // the connection closed
                    self.logger.error("cannot read deliveries; retrying", metadata: ["error": "\(error)"])
                    try? await Task.sleep(for: .seconds(1))
                    continue
                } catch {
                    return  // the connection is gone
                }
            }
            guard await wakeups.next() != nil else { return }
        }
    }
}

struct HandlerTimeout: Error, CustomStringConvertible {
    var limit: Duration
    var description: String { "the handler did not finish within \(self.limit.shortDescription)" }
}

/// The deliveries each recipient may have waiting in the store, checked as a batch stages
/// them: the stored count and bytes (read once per recipient and batch) plus what the batch
/// staged so far. Batches of different outboxes run at once, so a recipient may pass its quota
/// by what those batches stage together; never by more.
struct RecipientQuotas {
    enum Outcome {
        case admitted
        /// Over the quota: why.
        case over(String)
        /// The store could not say.
        case unavailable(any Error)
    }

    let limits: GatewayConfiguration.Limits
    let store: any MessageStore
    private var usage: [String: StreamUsage] = [:]

    init(limits: GatewayConfiguration.Limits, store: any MessageStore) {
        self.limits = limits
        self.store = store
    }

    /// Counts one message's deliveries if they all fit; otherwise counts none of them.
    mutating func admit(_ deliveries: some Collection<NewDelivery>) async -> Outcome {
        var after = self.usage
        for delivery in deliveries {
            var usage: StreamUsage
            if let known = after[delivery.recipient] {
                usage = known
            } else {
                do {
                    usage = try await self.store.usage(of: delivery.recipient)
                } catch {
                    return .unavailable(error)
                }
                self.usage[delivery.recipient] = usage
            }
            usage.deliveries += 1
            usage.bytes += delivery.body.readableBytes
            if usage.deliveries > self.limits.maxDeliveriesPerRecipient {
                return .over("'\(delivery.recipient)' has \(self.limits.maxDeliveriesPerRecipient) deliveries waiting")
            }
            if usage.bytes > self.limits.maxDeliveryBytesPerRecipient {
                return .over("'\(delivery.recipient)' has over \(self.limits.maxDeliveryBytesPerRecipient) bytes of deliveries waiting")
            }
            after[delivery.recipient] = usage
        }
        self.usage = after
        return .admitted
    }
}
