/// The deliveries of one recipient's connection (PROTOCOL.md, section 9.2), with no I/O: which
/// to read from the store, which to send, which acknowledgements to write.
///
/// - At most `window` deliveries are sent and not acknowledged.
/// - Deliveries committed while the recipient is connected are **offered** to its pump; when
///   they follow what it sent, they go out from memory, without reading the store. Anything
///   else (a gap, a window that is full, a read already under way) is read from the store.
/// - The client's acknowledgements are written one at a time, the newest first: a write
///   that starts while another runs waits and takes the latest.
///
/// ```swift
/// var pump = DeliveryPump(resume: hello.resume ?? 0, window: 256)
/// perform(pump.start())              // read the store, record the resume point
/// perform(pump.fetched(deliveries))  // send them
/// perform(pump.acknowledged(upTo: 7))
/// ```
package struct DeliveryPump: Sendable, Hashable {
    /// What the driver does next; several at once.
    package struct Actions: Sendable, Hashable {
        /// Read up to `limit` deliveries after `after` from the store, then call ``fetched(_:limit:)``.
        package var fetch: (after: UInt64, limit: Int)?
        /// Send these deliveries, in order.
        package var send: [StoredDelivery] = []
        /// Whether the first of ``send`` follows deliveries that were acknowledged on another
        /// connection of the client id (the store forgot them): it goes with ACKED_ELSEWHERE.
        package var afterAcknowledged = false
        /// Write that every delivery up to this one is acknowledged, then call ``recordFinished(_:)``.
        package var record: UInt64?
        /// How many deliveries sent on this connection a DELIVERY_ACK acknowledged for the first
        /// time (for the metrics).
        package var newlyAcknowledged = 0

        package static func == (lhs: Actions, rhs: Actions) -> Bool {
            lhs.fetch?.after == rhs.fetch?.after && lhs.fetch?.limit == rhs.fetch?.limit && lhs.send == rhs.send
                && lhs.afterAcknowledged == rhs.afterAcknowledged && lhs.record == rhs.record
                && lhs.newlyAcknowledged == rhs.newlyAcknowledged
        }

        package func hash(into hasher: inout Hasher) {
            hasher.combine(self.fetch?.after)
            hasher.combine(self.fetch?.limit)
            hasher.combine(self.send)
            hasher.combine(self.afterAcknowledged)
            hasher.combine(self.record)
            hasher.combine(self.newlyAcknowledged)
        }
    }

    /// The most deliveries read in one go.
    package static let maxFetch = 128
    /// How long a failed read waits before the next.
    package static let retryDelay: Duration = .seconds(1)

    package let window: Int
    /// Whether the client takes ``Actions/afterAcknowledged`` (``Features/sharedDeliveries``).
    package let sharedDeliveries: Bool
    /// The last delivery sent (or that the client already had).
    package private(set) var lastSent: UInt64
    /// The last delivery the client acknowledged.
    package private(set) var acknowledged: UInt64
    /// The last acknowledgement written to the store.
    package private(set) var recorded: UInt64 = 0
    private var recording: UInt64?
    private var fetching = false
    /// Deliveries were offered while a read was under way: it may have missed them.
    private var offeredWhileFetching = false
    /// The store may hold deliveries after ``lastSent`` that were not sent.
    private var mayHaveMore = true
    /// When to read again after a failed read.
    package private(set) var retryAt: TetherInstant?
    /// Whether the connection takes more writes now: while the client does not read, nothing
    /// more is read from the store or sent.
    private var writable = true

    /// - Parameters:
    ///   - resume: The last delivery the client has (its HELLO's resume point in this store's
    ///     epoch, 0 otherwise).
    ///   - window: Deliveries sent and not acknowledged at most.
    ///   - sharedDeliveries: Whether the client negotiated ``Features/sharedDeliveries``: a
    ///     delivery that follows some acknowledged on another connection then says so (without
    ///     it, the client sees a gap).
    package init(resume: UInt64, window: Int, sharedDeliveries: Bool = false) {
        self.window = max(1, window)
        self.sharedDeliveries = sharedDeliveries
        self.lastSent = resume
        self.acknowledged = resume
    }

    private var inFlight: Int { Int(self.lastSent - self.acknowledged) }

    /// The connection is established: read what waits; record the resume point (what the
    /// client has may still be stored, its last acknowledgement lost).
    package mutating func start() -> Actions {
        var actions = self.fetchIfNeeded()
        if self.acknowledged > 0 { actions.record = self.recordIfNeeded() }
        return actions
    }

    /// The store returned what ``Actions/fetch`` asked for.
    package mutating func fetched(_ deliveries: [StoredDelivery], limit: Int) -> Actions {
        self.fetching = false
        let fresh = deliveries.filter { $0.sequence > self.lastSent }
        self.mayHaveMore = deliveries.count >= limit || self.offeredWhileFetching
        self.offeredWhileFetching = false
        var actions = Actions()
        if let first = fresh.first, let last = fresh.last {
            // The store keeps every delivery until it is acknowledged: those it no longer has
            // before the first were acknowledged, on another connection of the client id. They
            // are not in flight here.
            if first.sequence > self.lastSent + 1 {
                actions.afterAcknowledged = self.sharedDeliveries
                self.acknowledged = max(self.acknowledged, first.sequence - 1)
                self.recorded = max(self.recorded, first.sequence - 1)
            }
            self.lastSent = last.sequence
            actions.send = fresh
        }
        let next = self.fetchIfNeeded()
        actions.fetch = next.fetch
        return actions
    }

    /// The read failed: it is tried again after ``retryDelay``.
    package mutating func fetchFailed(now: TetherInstant) {
        self.fetching = false
        self.retryAt = now + Self.retryDelay
    }

    /// New deliveries were committed for this recipient.
    package mutating func offered(_ deliveries: [StoredDelivery]) -> Actions {
        guard let first = deliveries.first else { return Actions() }
        guard !self.fetching, !self.mayHaveMore, self.retryAt == nil, self.writable, first.sequence == self.lastSent + 1 else {
            if let last = deliveries.last, last.sequence > self.lastSent {
                self.mayHaveMore = true
                if self.fetching { self.offeredWhileFetching = true }
            }
            return self.fetchIfNeeded()
        }
        let room = max(0, self.window - self.inFlight)
        var actions = Actions()
        if room > 0 {
            actions.send = Array(deliveries.prefix(room))
            self.lastSent = actions.send.last!.sequence
        }
        if deliveries.count > room { self.mayHaveMore = true }  // the rest is read once the window opens
        return actions
    }

    /// Deliveries were appended for this recipient where their sequences are not known here (by
    /// another gateway sharing the store): read what follows what was sent.
    package mutating func appendedElsewhere() -> Actions {
        self.mayHaveMore = true
        if self.fetching { self.offeredWhileFetching = true }
        return self.fetchIfNeeded()
    }

    /// A DELIVERY_ACK arrived.
    package mutating func acknowledged(upTo sequence: UInt64) -> Actions {
        let upTo = min(sequence, self.lastSent)  // the client cannot have what was not sent
        guard upTo > self.acknowledged else { return Actions() }
        let newlyAcknowledged = Int(upTo - self.acknowledged)
        self.acknowledged = upTo
        var actions = self.fetchIfNeeded()
        actions.record = self.recordIfNeeded()
        actions.newlyAcknowledged = newlyAcknowledged
        return actions
    }

    /// The acknowledgement write finished.
    /// - Parameter succeeded: Whether it was stored; if not, the next acknowledgement tries again.
    package mutating func recordFinished(_ succeeded: Bool) -> Actions {
        if let recording, succeeded { self.recorded = max(self.recorded, recording) }
        self.recording = nil
        var actions = Actions()
        if succeeded { actions.record = self.recordIfNeeded() }
        return actions
    }

    /// The timer fired: a read that failed may be tried again.
    package mutating func timerFired(now: TetherInstant) -> Actions {
        guard let retryAt, now >= retryAt else { return Actions() }
        self.retryAt = nil
        self.mayHaveMore = true
        return self.fetchIfNeeded()
    }

    /// The connection's writability changed.
    package mutating func writabilityChanged(_ writable: Bool) -> Actions {
        self.writable = writable
        return self.fetchIfNeeded()
    }

    private mutating func fetchIfNeeded() -> Actions {
        guard self.mayHaveMore, !self.fetching, self.retryAt == nil, self.writable else { return Actions() }
        let room = self.window - self.inFlight
        guard room > 0 else { return Actions() }
        self.fetching = true
        var actions = Actions()
        actions.fetch = (self.lastSent, min(room, Self.maxFetch))
        return actions
    }

    private mutating func recordIfNeeded() -> UInt64? {
        guard self.recording == nil, self.acknowledged > self.recorded else { return nil }
        self.recording = self.acknowledged
        return self.acknowledged
    }
}
