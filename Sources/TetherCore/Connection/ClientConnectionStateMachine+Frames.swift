import NIOCore

extension ClientConnectionStateMachine {
    /// How a handshake failed.
    package enum Refusal: Sendable, Hashable {
        /// The gateway answered GOAWAY.
        case goAway(Frame.GoAway)
        /// The gateway answered ERROR.
        case error(Frame.ErrorReport)
    }

    /// What the handler does with a frame it read.
    package enum OnFrame: Sendable {
        case none
        /// WELCOME: the connection is established with these parameters.
        case established(Handshake.Negotiated)
        /// A RESPONSE ended request `id` (`pastDeadline`: it came after the request's deadline,
        /// so a `deadline exceeded` is the caller's own timeout). Then write `send` (a request
        /// the freed slot lets go) and close for `close` (a draining connection is done).
        case complete(id: UInt64, Frame.Response, pastDeadline: Bool, send: Frame.Request?, close: DisconnectReason?)
        case push(Frame.Push)
        case sendPong(Frame.Ping)
        /// GOAWAY on the established connection: tell the client; the waiting requests (`unsent`)
        /// end `not dispatched`; close if nothing is in flight.
        case goAway(Frame.GoAway, unsent: [UInt64], close: DisconnectReason?)
        /// The gateway refused the connection during the handshake: the attempt fails; close.
        case refused(Refusal)
        /// The gateway reported a connection error: close.
        case close(DisconnectReason)
        /// The frame broke the protocol: send ERROR, then close.
        case sendErrorAndClose(ProtocolError)
        /// MESSAGE_ACK: these messages are done (an `unavailable` answer, with the `message
        /// answers` feature, is left out: the message stays in flight and is sent again).
        case messagesAcknowledged([Frame.MessageAck.Entry])
        /// DELIVERY, from the store whose epoch WELCOME announced.
        case delivery(Frame.Delivery, epoch: UInt64)
        /// SUBSCRIBED, PUBLICATION or UNSUBSCRIBE, for the client's channel subscriptions.
        case channel(Frame.Payload)
    }

    /// The channel is active: send HELLO and start the handshake's deadline.
    /// - Returns: The HELLO to send, or `nil` if it was sent already.
    package mutating func start(now: TetherInstant) -> Frame.Hello? {
        guard case .idle = self.state else { return nil }
        self.state = .handshaking(deadline: now + self.configuration.handshakeTimeout)
        return self.configuration.hello
    }

    /// A frame arrived.
    /// - Parameter preference: What the application wants of the heartbeat; read only for WELCOME.
    package mutating func received(_ frame: Frame, now: TetherInstant, preference: @autoclosure () -> HeartbeatPreference) -> OnFrame {
        // The established connection first, without copying the state to find out.
        var answeredProbe: HeartbeatStateMachine.IdleProbe?
        if let action = self.withEstablished({ active, _ in
            answeredProbe = active.heartbeat.frameReceived(at: now)
            return Self.received(frame, active: &active, now: now)
        }) {
            if let answeredProbe { self.idleProbeReport = (answeredProbe, true) }
            switch action {
            case .goAway(let goAway, _, _):
                self.closeReason = self.closeReason ?? .goingAway(goAway)
                self.startDraining()
                let unsent = self.withEstablished { active, _ in active.requests.takeUnsent() } ?? []
                return .goAway(goAway, unsent: unsent, close: self.closeIfDrained())
            case .close(let reason):
                self.closeReason = self.closeReason ?? reason
                self.startClosing()
                return action
            case .sendErrorAndClose(let error):
                return self.violation(error)
            case .complete(let id, let response, let pastDeadline, let send, _):
                return .complete(id: id, response, pastDeadline: pastDeadline, send: send, close: self.closeIfDrained())
            default:
                return action
            }
        }
        switch self.state {
        case .handshaking:
            return self.receivedDuringHandshake(frame, now: now, preference: preference())
        case .idle, .active, .draining, .closing, .closed:
            return .none
        case ._modifying:
            preconditionFailure("re-entered the machine")
        }
    }

