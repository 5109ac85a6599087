import NIOCore

extension ClientConnectionStateMachine {
    // MARK: Requests

    /// Why a request cannot go on this connection.
    package enum SubmitRefusal: Sendable, Hashable {
        /// The connection no longer takes requests (it drains, or closed): send it on the next.
        case notAccepting
        /// Its body is over what the gateway accepts.
        case tooLarge(size: Int, limit: Int)
        /// Its id is in flight already.
        case duplicate
    }

    package enum OnSubmit: Sendable, Hashable {
        /// Write it now.
        case write
        /// It waits for a slot.
        case queued
        /// It cannot go on this connection.
        case refuse(SubmitRefusal)
    }

    /// The client sends a request, to be answered by `deadline`.
    package mutating func submit(_ request: Frame.Request, deadline: TetherInstant) -> OnSubmit {
        guard case .active = self.state else { return .refuse(.notAccepting) }
        return self.withEstablished { active, _ -> OnSubmit in
            let size = request.bodySize
            guard size <= active.negotiated.peerMaxBodySize else {
                return .refuse(.tooLarge(size: size, limit: active.negotiated.peerMaxBodySize))
            }
            switch active.requests.submit(request, deadline: deadline) {
            case .write: return .write
            case .queued: return .queued
            case .duplicate: return .refuse(.duplicate)
            }
        }!
    }

    package enum OnCancel: Sendable {
        /// Not in flight: nothing to do.
        case none
        /// The request ends `cancelled`; if it was on the wire, send CANCEL. Then write `send`
        /// (a request the freed slot lets go) and close for `close`.
        case cancelled(sendCancel: Bool, send: Frame.Request?, close: DisconnectReason?)
    }

    /// The caller abandons request `id`.
    package mutating func cancel(_ id: UInt64) -> OnCancel {
        guard
            let outcome = self.withEstablished({ active, _ -> (Bool, Frame.Request?)? in
                guard let wasSent = active.requests.settle(id) else { return nil }
                return (wasSent, active.requests.nextToSend())
            }), let (wasSent, next) = outcome
        else { return .none }
        return .cancelled(sendCancel: wasSent, send: next, close: self.closeIfDrained())
    }

    /// The client stops sending requests (it is shutting down, or moving to a better endpoint).
    /// - Parameter reason: Why, for when the connection closes.
    /// - Returns: The reason to close now for, if nothing is in flight or the handshake is not
    ///   complete.
    package mutating func drain(for reason: DisconnectReason = .shutdown) -> DisconnectReason? {
        self.closeReason = self.closeReason ?? reason
        switch self.state {
        case .active:
            self.startDraining()
            return self.closeIfDrained()
        case .draining:
            return self.closeIfDrained()
        case .idle, .handshaking:
            return reason
        case .closing, .closed:
            return nil
        case ._modifying:
            preconditionFailure("re-entered the machine")
        }
    }

    /// The client closes the connection on purpose (a network change, a shutdown).
    package mutating func closeRequested() {
        self.closedByClient = true
    }

    /// The channel reported an error other than a protocol violation: the connection closes.
    package mutating func transportFailed(_ description: String) {
        self.closeReason = self.closeReason ?? .transportError(description)
        self.startClosing()
    }

    // MARK: Time

    /// What the handler does when its timer fires.
    package struct OnTimer: Sendable {
        /// The handshake did not complete in time: the attempt fails; close.
        package var handshakeTimedOut = false
        /// Requests whose deadline passed: they end `timed out` (`wasSent`: on the wire).
        package var expired: [(id: UInt64, wasSent: Bool)] = []
        /// Waiting requests to send in the slots the expired ones freed.
        package var send: [Frame.Request] = []
        /// Reliable messages are due for retransmission: send what the window allows.
        package var pumpMessages = false
        /// The heartbeat's decision.
        package var heartbeat: HeartbeatStateMachine.TimerAction = .none
        /// The connection is done: close it for this reason.
        package var close: DisconnectReason?
    }

    /// The timer fired (perhaps early: then nothing is due).
    package mutating func timerFired(now: TetherInstant) -> OnTimer {
        var result = OnTimer()
        switch self.state {
        case .handshaking(let deadline):
            guard now >= deadline else { return result }
            let timeout = self.configuration.handshakeTimeout.shortDescription
            result.handshakeTimedOut = true
            result.close = .transportError("handshake timed out after \(timeout)")
            self.closeReason = self.closeReason ?? result.close
            self.startClosing()
            return result
        case .active, .draining:
            break
        case .idle, .closing, .closed:
            return result
        case ._modifying:
            preconditionFailure("re-entered the machine")
        }
        var failing: LinkHealth.Failing?
        self.withEstablished { active, _ in
            result.expired = active.requests.expired(at: now)
            if !result.expired.isEmpty {
                while let next = active.requests.nextToSend() { result.send.append(next) }
            }
            for (_, wasSent) in result.expired where wasSent {
                // Sent and never answered: evidence against the link (one still queued is not).
                if let verdict = active.health?.record(failed: true, at: now) { failing = verdict }
            }
            for id in active.retransmissions.popExpired(at: now) where active.outbox?.timedOut(id) != nil {
                result.pumpMessages = true
            }
            result.heartbeat = active.heartbeat.timerFired(at: now)
        }
        if !result.expired.isEmpty, !self.acceptsRequests {
            result.send = []  // (a draining connection sends nothing new; nothing waits there anyway)
        }
        if case .linkDead(let silence) = result.heartbeat {
            self.reportFailedIdleProbe()
            result.close = .heartbeatTimeout(silentFor: silence)
            self.closeReason = self.closeReason ?? result.close
            self.startClosing()
        } else if let failing {
            result.close = .linkFailing(timedOut: failing.failed, of: failing.total)
            self.closeReason = self.closeReason ?? result.close
            self.startClosing()
        } else if !result.expired.isEmpty {
            result.close = self.closeIfDrained()
        }
        return result
    }

