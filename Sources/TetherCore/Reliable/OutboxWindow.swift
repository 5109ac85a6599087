import NIOCore

/// The window of reliable messages on one connection: which message it sends next, which are
/// in flight, which to send again (PROTOCOL.md, section 9.1).
///
/// - A conversation's messages leave in sequence order: the lanes hold conversations, and a
///   conversation offers only its first unsent message.
/// - Priority lanes: the head messages of the high lane go before those of the normal lane,
///   which go before the low lane; conversations within a lane take turns.
/// - At most `window` messages are unacknowledged at once.
///
/// It performs no I/O and reads no clock; the client's connection machine embeds it, sends what
/// it returns and tells it about acknowledgements and timeouts.
package struct OutboxWindow: Sendable {
    package struct InFlight: Sendable {
        package var record: OutboxRecord
        package var sentAt: TetherInstant
        /// How often it was sent on this connection; 1 means its acknowledgement measures the RTT.
        package var transmissions: Int
    }

    package let window: Int
    /// Per priority, conversations whose first unsent message has that priority, oldest first.
    /// An entry whose generation is out of date is skipped (the conversation moved).
    private var lanes: [CircularBuffer<(conversation: String, generation: Int)>] = Array(repeating: [], count: 3)
    /// Unsent messages per conversation.
    private var queues: [String: ConversationQueue] = [:]
    /// The lane and generation under which each waiting conversation is filed.
    private var filed: [String: (lane: Int, generation: Int)] = [:]
    private var nextGeneration = 0
    package private(set) var inFlight: [UInt64: InFlight] = [:]
    /// How often each message was sent, kept while it is queued again after a timeout.
    private var transmissions: [UInt64: Int] = [:]
    /// The last conversation queue that emptied, kept (with its storage) for the next
    /// conversation that needs one: a message sent alone would otherwise allocate a queue.
    private var spareQueue: ConversationQueue?

    package init(window: Int) {
        self.window = max(1, window)
    }

    /// The number of messages waiting to be sent.
    package var queuedCount: Int { self.queues.values.reduce(0) { $0 + $1.count } }

    /// Whether a message could be sent now.
    package var canSend: Bool { self.inFlight.count < self.window && !self.queues.isEmpty }

    /// Adds messages to send; each goes after the messages of its conversation with a lower sequence.
    package mutating func enqueue<Records: Sequence<OutboxRecord>>(_ records: Records) {
        for record in records where self.inFlight[record.id] == nil {
            self.insert(record)
        }
    }

    /// The next message to send, marked in flight; `nil` if none or the window is full.
    package mutating func next(now: TetherInstant) -> OutboxRecord? {
        guard self.inFlight.count < self.window else { return nil }
        for lane in self.lanes.indices {
            while let entry = self.lanes[lane].popFirst() {
                guard let filed = self.filed[entry.conversation], filed.lane == lane, filed.generation == entry.generation else {
                    continue  // stale: the conversation moved
                }
                // Taken out and put back (updateValue, removeValue) rather than mutated through
                // the subscript, whose modify accessor allocates its coroutine frame.
                guard var queue = self.queues.removeValue(forKey: entry.conversation) else { continue }
                guard let record = queue.popFirst() else {
                    self.queues.updateValue(queue, forKey: entry.conversation)
                    continue
                }
                self.filed.removeValue(forKey: entry.conversation)
                if let head = queue.first {
                    self.queues.updateValue(queue, forKey: entry.conversation)
                    self.file(entry.conversation, head: head)
                } else if queue.isSmall {
                    self.spareQueue = queue
                }
                let sent = (self.transmissions.removeValue(forKey: record.id) ?? 0) + 1
                self.inFlight.updateValue(InFlight(record: record, sentAt: now, transmissions: sent), forKey: record.id)
                return record
            }
        }
        return nil
    }

    /// An acknowledgement arrived.
    /// - Returns: The acknowledged message, and a round-trip sample if it was sent only once.
    package mutating func acknowledged(_ id: UInt64, now: TetherInstant) -> (record: OutboxRecord, sample: Duration?)? {
        if let inFlight = self.inFlight.removeValue(forKey: id) {
            return (inFlight.record, inFlight.transmissions == 1 ? now - inFlight.sentAt : nil)
        }
        // Acknowledged while queued for a retransmission (only those can be: the others were
        // never sent on this connection).
        guard self.transmissions.removeValue(forKey: id) != nil else { return nil }
        for (conversation, var queue) in self.queues {
            guard let (record, wasHead) = queue.removeRetry(id) else { continue }
            if let head = queue.first {
                self.queues[conversation] = queue
                if wasHead { self.file(conversation, head: head) }
            } else {
                self.queues[conversation] = nil
                self.filed[conversation] = nil
            }
            return (record, nil)
        }
        return nil
    }

    /// A message's acknowledgement did not come in time: queue it to be sent again.
    /// - Returns: How often it was sent so far, or `nil` if it is not in flight.
    @discardableResult
    package mutating func timedOut(_ id: UInt64) -> Int? {
        guard let inFlight = self.inFlight.removeValue(forKey: id) else { return nil }
        self.transmissions[id] = inFlight.transmissions
        self.insert(inFlight.record)
        return inFlight.transmissions
    }

    /// The message expired: from now on its tombstone is sent instead.
    package mutating func replace(with tombstone: OutboxRecord) {
        if self.inFlight[tombstone.id] != nil {
            self.inFlight[tombstone.id]?.record = tombstone
            return
        }
        self.queues[tombstone.conversation]?.replace(with: tombstone)
    }

    private mutating func insert(_ record: OutboxRecord) {
        var queue = self.queues.removeValue(forKey: record.conversation) ?? self.takeSpareQueue()
        let head = queue.first?.id
        queue.insert(record)
        if let first = queue.first, first.id != head { self.file(record.conversation, head: first) }
        self.queues.updateValue(queue, forKey: record.conversation)
    }

    private mutating func takeSpareQueue() -> ConversationQueue {
        guard let spare = self.spareQueue else { return ConversationQueue() }
        self.spareQueue = nil
        return spare
    }

    /// Files a conversation in the lane of its first message (moving it if needed).
    private mutating func file(_ conversation: String, head: OutboxRecord) {
        let lane = Int(head.priority.rawValue)
        if let current = self.filed[conversation], current.lane == lane { return }
        let generation = self.nextGeneration
        self.nextGeneration += 1
        self.filed.updateValue((lane, generation), forKey: conversation)
        self.lanes[lane].append((conversation, generation))
    }
}