    private mutating func receivedDuringHandshake(_ frame: Frame, now: TetherInstant, preference: HeartbeatPreference) -> OnFrame {
        switch frame.payload {
        case .welcome(let welcome):
            guard frame.flags.contains(.checksum) else {
                return self.violation(ProtocolError(code: .checksumMismatch, message: "WELCOME must carry a checksum"))
            }
            do {
                let negotiated = try Handshake.validate(welcome, offered: self.configuration.hello)
                self.establish(negotiated, now: now, preference: preference)
                return .established(negotiated)
            } catch {
                return self.violation(ProtocolError(code: error.code, message: error.message))
            }
        case .error(let report):
            self.closeReason = self.closeReason ?? .gatewayError(code: report.code, message: report.message)
            self.startClosing()
            return .refused(.error(report))
        case .goAway(let goAway):
            self.closeReason = self.closeReason ?? .goingAway(goAway)
            self.startClosing()
            return .refused(.goAway(goAway))
        case .ping(let ping):
            return .sendPong(ping)
        case .extension:
            return .none
        case .hello, .request, .response, .push, .pong, .cancel, .message, .messageAck, .delivery, .deliveryAck, .subscribe, .subscribed,
            .publication, .unsubscribe, .presence:
            return self.violation(ProtocolError(code: .unexpectedFrame, message: "\(frame.type) before WELCOME"))
        }
    }

    /// The protocol rules of an established connection.
    private static func received(_ frame: Frame, active: inout Active, now: TetherInstant) -> OnFrame {
        let negotiated = active.negotiated
        if negotiated.checksums && !frame.flags.contains(.checksum) {
            return .sendErrorAndClose(ProtocolError(code: .checksumMismatch, message: "\(frame.type) lacks the negotiated checksum"))
        }
        switch frame.payload {
        case .response(let response):
            // Timed out or cancelled already (or never sent): PROTOCOL.md says to ignore it.
            guard let deadline = active.requests.responded(response.id) else { return .none }
            _ = active.health?.record(failed: false, at: now)  // the link carried it, whatever the status
            return .complete(id: response.id, response, pastDeadline: now >= deadline, send: active.requests.nextToSend(), close: nil)
        case .push(let push):
            return .push(push)
        case .ping(let ping):
            return .sendPong(ping)
        case .pong(let ping):
            active.heartbeat.pongReceived(id: ping.id, at: now)
            return .none
        case .goAway(let goAway):
            return .goAway(goAway, unsent: [], close: nil)
        case .error(let report):
            return .close(.gatewayError(code: report.code, message: report.message))
        case .messageAck(let ack) where negotiated.features.contains(.reliableDelivery):
            // With the answers feature, `unavailable` means "not taken now": the message stays
            // in flight and its retransmission timer sends it again.
            let entries = negotiated.features.contains(.messageAnswers) ? ack.entries.filter { $0.status != .unavailable } : ack.entries
            if active.outbox != nil {
                for entry in entries {
                    guard let (_, sample) = active.outbox!.acknowledged(entry.id, now: now) else { continue }
                    active.retransmissions.remove(entry.id)
                    if let sample { active.retransmission?.record(sample: sample) }
                }
            }
            return .messagesAcknowledged(entries)
        case .delivery(let delivery) where negotiated.features.contains(.reliableDelivery):
            guard let epoch = negotiated.deliveryEpoch else { return .none }
            return .delivery(delivery, epoch: epoch)
        case .messageAck, .delivery:
            return .sendErrorAndClose(
                ProtocolError(code: .unexpectedFrame, message: "\(frame.type) without the negotiated reliable-delivery feature")
            )
        case .subscribed, .publication, .unsubscribe, .presence:
            guard negotiated.features.contains(.channels) else {
                return .sendErrorAndClose(
                    ProtocolError(code: .unexpectedFrame, message: "\(frame.type) without the negotiated channels feature")
                )
            }
            return .channel(frame.payload)
        case .extension:
            return .none
        case .hello, .welcome, .request, .cancel, .message, .deliveryAck, .subscribe:
            return .sendErrorAndClose(
                ProtocolError(code: .unexpectedFrame, message: "\(frame.type) is not allowed from a gateway after the handshake")
            )
        }
    }

