import NIOCore

extension GatewayConnectionStateMachine {
    // MARK: Request handlers

    /// A routed request needs a task for its handler.
    /// - Returns: Whether to start it now or let it wait for a slot; `nil` if the connection
    ///   is closing (the request is settled already).
    package mutating func handlerNeeded(_ request: Frame.Request, now: TetherInstant) -> GatewayRequestTable.OnHandlerNeeded? {
        let decision = self.withEstablished { active, _ in active.requests.handlerNeeded(request, now: now) }
        if decision == .start { self.tasks += 1 }
        return decision
    }

    /// What follows the end of a request handler's task.
    package struct OnHandlerEnded: Sendable, Hashable {
        /// Whether to write the handler's answer (its request was not settled meanwhile).
        package var writeAnswer = false
        /// Waiting requests that may start now, in order (their slots are taken).
        package var start: [Frame.Request] = []
        /// The connection closed and this was its last task.
        package var done = false
    }

    /// A request handler's task ended.
    /// - Parameter id: The request it answered, if it answered (``responseReady(_:routedDirectly:)``
    ///   and this event in one).
    package mutating func handlerEnded(answering id: UInt64? = nil) -> OnHandlerEnded {
        self.tasks -= 1
        var result = OnHandlerEnded()
        if let ended = self.withEstablished({ active, _ in
            (id.map { active.requests.answered($0, routedDirectly: false) } ?? false, active.requests.handlerEnded())
        }) {
            (result.writeAnswer, result.start) = ended
        }
        self.tasks += result.start.count
        result.done = self.isDone
        return result
    }

    /// An answer to request `id` is ready (its handler's reply, or a refusal).
    /// - Parameter routedDirectly: The request was routed as it was read (not paced), so it is
    ///   in the table only if it went to a task.
    /// - Returns: Whether to write it: `false` if the request was settled already (its deadline
    ///   passed, it was cancelled, the connection is closing).
    package mutating func responseReady(_ id: UInt64, routedDirectly: Bool) -> Bool {
        self.withEstablished { active, _ in active.requests.answered(id, routedDirectly: routedDirectly) } ?? false
    }

    /// Whether request `id` is read and not answered.
    package mutating func isInFlight(_ id: UInt64) -> Bool {
        self.withEstablished { active, _ in active.requests.contains(id) } ?? false
    }

    // MARK: Reliable delivery

    /// Whether the client takes `unavailable` answers to messages not taken now (the `message
    /// answers` feature).
    package var reliableAnswers: Bool {
        switch self.state {
        case .active(let active), .draining(let active): active.value.reliable?.answers ?? false
        case .handshaking, .closing, .closed, ._modifying: false
        }
    }

    /// The channel's writability changed: the delivery pump pauses while the client does not read.
    package mutating func writabilityChanged(_ writable: Bool) -> DeliveryPump.Actions? {
        self.withEstablished { active, _ in active.reliable?.pump.writabilityChanged(writable) } ?? nil
    }

    /// The lane finished the batch handed out last (``OnFrame/processBatch(_:)``).
    /// - Returns: The next batch, if messages wait and the rate allows.
    package mutating func batchEnded(now: TetherInstant) -> [ReliableLaneMachine.Received]? {
        self.withEstablished { active, _ in active.reliable?.inbox.batchEnded(now: now) } ?? nil
    }

    /// Deliveries were committed for this connection's client.
    package mutating func deliveriesOffered(_ deliveries: [StoredDelivery]) -> DeliveryPump.Actions? {
        self.withEstablished { active, _ in active.reliable?.pump.offered(deliveries) } ?? nil
    }

    /// Another gateway appended deliveries for this connection's client: the pump reads them.
    package mutating func deliveriesAppendedElsewhere() -> DeliveryPump.Actions? {
        self.withEstablished { active, _ in active.reliable?.pump.appendedElsewhere() } ?? nil
    }

    /// The store returned the deliveries a ``DeliveryPump/Actions/fetch`` asked for.
    package mutating func deliveriesFetched(_ deliveries: [StoredDelivery], limit: Int) -> DeliveryPump.Actions? {
        self.withEstablished { active, _ in active.reliable?.pump.fetched(deliveries, limit: limit) } ?? nil
    }

    /// The store could not return deliveries: the pump tries again later.
    package mutating func deliveriesFetchFailed(now: TetherInstant) {
        _ = self.withEstablished { active, _ in active.reliable?.pump.fetchFailed(now: now) }
    }

