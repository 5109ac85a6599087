import NIOCore

/// The reliable messages one gateway connection received and has not handed to its lane yet
/// (PROTOCOL.md, section 9.1), and the pace at which it hands them over.
///
/// Messages are taken in batches, one batch at a time. Over `messagesPerSecond`, a batch holds
/// only the tokens the rate has, and waits until the rate has a quantum's worth (a twentieth of a
/// second's, ``quantum``) or as many as wait: a client that sends faster than its limit is
/// **paced**, not refused, and gets the limit's rate without a retransmission, in batches of a
/// quantum rather than one per token. Its window of messages in flight bounds what
/// waits here; should a client send more than `maxMessages` or `maxBytes` anyway, the connection
/// stops reading (``holdsReads``) until batches make room, and TCP slows the client.
///
/// A retransmission of a message still waiting here is dropped: its first copy is answered.
///
/// ```swift
/// if let batch = inbox.received(message, now: now) { startBatch(batch) }
/// // … the lane processed it …
/// if let next = inbox.batchEnded(now: now) { startBatch(next) }
/// ```
package struct MessageInbox: Sendable {
    package struct Limits: Sendable, Hashable {
        /// Messages waiting before reading stops.
        package var maxMessages: Int
        /// Body bytes waiting (the batch being processed included) before reading stops.
        package var maxBytes: Int
        /// Messages in one batch (one transaction, one MESSAGE_ACK).
        package var maxBatch: Int
        /// The pace; `nil` for none.
        package var messagesPerSecond: Int?

        package init(maxMessages: Int = 4096, maxBytes: Int, maxBatch: Int = 256, messagesPerSecond: Int? = nil) {
            self.maxMessages = maxMessages
            self.maxBytes = maxBytes
            self.maxBatch = maxBatch
            self.messagesPerSecond = messagesPerSecond
        }
    }

    package let limits: Limits
    /// Made on first use and dropped when empty: an idle connection holds no buffer.
    private var queue: CircularBuffer<ReliableLaneMachine.Received>?
    private var queued: Set<UInt64> = []
    /// Body bytes waiting and in the batch being processed.
    private var bytes = 0
    /// The body bytes of the batch being processed, if one is.
    private var processing: Int?
    private var rate: TokenBucket?

    package init(limits: Limits, now: TetherInstant) {
        self.limits = limits
        self.rate = limits.messagesPerSecond.map { TokenBucket(perSecond: $0, now: now) }
    }

    /// The tokens a paced batch waits for: a twentieth of a second's worth (at least one). A
    /// batch costs a transaction, a MESSAGE_ACK and the recipient's checkpoint whatever its size,
    /// so a paced sender's messages wait up to 50 ms longer in exchange for batches that cost
    /// little more per message than unpaced ones (BENCHMARKS.md, "Issue 41, third part").
    package var quantum: Int { self.rate.map { max(1, $0.perSecond / 20) } ?? 1 }

    /// Messages waiting.
    package var count: Int { self.queue?.count ?? 0 }

    /// The body bytes of the messages waiting.
    package var byteCount: Int { self.bytes }

    /// Whether a batch is being processed.
    package var isProcessing: Bool { self.processing != nil }

    /// Whether the connection must stop reading: the inbox is at its limits.
    package var holdsReads: Bool {
        self.count >= self.limits.maxMessages || self.bytes >= self.limits.maxBytes
    }

    /// When the next batch may start for lack of tokens now (messages wait, none is processed).
    package mutating func nextDeadline(now: TetherInstant) -> TetherInstant? {
        guard self.processing == nil, self.count > 0, self.rate != nil else { return nil }
        return self.rate!.nextTokens(min(self.count, self.limits.maxBatch, self.quantum), now: now)
    }

    /// A MESSAGE arrived.
    /// - Returns: A batch to process now, if none is being processed and the rate allows.
    package mutating func received(_ message: Frame.Message, now: TetherInstant) -> [ReliableLaneMachine.Received]? {
        guard self.queued.insert(message.id).inserted else { return nil }  // a retransmission of one waiting
        if self.queue == nil { self.queue = CircularBuffer(initialCapacity: 16) }
        self.queue!.append(ReliableLaneMachine.Received(message, receivedAt: now))
        self.bytes += message.body.readableBytes
        return self.takeBatch(now: now)
    }

    /// The batch handed out last is done.
    /// - Returns: The next batch, if messages wait and the rate allows.
    package mutating func batchEnded(now: TetherInstant) -> [ReliableLaneMachine.Received]? {
        if let size = self.processing { self.bytes -= size }
        self.processing = nil
        return self.takeBatch(now: now)
    }

    /// The timer fired: tokens may be back.
    package mutating func timerFired(now: TetherInstant) -> [ReliableLaneMachine.Received]? {
        self.takeBatch(now: now)
    }

    private mutating func takeBatch(now: TetherInstant) -> [ReliableLaneMachine.Received]? {
        guard self.processing == nil, let available = self.queue?.count, available > 0 else { return nil }
        var count = min(available, self.limits.maxBatch)
        if self.rate != nil {
            // Paced: a batch waits for a quantum's worth of tokens (or for as many as wait, if
            // fewer). Taking what trickled in while the last batch ran would make batches of
            // one or two, each paying a transaction, a MESSAGE_ACK and the recipient's
            // checkpoint: a sender over its rate would cost several times what it is allowed.
            guard self.rate!.available(now: now) >= min(count, self.quantum) else { return nil }
            count = self.rate!.take(count, now: now)
        }
        guard count > 0 else { return nil }
        var batch: [ReliableLaneMachine.Received] = []
        batch.reserveCapacity(count)
        var size = 0
        for _ in 0..<count {
            let received = self.queue!.removeFirst()
            self.queued.remove(received.message.id)
            size += received.message.body.readableBytes
            batch.append(received)
        }
        if self.queue!.isEmpty { self.queue = nil }
        self.processing = size
        return batch
    }

    /// The connection closed: what waits is dropped (the client sends it again).
    package mutating func close() {
        self.queue = nil
        self.queued = []
        self.bytes = self.processing ?? 0
    }
}