    /// The connection breaks the protocol (the frame decoder failed, a frame was not allowed, a
    /// delivery skipped a sequence): it ends with ERROR.
    package mutating func violation(_ error: ProtocolError) -> OnFrame {
        self.closeReason = self.closeReason ?? .protocolViolation(error)
        self.startClosing()
        return .sendErrorAndClose(error)
    }

    private mutating func establish(_ negotiated: Handshake.Negotiated, now: TetherInstant, preference: HeartbeatPreference) {
        let bounds = (gateway: negotiated.heartbeatInterval, ceiling: negotiated.idleTimeout / 2)
        let policy = self.configuration.heartbeat
        let pace = Self.heartbeatPace(preference, policy: policy, bounds: bounds)
        var active = Active(
            negotiated: negotiated,
            establishedAt: now,
            requests: ClientRequestTable(limit: negotiated.maxConcurrentRequests),
            heartbeat: HeartbeatStateMachine(
                configuration: .init(
                    interval: pace.interval,
                    jitter: pace.jitter,
                    timeout: RTTEstimator(
                        initialTimeout: policy.timeout,
                        minimumTimeout: min(policy.minimumTimeout, policy.timeout),
                        maximumTimeout: policy.timeout
                    ),
                    suspensionThreshold: policy.suspensionThreshold,
                    probeTimeout: policy.probeTimeout,
                    stallInterval: policy.stallInterval
                ),
                now: now
            ),
            heartbeatBounds: bounds,
            heartbeatMode: preference.mode,
            health: self.configuration.failingLink.map { LinkHealth(policy: $0) }
        )
        if negotiated.features.contains(.reliableDelivery), let reliability = self.configuration.reliability {
            active.outbox = OutboxWindow(window: reliability.window)
            active.retransmission = reliability.retransmission
        }
        self.put(CopyOnWriteBox(active), draining: false)
        self.outboundFlags = negotiated.checksums ? .checksum : []
    }

    // MARK: The heartbeat

    /// The interval for the mode (configured, or the default for the mode; never longer than
    /// the gateway's idle timeout allows) and its jitter.
    ///
    /// With NAT-timeout probing, the interval is never longer than the network is known (or
    /// being tested) to keep an idle connection. When that is what decides it, the interval is
    /// used exactly, without jitter: every idle probe then tests the interval it reports.
    static func heartbeatPace(
        _ preference: HeartbeatPreference,
        policy: HeartbeatPolicy,
        bounds: (gateway: Duration, ceiling: Duration)
    ) -> (interval: Duration, jitter: Double) {
        let mode = preference.mode
        let configured = policy.interval(for: mode)
        let wanted = max(.milliseconds(1), min(configured ?? (mode == .foreground ? bounds.gateway : bounds.ceiling), bounds.ceiling))
        if let learned = preference.learnedInterval, learned <= wanted {
            return (learned, 0)
        }
        return (wanted, policy.jitter)
    }

    /// The application's heartbeat mode, or what NAT-timeout probing learned, changed.
    ///
    /// Back in the foreground, the link is probed at once: the app is about to use it, and a
    /// connection that died in the background is found in one round trip, not one interval.
    /// - Returns: The id of a PING to send now, if any.
    package mutating func heartbeatPreferenceChanged(_ preference: HeartbeatPreference, now: TetherInstant) -> UInt64? {
        let policy = self.configuration.heartbeat
        return self.withEstablished { active, _ -> UInt64? in
            let previous = active.heartbeatMode
            active.heartbeatMode = preference.mode
            let pace = Self.heartbeatPace(preference, policy: policy, bounds: active.heartbeatBounds)
            if pace.interval != active.heartbeat.interval || pace.jitter != active.heartbeat.configuration.jitter {
                active.heartbeat.setInterval(pace.interval, jitter: pace.jitter)
            }
            guard preference.mode == .foreground, previous != .foreground else { return nil }
            if case .sendPing(let id) = active.heartbeat.probeNow(at: now) { return id }
            return nil
        } ?? nil
    }

    /// Frames were flushed: the heartbeat counts the link as used.
    package mutating func flushed(now: TetherInstant) {
        _ = self.withEstablished { active, _ in active.heartbeat.frameSent(at: now) }
    }
}
