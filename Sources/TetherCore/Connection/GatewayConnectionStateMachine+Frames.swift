import NIOCore

extension GatewayConnectionStateMachine {
    /// What the handler does with a frame it read.
    package enum OnFrame: Sendable {
        case none
        /// Authenticate the client in a task, then report ``handshakeSucceeded(_:)`` or
        /// ``handshakeRefused(_:now:)``.
        case authenticate(Frame.Hello)
        /// Route the request: answer it at once (an inline handler, an unknown method, a
        /// refusal), or call ``handlerNeeded(_:now:)`` for a task. Its timeout is the effective one.
        case route(Frame.Request)
        /// Cancel the task of this request, if one runs.
        case cancelHandler(UInt64)
        /// Write this (PONG, or a refusal).
        case write(Frame.Payload)
        /// Hand this batch of reliable messages to the outbox's lane.
        case processBatch([ReliableLaneMachine.Received])
        /// Carry out what the delivery pump decided.
        case pump(DeliveryPump.Actions)
        /// Subscribe the connection to a channel (replacing its subscription there, if any):
        /// check the client may, then answer SUBSCRIBED and send what it recovers.
        case subscribe(Frame.Subscribe)
        /// Take the connection out of this channel.
        case unsubscribe(String)
        /// The client reported an error: close, settling these requests (cancel their tasks).
        case close(Frame.ErrorReport, settle: [UInt64])
        /// Write this last frame (ERROR) and close: the client broke the protocol. Settle these
        /// requests (cancel their tasks).
        case writeAndClose(Frame.Payload, settle: [UInt64])
    }

    /// A frame arrived.
    package mutating func received(_ frame: Frame, now: TetherInstant) -> OnFrame {
        // The established connection first, without copying the state to find out.
        if let action = self.withEstablished({ active, draining in
            active.lastInbound = now
            return Self.received(frame, active: &active, draining: draining, now: now)
        }) {
            switch action {
            case .writeAndClose(let payload, _):
                // The frame broke the protocol: the established connection ends.
                return .writeAndClose(payload, settle: self.startClosing(writingLastFrame: true, now: now) ?? [])
            case .close(let report, _):
                return .close(report, settle: self.startClosing(writingLastFrame: false, now: now) ?? [])
            default:
                return action
            }
        }
        switch self.state {
        case .handshaking(var handshaking):
            return self.receivedDuringHandshake(frame, &handshaking, now: now)
        case .active, .draining, .closing, .closed:
            return .none
        case ._modifying:
            preconditionFailure("re-entered the machine")
        }
    }

    private mutating func receivedDuringHandshake(_ frame: Frame, _ handshaking: inout Handshaking, now: TetherInstant) -> OnFrame {
        if case .error(let report) = frame.payload {
            _ = self.startClosing(writingLastFrame: false, now: now)
            return .close(report, settle: [])
        }
        guard !handshaking.helloReceived else {
            switch frame.payload {
            case .pong, .extension: return .none
            default: return self.violation(.unexpectedFrame, "\(frame.type) before WELCOME; wait for the handshake to finish", now: now)
            }
        }
        guard case .hello(let hello) = frame.payload else {
            return self.violation(.unexpectedFrame, "the first frame must be HELLO, got \(frame.type)", now: now)
        }
        guard frame.flags.contains(.checksum) else {
            return self.violation(.checksumMismatch, "HELLO must carry a checksum", now: now)
        }
        handshaking.helloReceived = true
        self.state = .handshaking(handshaking)
        return .authenticate(hello)
    }

    /// The protocol rules of an established connection.
    private static func received(_ frame: Frame, active: inout Active, draining: Bool, now: TetherInstant) -> OnFrame {
        let negotiated = active.negotiated
        if negotiated.checksums && !frame.flags.contains(.checksum) {
            return .violation(.checksumMismatch, "\(frame.type) lacks the negotiated checksum")
        }
        switch frame.payload {
        case .request(let request):
            if draining {
                return .write(
                    .response(.init(id: request.id, status: .unavailable, message: "the gateway is going away; retry on a new connection"))
                )
            }
            switch active.requests.received(request, now: now) {
            case .route(let request): return .route(request)
            case .paced: return .none
            case .duplicate: return .violation(.protocolError, "request id \(request.id) is already in flight")
            }
        case .cancel(let cancel):
            return active.requests.cancel(cancel.requestID) ? .cancelHandler(cancel.requestID) : .none
        case .ping(let ping):
            return .write(.pong(ping))
        case .pong, .extension:
            return .none
        case .error(let report):
            return .close(report, settle: [])
        case .message(let message) where negotiated.features.contains(.reliableDelivery):
            // While draining a message is not processed; the client sends it again on its next
            // connection (messages are idempotent).
            guard !draining, active.reliable != nil,
                let batch = active.reliable!.inbox.received(message, now: now)
            else { return .none }
            return .processBatch(batch)
        case .deliveryAck(let ack) where negotiated.features.contains(.reliableDelivery):
            guard active.reliable != nil else { return .none }
            return .pump(active.reliable!.pump.acknowledged(upTo: ack.sequence))
        case .message, .deliveryAck:
            return .violation(.unexpectedFrame, "\(frame.type) without the negotiated reliable-delivery feature")
        case .subscribe(let subscribe) where negotiated.features.contains(.channels):
            if draining {
                return .write(
                    .subscribed(
                        .init(id: subscribe.id, status: .unavailable, message: "the gateway is going away; subscribe on a new connection")
                    )
                )
            }
            return .subscribe(subscribe)
        case .unsubscribe(let unsubscribe) where negotiated.features.contains(.channels):
            return .unsubscribe(unsubscribe.channel)
        case .subscribe, .unsubscribe:
            return .violation(.unexpectedFrame, "\(frame.type) without the negotiated channels feature")
        case .hello, .welcome, .response, .push, .goAway, .messageAck, .delivery, .subscribed, .publication, .presence:
            return .violation(.unexpectedFrame, "\(frame.type) is not allowed from a client after the handshake")
        }
    }

