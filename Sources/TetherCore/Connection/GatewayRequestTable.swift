import NIOCore

/// The requests of one gateway connection, from the moment each is read until it is answered,
/// cancelled, or the connection closes: each is answered at most once.
///
/// - **Deadlines.** A request's deadline is the client's timeout, capped by the handler time
///   limit; past it the request is answered `deadline exceeded` (and its handler cancelled).
/// - **Handler slots.** At most `maxRunning` task handlers run at once (the limit WELCOME
///   announces); beyond, requests wait for a slot, in order.
/// - **Pacing.** Over `requestsPerSecond`, requests wait for the rate's next token instead of
///   being refused: the client gets the rate, not errors.
/// - **Backpressure.** Once `maxWaiting` requests wait (for a slot or a token), the connection
///   stops reading: the client is slowed by TCP, its PINGs and CANCELs wait on the wire too,
///   and nothing is refused.
///
/// A request answered at once (an inline handler, an unknown method) costs one lookup: it enters
/// the table only if it waits or runs in a task.
package struct GatewayRequestTable: Sendable {
    package struct Limits: Sendable, Hashable {
        /// The longest a handler may take, whatever the client's timeout.
        package var handlerTimeout: Duration
        /// Task handlers that may run at once.
        package var maxRunning: Int
        /// Requests that may wait (for a slot or a token) before reading stops.
        package var maxWaiting: Int
        /// The pace of requests; `nil` for none.
        package var requestsPerSecond: Int?

        package init(handlerTimeout: Duration, maxRunning: Int, maxWaiting: Int, requestsPerSecond: Int? = nil) {
            self.handlerTimeout = handlerTimeout
            self.maxRunning = maxRunning
            self.maxWaiting = maxWaiting
            self.requestsPerSecond = requestsPerSecond
        }
    }

    /// Where a request in the table is.
    private enum Place {
        /// Waiting for a token (paced).
        case paced
        /// Waiting for a handler slot.
        case waiting
        /// Its handler runs in a task.
        case running
    }

    package let limits: Limits
    /// The method of each request in the table (read, not answered), and where it is.
    private var methods: [UInt64: (method: String, place: Place)] = [:]
    /// Requests waiting for a slot or a token, not settled (the buffers may hold settled ones).
    private var waitingCount = 0
    private var deadlines = DeadlineQueue<UInt64, TetherInstant>()
    /// Requests over the rate, waiting for a token; not routed yet. Made on first use.
    private var paced: CircularBuffer<Frame.Request>?
    /// Requests routed to a task handler, waiting for a slot. Made on first use.
    private var waiting: CircularBuffer<Frame.Request>?
    private var rate: TokenBucket?
    /// Task handlers running.
    package private(set) var running = 0

    package init(limits: Limits, now: TetherInstant) {
        self.limits = limits
        self.rate = limits.requestsPerSecond.map { TokenBucket(perSecond: $0, now: now) }
    }

    /// Requests in the table: waiting, paced or running in a task.
    package var count: Int { self.methods.count }

    /// Whether request `id` is in the table (read, not answered).
    package func contains(_ id: UInt64) -> Bool { self.methods[id] != nil }

    /// Whether the connection must stop reading: too many requests wait.
    package var holdsReads: Bool {
        self.waitingCount >= self.limits.maxWaiting
    }

    /// When the table needs the timer: its earliest deadline, or the next token if a request
    /// waits for one.
    package mutating func nextDeadline(now: TetherInstant) -> TetherInstant? {
        let deadline = self.deadlines.earliest
        guard let waiting = self.paced?.count, waiting > 0, self.rate != nil else { return deadline }
        let token = self.rate!.nextTokens(min(waiting, self.rate!.pacingQuantum), now: now)
        return min(deadline ?? token, token)
    }

    // MARK: Events

    /// What to do with a request just read.
    package enum OnRequest: Sendable, Hashable {
        /// Route it now; its timeout is the effective one.
        case route(Frame.Request)
        /// It waits for the rate's next token (``timerFired(now:)`` releases it).
        case paced
        /// Its id is already in flight: a protocol violation.
        case duplicate
    }

    /// A REQUEST was read.
    package mutating func received(_ request: Frame.Request, now: TetherInstant) -> OnRequest {
        guard self.methods[request.id] == nil else { return .duplicate }
        var request = request
        let timeout = request.timeout.map { min($0, self.limits.handlerTimeout) } ?? self.limits.handlerTimeout
        request.timeout = timeout
        if self.rate != nil, self.paced?.isEmpty == false || !self.rate!.take(now: now) {
            if self.paced == nil { self.paced = CircularBuffer(initialCapacity: 4) }
            self.paced!.append(request)
            self.enter(request, deadline: now + timeout, place: .paced)
            self.waitingCount += 1
            return .paced
        }
        return .route(request)
    }

    private mutating func enter(_ request: Frame.Request, deadline: TetherInstant, place: Place) {
        self.methods.updateValue((request.method, place), forKey: request.id)
        self.deadlines.insert(request.id, deadline: deadline)
    }

    /// Forgets a settled request.
    /// - Returns: Its method, if it was in the table.
    private mutating func remove(_ id: UInt64) -> String? {
        guard let entry = self.methods.removeValue(forKey: id) else { return nil }
        if entry.place != .running { self.waitingCount -= 1 }
        return entry.method
    }

    /// What to do with a request routed to a task handler.
    package enum OnHandlerNeeded: Sendable, Hashable {
        /// Start its task now (its slot is taken).
        case start
        /// It waits for a slot.
        case queued
    }

    /// A routed request needs a task for its handler.
    package mutating func handlerNeeded(_ request: Frame.Request, now: TetherInstant) -> OnHandlerNeeded {
        let starts = self.running < self.limits.maxRunning
        let place: Place = starts ? .running : .waiting
        // Set with updateValue, not through the subscript's modify accessor, whose coroutine
        // frame is allocated on the heap when it is not inlined.
        if let entry = self.methods[request.id] {
            if entry.place == .paced { self.waitingCount -= 1 }  // released by its token
            self.methods.updateValue((entry.method, place), forKey: request.id)
        } else {
            self.enter(request, deadline: now + (request.timeout ?? self.limits.handlerTimeout), place: place)
        }
        if starts {
            self.running += 1
            return .start
        }
        if self.waiting == nil { self.waiting = CircularBuffer(initialCapacity: 4) }
        self.waiting!.append(request)
        self.waitingCount += 1
        return .queued
    }

    /// A request is answered now (its handler's reply, or a refusal).
    /// - Returns: Whether to write the answer: `false` if the request was settled already
    ///   (its deadline passed, or it was cancelled).
    package mutating func answered(_ id: UInt64, routedDirectly: Bool = false) -> Bool {
        guard self.remove(id) != nil else { return routedDirectly }
        self.deadlines.remove(id)
        return true
    }

    /// A CANCEL arrived.
    /// - Returns: Whether the request was in the table (its task, if any, is to be cancelled).
    package mutating func cancel(_ id: UInt64) -> Bool {
        guard self.remove(id) != nil else { return false }
        self.deadlines.remove(id)
        return true
    }

    /// A task handler ended: its slot is free.
    /// - Returns: The waiting requests that may start now, in order (their slots are taken).
    package mutating func handlerEnded() -> [Frame.Request] {
        self.running -= 1
        var start: [Frame.Request] = []
        while self.running < self.limits.maxRunning, let next = self.waiting?.popFirst() {
            guard self.methods[next.id] != nil else { continue }  // settled while it waited
            self.running += 1
            self.waitingCount -= 1
            self.methods[next.id]?.place = .running
            start.append(next)
        }
        if self.waiting?.isEmpty == true { self.waiting = nil }
        return start
    }

    /// A request whose deadline passed.
    package struct Expired: Sendable, Hashable {
        package var id: UInt64
        package var method: String
    }

    /// What the timer found due.
    package struct Due: Sendable, Hashable {
        /// Requests past their deadline: answer `deadline exceeded`, cancel their tasks.
        package var expired: [Expired] = []
        /// Paced requests that got their token: route them, in order.
        package var released: [Frame.Request] = []
    }

    /// The timer fired at `now`.
    package mutating func timerFired(now: TetherInstant) -> Due {
        var due = Due()
        for id in self.deadlines.popExpired(at: now) {
            guard let method = self.remove(id) else { continue }
            due.expired.append(Expired(id: id, method: method))
        }
        if self.rate != nil, self.paced != nil {
            while let next = self.paced!.first {
                guard self.methods[next.id] != nil else {
                    _ = self.paced!.popFirst()  // expired or cancelled while it waited
                    continue
                }
                guard self.rate!.take(now: now) else { break }
                // Still counted as waiting until it is routed: then it runs, waits for a slot,
                // or is answered at once (``answered(_:routedDirectly:)``).
                due.released.append(self.paced!.removeFirst())
            }
            if self.paced!.isEmpty { self.paced = nil }
        }
        return due
    }

    /// The connection closed: every request in the table is settled.
    /// - Returns: Their ids (cancel their tasks).
    package mutating func closeAll() -> [UInt64] {
        let ids = Array(self.methods.keys)
        self.methods.removeAll()
        self.deadlines = DeadlineQueue()
        self.paced = nil
        self.waiting = nil
        self.waitingCount = 0
        return ids
    }
}
