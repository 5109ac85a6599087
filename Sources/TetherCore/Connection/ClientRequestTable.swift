import NIOCore

/// The requests of one client connection: each from the moment the client submits it until it
/// is answered, times out, is cancelled, or the connection ends; each ends exactly once.
///
/// No more are on the wire than the gateway's `max concurrent requests` (WELCOME); the others
/// wait here, in order, each under its own deadline. A request that waited never reached the
/// gateway: if the connection goes away it ends `not dispatched`, and the client sends it again
/// on its next connection.
///
/// Who waits for each request (a continuation, a callback) is the handler's: the table knows
/// ids, deadlines and the frames still to send.
package struct ClientRequestTable: Sendable {
    /// The deadline of every request in the table.
    private var deadlines = DeadlineQueue<UInt64, TetherInstant>()
    /// The requests waiting for a slot, by id.
    private var unsent: [UInt64: Frame.Request] = [:]
    /// Their ids, oldest first (some may have ended meanwhile). Made on first use.
    private var waiting: CircularBuffer<UInt64>?
    /// Requests on the wire and not answered.
    package private(set) var onWire = 0
    /// The most requests on the wire at once.
    package let limit: Int

    /// - Parameter limit: WELCOME's `max concurrent requests`, 0 for no limit.
    package init(limit: UInt32) {
        self.limit = limit == 0 ? .max : Int(limit)
    }

    /// Requests in the table.
    package var count: Int { self.deadlines.count }

    /// The earliest deadline.
    package var earliestDeadline: TetherInstant? {
        mutating get { self.deadlines.earliest }
    }

    package enum OnSubmit: Sendable, Hashable {
        /// Write it now.
        case write
        /// It waits for a slot.
        case queued
        /// Its id is in the table already.
        case duplicate
    }

    /// The client submits a request, to be answered by `deadline`.
    package mutating func submit(_ request: Frame.Request, deadline: TetherInstant) -> OnSubmit {
        guard self.deadlines.deadline(of: request.id) == nil else { return .duplicate }
        self.deadlines.insert(request.id, deadline: deadline)
        // A free slot and nobody waiting ahead: straight to the wire.
        if self.onWire < self.limit, self.waiting?.isEmpty ?? true {
            self.onWire += 1
            return .write
        }
        self.unsent[request.id] = request
        if self.waiting == nil { self.waiting = CircularBuffer(initialCapacity: 4) }
        self.waiting!.append(request.id)
        return .queued
    }

    /// A RESPONSE arrived.
    /// - Returns: The request's deadline if it was on the wire (it ends now); `nil` if it is not
    ///   (it ended already, or never left: PROTOCOL.md says to ignore such a response).
    package mutating func responded(_ id: UInt64) -> TetherInstant? {
        guard self.unsent.isEmpty || self.unsent[id] == nil, let deadline = self.deadlines.deadline(of: id) else { return nil }
        self.deadlines.remove(id)
        self.onWire -= 1
        return deadline
    }

    /// The request ends before its response (cancelled, its deadline passed).
    /// - Returns: Whether it was on the wire; `nil` if it is not in the table.
    package mutating func settle(_ id: UInt64) -> Bool? {
        guard self.deadlines.remove(id) else { return nil }
        if self.unsent.removeValue(forKey: id) != nil { return false }
        self.onWire -= 1
        return true
    }

    /// The oldest waiting request, if a slot is free: it is on the wire from now on.
    package mutating func nextToSend() -> Frame.Request? {
        guard self.onWire < self.limit else { return nil }
        while let id = self.waiting?.popFirst() {
            guard let request = self.unsent.removeValue(forKey: id) else { continue }  // ended meanwhile
            self.onWire += 1
            if self.waiting?.isEmpty == true { self.waiting = nil }
            return request
        }
        self.waiting = nil
        return nil
    }

    /// The requests whose deadline passed by `now`, with whether each was on the wire.
    package mutating func expired(at now: TetherInstant) -> [(id: UInt64, wasSent: Bool)] {
        self.deadlines.popExpired(at: now).map { id in
            if self.unsent.removeValue(forKey: id) != nil { return (id, false) }
            self.onWire -= 1
            return (id, true)
        }
    }

    /// Ends every waiting request (the connection stops taking requests).
    /// - Returns: Their ids.
    package mutating func takeUnsent() -> [UInt64] {
        let ids = (self.waiting.map(Array.init) ?? []).filter { self.unsent[$0] != nil }
        for id in ids { self.deadlines.remove(id) }
        self.unsent.removeAll()
        self.waiting = nil
        return ids
    }

    /// Ends every request (the connection closed).
    /// - Returns: The ids of those that waited, and of those on the wire.
    package mutating func takeAll() -> (unsent: [UInt64], sent: [UInt64]) {
        let unsent = self.takeUnsent()
        let sent = self.deadlines.removeAll()
        self.onWire = 0
        return (unsent, sent)
    }
}
