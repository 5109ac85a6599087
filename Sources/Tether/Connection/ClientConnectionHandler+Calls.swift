import NIOCore
import TetherCore

// What the client asks of its connection, on the connection's event loop (through
// ``ClientConnection``): requests, cancellation, draining, the heartbeat's mode, reliable messages.
extension ClientConnectionHandler {
    /// A request to send, its deadline, and who waits for its response.
    typealias RequestSubmission = (request: Frame.Request, deadline: TetherInstant, waiter: ResponseWaiter)

    // MARK: Requests

    /// Sends a request; `waiter` gets the response body or a ``TetherError``, at the latest when
    /// `deadline` passes. A callback waiter runs here, on the event loop, and may send requests.
    ///
    /// For callers that run on the event loop, one request each: if other requests are on the
    /// wire, the flush waits for the end of the loop's current batch of work (or read), so that
    /// the requests of every caller resumed in that batch leave in one write. Alone, it leaves
    /// at once.
    func sendRequest(_ request: Frame.Request, deadline: TetherInstant, waiter: ResponseWaiter) {
        guard self.submit(request, deadline: deadline, waiter: waiter) else { return }
        self.armTimer(forNew: deadline)
        self.flushSoon(alone: self.machine.requestsOnWire <= 1)
    }

    /// - Returns: Whether the request was written.
    private func submit(_ request: Frame.Request, deadline: TetherInstant, waiter: ResponseWaiter) -> Bool {
        guard self.context != nil else {
            waiter.fail(TetherError(code: .notDispatched, message: "the connection no longer accepts requests"))
            return false
        }
        switch self.machine.submit(request, deadline: deadline) {
        case .write:
            self.pending[request.id] = Pending(waiter: waiter, method: request.method)
            self.write(.request(request))
            return true
        case .queued:
            self.pending[request.id] = Pending(waiter: waiter, method: request.method)
            return false
        case .refuse(.notAccepting):
            waiter.fail(TetherError(code: .notDispatched, message: "the connection no longer accepts requests"))
        case .refuse(.tooLarge(let size, let limit)):
            waiter.fail(
                TetherError(code: .requestTooLarge, message: "the request body is \(size) bytes; the gateway accepts at most \(limit)")
            )
        case .refuse(.duplicate):
            waiter.fail(TetherError(code: .invalidArgument, message: "request id \(request.id) is already in flight"))
        }
        return false
    }

    /// Sends the requests submitted from outside the loop since the last hop, in one write as
    /// far as the gateway's slots allow. One cancelled before it arrived ends `cancelled`.
    func sendSubmitted(_ requests: some Sequence<RequestSubmission>) {
        let cancelledEarly = self.cancelledBeforeArrival
        self.cancelledBeforeArrival = []
        var wrote = false
        var earliest: TetherInstant?
        for (request, deadline, waiter) in requests {
            if cancelledEarly.contains(request.id) {
                waiter.fail(TetherError(code: .cancelled, message: "request '\(request.method)' was cancelled"))
                continue
            }
            wrote = self.submit(request, deadline: deadline, waiter: waiter) || wrote
            earliest = min(earliest ?? deadline, deadline)
        }
        if let earliest { self.armTimer(forNew: earliest) }
        if wrote { self.flushNow() }
    }

    /// Abandons a request: fails it with ``TetherError/Code/cancelled`` and, if it was sent, sends CANCEL.
    func cancelRequest(id: UInt64) {
        guard self.pending[id] != nil else {
            // Not here yet (its hop is still queued), or ended already: the next hop checks.
            self.cancelledBeforeArrival.insert(id)
            return
        }
        guard case .cancelled(let sendCancel, let send, let close) = self.machine.cancel(id) else { return }
        if sendCancel { self.write(.cancel(.init(requestID: id))) }
        if let send { self.write(.request(send)) }
        if self.io.flushOwed { self.flushNow() }  // a CANCEL does not wait
        self.fail([id]) { method in TetherError(code: .cancelled, message: "request '\(method)' was cancelled") }
        if close != nil { self.close() }
    }

    /// Stops accepting requests and closes once those in flight are answered.
    func drain(for reason: DisconnectReason) {
        guard self.machine.drain(for: reason) != nil else { return }
        self.close()
    }

    /// Makes the heartbeat follow what the app wants now. Reading the preference here, not
    /// passing it, means that calls queued in any order leave the latest in force.
    func refreshHeartbeatMode() {
        if let id = self.machine.heartbeatPreferenceChanged(self.callbacks.heartbeatPreference(), now: self.clock.now) {
            self.write(.ping(.init(id: id)))
            self.callbacks.statistics?.pingSent()
            self.flushNow()
        }
        self.armTimer()
    }

    /// The client is closing this connection on purpose (a network change, a shutdown).
    func closeAtClientRequest() {
        self.machine.closeRequested()
        self.close()
    }

    // MARK: Reliable messages

    /// Queues messages to send on this connection.
    func enqueueMessages(_ records: [OutboxRecord]) {
        guard self.machine.enqueueMessages(records) else { return }
        self.pumpMessages()
    }

    /// A message expired: its tombstone replaces it.
    func replaceMessage(with tombstone: OutboxRecord) {
        self.machine.replaceMessage(with: tombstone)
    }

    /// Tells the gateway that every delivery up to `sequence` was processed.
    func acknowledgeDeliveries(upTo sequence: UInt64) {
        guard let ack = self.machine.deliveryAck(upTo: sequence) else { return }
        self.write(.deliveryAck(ack))
        self.flushSoon(alone: true)  // at once, or at the end of the read under way
    }

    /// Sends messages while the window and the channel's buffer allow: messages never pile up
    /// in the channel, so PINGs, CANCELs and acknowledgements are not stuck behind them.
    func pumpMessages() {
        guard !self.pumping, let context = self.context else { return }
        self.pumping = true
        defer { self.pumping = false }
        let now = self.clock.now
        let wallClock = self.clock.wallClockMilliseconds
        var firstTransmissions: [UInt64] = []
        var wrote = false
        while context.channel.isWritable, let (message, first) = self.machine.nextMessage(now: now, wallClock: wallClock) {
            self.write(.message(message))
            self.callbacks.statistics?.messageSent(first: first)
            if first { firstTransmissions.append(message.id) }
            wrote = true
        }
        if wrote {
            self.flushSoon(alone: true)  // at once, or at the end of the read under way
            self.armTimer()
        }
        if !firstTransmissions.isEmpty { self.callbacks.reliable?.sent(firstTransmissions) }
    }
}