/// The unsent messages of one conversation, in sequence order, as two parts: messages to send
/// again after a timeout (at most a window's worth), then messages never sent on this
/// connection. Every retry has a lower sequence than every fresh message, because messages
/// leave in sequence order; so new messages append and retries insert into a short list, and
/// neither moves the (possibly long) fresh queue.
private struct ConversationQueue {
    private var retries: [OutboxRecord] = []
    private var fresh = CircularBuffer<OutboxRecord>()

    var first: OutboxRecord? { self.retries.first ?? self.fresh.first }
    /// Whether its storage is small enough to keep for another conversation.
    var isSmall: Bool { self.fresh.capacity <= 64 && self.retries.capacity <= 16 }
    var count: Int { self.retries.count + self.fresh.count }

    mutating func popFirst() -> OutboxRecord? {
        self.retries.isEmpty ? self.fresh.popFirst() : self.retries.removeFirst()
    }

    /// Inserts in sequence order; a message already queued is not queued twice.
    mutating func insert(_ record: OutboxRecord) {
        if let last = self.fresh.last, record.sequence > last.sequence {
            self.fresh.append(record)  // the common case: a new message
        } else if let first = self.fresh.first, record.sequence >= first.sequence {
            let index = self.freshIndex(of: record.sequence)
            if index != self.fresh.endIndex, self.fresh[index].id == record.id { return }
            self.fresh.insert(record, at: index)  // unusual: out of order
        } else if self.fresh.isEmpty, record.sequence > (self.retries.last?.sequence ?? 0) {
            self.fresh.append(record)
        } else {
            let index = self.retries.firstIndex { $0.sequence >= record.sequence } ?? self.retries.endIndex
            if index != self.retries.endIndex, self.retries[index].id == record.id { return }
            self.retries.insert(record, at: index)
        }
    }

    /// Removes a message queued for a retransmission; reports whether it was the first.
    mutating func removeRetry(_ id: UInt64) -> (record: OutboxRecord, wasHead: Bool)? {
        guard let index = self.retries.firstIndex(where: { $0.id == id }) else { return nil }
        return (self.retries.remove(at: index), index == 0)
    }

    mutating func replace(with tombstone: OutboxRecord) {
        if let index = self.retries.firstIndex(where: { $0.id == tombstone.id }) {
            self.retries[index] = tombstone
            return
        }
        let index = self.freshIndex(of: tombstone.sequence)
        if index != self.fresh.endIndex, self.fresh[index].id == tombstone.id { self.fresh[index] = tombstone }
    }

    /// The index of the first fresh message with a sequence at least `sequence` (binary search).
    private func freshIndex(of sequence: UInt64) -> CircularBuffer<OutboxRecord>.Index {
        var low = self.fresh.startIndex
        var count = self.fresh.count
        while count > 0 {
            let half = count / 2
            let middle = self.fresh.index(low, offsetBy: half)
            if self.fresh[middle].sequence < sequence {
                low = self.fresh.index(after: middle)
                count -= half + 1
            } else {
                count = half
            }
        }
        return low
    }
}