    /// The connection's bytes cannot be decoded, or broke the protocol otherwise: ERROR, close.
    package mutating func violation(_ error: ProtocolError, now: TetherInstant) -> OnFrame {
        guard let settle = self.startClosing(writingLastFrame: true, now: now) else { return .none }
        return .writeAndClose(.error(.init(code: error.code, message: error.message)), settle: settle)
    }

    private mutating func violation(_ code: StatusCode, _ message: String, now: TetherInstant) -> OnFrame {
        self.violation(ProtocolError(code: code, message: message), now: now)
    }

    // MARK: The handshake

    /// What the handshake established.
    package struct Established: Sendable, Hashable {
        package var negotiated: Handshake.Negotiated
        /// When the client's credentials, grace included, run out; `nil` if they do not.
        package var credentialsDeadline: TetherInstant?
        /// With reliable delivery: the last delivery the client has (its resume point in this
        /// store's epoch, 0 otherwise).
        package var resume: UInt64?

        package init(negotiated: Handshake.Negotiated, credentialsDeadline: TetherInstant? = nil, resume: UInt64? = nil) {
            self.negotiated = negotiated
            self.credentialsDeadline = credentialsDeadline
            self.resume = resume
        }
    }

    /// The handshake succeeded: the WELCOME goes out now.
    /// - Returns: What the delivery pump does first (with reliable delivery), or `nil` if the
    ///   connection is no longer waiting for its WELCOME (it closed meanwhile).
    package mutating func handshakeSucceeded(_ established: Established, now: TetherInstant) -> DeliveryPump.Actions?? {
        guard case .handshaking(let handshaking) = self.state, handshaking.helloReceived else { return nil }
        var active = Active(
            negotiated: established.negotiated,
            lastInbound: now,
            credentialsDeadline: established.credentialsDeadline,
            requests: GatewayRequestTable(limits: self.configuration.requests, now: now)
        )
        var start: DeliveryPump.Actions?
        if let resume = established.resume {
            var pump = DeliveryPump(
                resume: resume,
                window: self.configuration.deliveryWindow,
                sharedDeliveries: established.negotiated.features.contains(.sharedDeliveries)
            )
            start = pump.start()
            active.reliable = Reliable(
                inbox: MessageInbox(limits: self.configuration.inbox, now: now),
                pump: pump,
                answers: established.negotiated.features.contains(.messageAnswers)
            )
        }
        self.established(active)
        return .some(start)
    }

    /// The handshake failed: send `payload` (ERROR, or GOAWAY when the gateway cannot take the
    /// connection now) and close.
    /// - Returns: Whether to write it (`false` if the connection is closing already).
    package mutating func handshakeRefused(_ payload: Frame.Payload, now: TetherInstant) -> Bool {
        self.startClosing(writingLastFrame: true, now: now) != nil
    }

    /// The client refreshed its credentials on the connection: their new deadline replaces the
    /// old, unless the connection is already draining.
    package mutating func credentialsReplaced(deadline: TetherInstant?) {
        _ = self.withEstablished { active, draining in
            if !draining { active.credentialsDeadline = deadline }
        }
    }

    // MARK: Draining

    package enum OnDrain: Sendable, Hashable {
        case none
        /// Send GOAWAY; the client closes once its requests are answered, the grace period
        /// bounds the wait.
        case sendGoAway
        /// Send GOAWAY and close at once (the handshake had not completed).
        case sendGoAwayAndClose
    }

    /// The gateway wants the connection gone (it is shutting down).
    package mutating func drain(now: TetherInstant) -> OnDrain {
        switch self.state {
        case .active:
            self.setDraining(graceDeadline: now + self.configuration.shutdownGracePeriod)
            return .sendGoAway
        case .handshaking:
            _ = self.startClosing(writingLastFrame: true, now: now)
            return .sendGoAwayAndClose
        case .draining, .closing, .closed:
            return .none
        case ._modifying:
            preconditionFailure("re-entered the machine")
        }
    }
}

extension GatewayConnectionStateMachine.OnFrame {
    fileprivate static func violation(_ code: StatusCode, _ message: String) -> Self {
        .writeAndClose(.error(.init(code: code, message: message)), settle: [])
    }
}