    /// The acknowledgement a ``DeliveryPump/Actions/record`` asked for was written (or not).
    package mutating func acknowledgementRecorded(_ succeeded: Bool) -> DeliveryPump.Actions? {
        self.withEstablished { active, _ in active.reliable?.pump.recordFinished(succeeded) } ?? nil
    }

    // MARK: Time

    /// What the handler does when its timer fires.
    package struct OnTimer: Sendable {
        /// `deadline exceeded` answers to write.
        package var responses: [Frame.Response] = []
        /// Requests whose tasks to cancel.
        package var cancel: [UInt64] = []
        /// Tokens of tasks past their time limits, to cancel.
        package var cancelTimeLimited: [UInt64] = []
        /// Paced requests that got their token: route them, in order.
        package var route: [Frame.Request] = []
        /// Reliable messages the rate lets through.
        package var batch: [ReliableLaneMachine.Received]?
        /// What the delivery pump does (a read that failed is tried again).
        package var pump: DeliveryPump.Actions?
        /// How the connection ends, if it does now.
        package var end: End?
    }

    /// How a connection ends on a timer.
    package enum End: Sendable {
        /// Write this (ERROR for a handshake that timed out, GOAWAY for an idle connection) and
        /// close, settling these requests.
        case writeAndClose(Frame.Payload, settle: [UInt64])
        /// Close at once, settling these requests: the grace period after GOAWAY ended, or a
        /// last frame could not be written in time (`lastFrameStuck`).
        case close(settle: [UInt64], lastFrameStuck: Bool)
        /// Drain the connection with this GOAWAY: the client's credentials expired.
        case drain(Frame.GoAway)
    }

    /// The timer fired (perhaps early: then nothing is due).
    package mutating func timerFired(now: TetherInstant) -> OnTimer {
        var result = OnTimer()
        for token in self.expireTimeLimits(now: now) { result.cancelTimeLimited.append(token) }
        self.compressionTimerFired(now: now)
        switch self.state {
        case .handshaking(let handshaking):
            guard now >= handshaking.deadline else { break }
            let timeout = self.configuration.handshakeTimeout.shortDescription
            _ = self.startClosing(writingLastFrame: true, now: now)
            result.end = .writeAndClose(
                .error(.init(code: .handshakeTimeout, message: "no completed handshake within \(timeout)")),
                settle: []
            )
        case .closing(let closing):
            if let deadline = closing.deadline, now >= deadline {
                self.enterClosing(Closing(deadline: nil))
                result.end = .close(settle: [], lastFrameStuck: true)
            }
        case .active, .draining:
            result.end = self.phaseTimers(now: now)
            guard result.end == nil || result.end.isDrain else { break }
            self.withEstablished { active, _ in
                let due = active.requests.timerFired(now: now)
                for expired in due.expired {
                    result.responses.append(
                        .init(id: expired.id, status: .deadlineExceeded, message: "'\(expired.method)' did not finish in time")
                    )
                    result.cancel.append(expired.id)
                }
                result.route = due.released
                if active.reliable != nil {
                    result.batch = active.reliable!.inbox.timerFired(now: now)
                    result.pump = active.reliable!.pump.timerFired(now: now)
                }
            }
        case .closed, ._modifying:
            break
        }
        return result
    }

    /// The deadlines of the established connection's phase: idle, credentials, grace.
    private mutating func phaseTimers(now: TetherInstant) -> End? {
        let (drainDue, credentialsDue, lastInbound) =
            self.withEstablished { active, _ -> (Bool, Bool, TetherInstant) in
                let credentialsDue = active.credentialsDeadline.map { now >= $0 } ?? false
                if credentialsDue { active.credentialsDeadline = nil }
                return (active.graceDeadline.map { now >= $0 } ?? false, credentialsDue, active.lastInbound)
            }!
        if drainDue {
            return .close(settle: self.startClosing(writingLastFrame: false, now: now) ?? [], lastFrameStuck: false)
        }
        if now >= lastInbound + self.configuration.idleTimeout {
            let silence = (now - lastInbound).shortDescription
            let settle = self.startClosing(writingLastFrame: true, now: now) ?? []
            return .writeAndClose(.goAway(.init(reason: .idleTimeout, message: "nothing received for \(silence)")), settle: settle)
        }
        if credentialsDue {
            // Drained like a shutdown: the requests in flight are answered, the client closes.
            return .drain(.init(reason: .credentialsExpired, message: "the client's credentials expired; connect again with fresh ones"))
        }
        return nil
    }
}

extension Optional where Wrapped == GatewayConnectionStateMachine.End {
    fileprivate var isDrain: Bool {
        if case .drain = self { return true }
        return false
    }
}