    private mutating func reportFailedIdleProbe() {
        guard !self.closedByClient else { return }
        let probe: HeartbeatStateMachine.IdleProbe?
        switch self.state {
        case .active(let active), .draining(let active), .closing(let active?): probe = active.value.heartbeat.outstandingIdleProbe
        default: probe = nil
        }
        if let probe { self.idleProbeReport = (probe, false) }
    }

    // MARK: Closing

    /// What is left to settle once the channel has closed.
    package struct OnClosed: Sendable {
        /// The handshake never completed: the attempt fails.
        package var handshakeFailed: Bool
        /// Requests that waited for a slot: they end `not dispatched` (sent again on the next
        /// connection).
        package var unsent: [UInt64]
        /// Requests on the wire: they end `connection lost` (the gateway may have run them).
        package var lost: [UInt64]
        package var reason: DisconnectReason
        /// How long the connection was established; zero if the handshake never completed.
        package var uptime: Duration
    }

    /// The channel closed.
    /// - Returns: `nil` if it was reported already.
    package mutating func closed(now: TetherInstant) -> OnClosed? {
        var active: Active?
        switch self.state {
        case .closed:
            return nil
        case .active(let established), .draining(let established), .closing(let established?):
            active = established.value
        case .idle, .handshaking, .closing(nil):
            break
        case ._modifying:
            preconditionFailure("re-entered the machine")
        }
        switch self.closeReason {
        case nil, .closedByPeer, .transportError: self.reportFailedIdleProbe()
        default: break  // decided here (a heartbeat timeout reports itself), or by the gateway
        }
        self.state = .closed
        let reason = self.closeReason ?? .closedByPeer
        self.closeReason = reason
        let requests = active?.requests.takeAll() ?? (unsent: [], sent: [])
        return OnClosed(
            handshakeFailed: active == nil,
            unsent: requests.unsent,
            lost: requests.sent,
            reason: reason,
            uptime: active.map { now - $0.establishedAt } ?? .zero
        )
    }

    // MARK: Reliable messages

    /// Messages to send on this connection (in addition to those queued).
    /// - Returns: Whether the connection takes them (reliable delivery was negotiated).
    package mutating func enqueueMessages(_ records: [OutboxRecord]) -> Bool {
        self.withEstablished { active, _ -> Bool in
            guard active.outbox != nil else { return false }
            active.outbox!.enqueue(records)
            return true
        } ?? false
    }

    /// A message expired: its tombstone replaces it.
    package mutating func replaceMessage(with tombstone: OutboxRecord) {
        _ = self.withEstablished { active, _ in active.outbox?.replace(with: tombstone) }
    }

    /// The next reliable message to send, if the window allows; its retransmission deadline is set.
    /// - Parameters:
    ///   - now: The clock's time.
    ///   - wallClock: Milliseconds since 1970, to turn expiry times into time to live.
    /// - Returns: The MESSAGE, and whether this is its first transmission on this connection.
    package mutating func nextMessage(now: TetherInstant, wallClock: Int64) -> (Frame.Message, first: Bool)? {
        guard case .active = self.state else { return nil }
        return self.withEstablished { active, _ -> (Frame.Message, first: Bool)? in
            guard active.outbox != nil, let record = active.outbox!.next(now: now) else { return nil }
            let transmissions = active.outbox!.inFlight[record.id]?.transmissions ?? 1
            let message = Frame.Message(
                id: record.id,
                topic: record.topic,
                conversation: record.conversation,
                sequence: record.sequence,
                ttl: record.expired ? nil : record.expiresAt.map { .milliseconds(max(1, $0 - wallClock)) },
                expired: record.expired,
                body: record.expired ? ByteBuffer() : record.body,
                traceContext: active.negotiated.features.contains(.traceContext) && !record.expired ? record.traceContext : nil
            )
            let timeout = active.retransmission?.retransmissionTimeout(afterRetransmissions: transmissions - 1) ?? .seconds(1)
            active.retransmissions.insert(record.id, deadline: now + timeout)
            return (message, transmissions == 1)
        } ?? nil
    }

    /// The DELIVERY_ACK telling the gateway that every delivery up to `sequence` was processed,
    /// if the connection is established.
    package func deliveryAck(upTo sequence: UInt64) -> Frame.DeliveryAck? {
        self.negotiated == nil ? nil : Frame.DeliveryAck(sequence: sequence)
    }
}
