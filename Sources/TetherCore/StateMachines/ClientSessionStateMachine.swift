/// The protocol rules of one client connection: the handshake, which frames are allowed when,
/// and checksum enforcement.
///
/// ```
///  awaitingWelcome ──WELCOME──▶ established ──GOAWAY──▶ draining
///         │                          │                     │
///         └──────── ERROR / violation / close ─────────────┴──▶ closed
/// ```
/// The machine classifies each inbound frame into an ``InboundAction`` for its handler.
package struct ClientSessionStateMachine: Sendable {
    package enum Phase: Hashable, Sendable {
        case awaitingWelcome
        case established(Handshake.Negotiated)
        case draining(Handshake.Negotiated)
        case closed
    }

    /// What the handler must do with an inbound frame.
    package enum InboundAction: Hashable, Sendable {
        /// The handshake succeeded with these parameters.
        case established(Handshake.Negotiated)
        /// Complete the request with this id.
        case response(Frame.Response)
        /// Deliver to push subscribers.
        case push(Frame.Push)
        /// Answer with a PONG echoing this PING.
        case replyPong(Frame.Ping)
        /// A PONG arrived (liveness was already counted).
        case pong(Frame.Ping)
        /// Reliable messages were acknowledged.
        case messageAck(Frame.MessageAck)
        /// A reliable push arrived.
        case delivery(Frame.Delivery)
        /// The gateway is going away: stop sending requests, close once they are answered.
        /// During the handshake it means the attempt failed.
        case goAway(Frame.GoAway)
        /// The gateway reported a connection error: close.
        case peerError(Frame.ErrorReport)
        /// The frame breaks the protocol: send ERROR with this error, then close.
        case violation(ProtocolError)
        /// Nothing to do (for example an unknown extension frame).
        case ignore
    }

    package private(set) var phase: Phase = .awaitingWelcome
    /// The HELLO this client sent, against which the WELCOME is checked.
    package let hello: Frame.Hello

    package init(hello: Frame.Hello) {
        self.hello = hello
    }

    /// The negotiated parameters once established.
    package var negotiated: Handshake.Negotiated? {
        switch self.phase {
        case .established(let negotiated), .draining(let negotiated): negotiated
        case .awaitingWelcome, .closed: nil
        }
    }

    /// Whether a new request may be sent on this connection.
    package var acceptsRequests: Bool {
        if case .established = self.phase { return true }
        return false
    }

    /// The flags to set on every outbound frame.
    @inlinable
    package var outboundFlags: FrameFlags {
        switch self.phase {
        case .awaitingWelcome: [.checksum]  // HELLO always carries a checksum
        case .established(let negotiated), .draining(let negotiated): negotiated.checksums ? [.checksum] : []
        case .closed: [.checksum]  // a closing ERROR carries one whatever was negotiated
        }
    }

    /// Classifies an inbound frame.
    package mutating func received(_ frame: Frame) -> InboundAction {
        switch self.phase {
        case .closed:
            return .ignore

        case .awaitingWelcome:
            switch frame.payload {
            case .welcome(let welcome):
                guard frame.flags.contains(.checksum) else {
                    return self.violate(.checksumMismatch, "WELCOME must carry a checksum")
                }
                do {
                    let negotiated = try Handshake.validate(welcome, offered: self.hello)
                    self.phase = .established(negotiated)
                    return .established(negotiated)
                } catch {
                    return self.violate(error.code, error.message)
                }
            case .error(let report):
                self.phase = .closed
                return .peerError(report)
            case .goAway(let goAway):
                self.phase = .closed
                return .goAway(goAway)
            case .ping(let ping):
                return .replyPong(ping)
            case .extension:
                return .ignore
            case .hello, .request, .response, .push, .pong, .cancel, .message, .messageAck, .delivery, .deliveryAck:
                return self.violate(.unexpectedFrame, "\(frame.type) before WELCOME")
            }

        case .established(let negotiated), .draining(let negotiated):
            if negotiated.checksums && !frame.flags.contains(.checksum) {
                return self.violate(.checksumMismatch, "\(frame.type) lacks the negotiated checksum")
            }
            switch frame.payload {
            case .response(let response):
                return .response(response)
            case .push(let push):
                return .push(push)
            case .ping(let ping):
                return .replyPong(ping)
            case .pong(let ping):
                return .pong(ping)
            case .goAway(let goAway):
                self.phase = .draining(negotiated)
                return .goAway(goAway)
            case .error(let report):
                self.phase = .closed
                return .peerError(report)
            case .messageAck(let ack) where negotiated.features.contains(.reliableDelivery):
                return .messageAck(ack)
            case .delivery(let delivery) where negotiated.features.contains(.reliableDelivery):
                return .delivery(delivery)
            case .messageAck, .delivery:
                return self.violate(.unexpectedFrame, "\(frame.type) without the negotiated reliable-delivery feature")
            case .extension:
                return .ignore
            case .hello, .welcome, .request, .cancel, .message, .deliveryAck:
                return self.violate(.unexpectedFrame, "\(frame.type) is not allowed from a gateway after the handshake")
            }
        }
    }

    /// The client decided to stop sending requests (it is shutting down).
    package mutating func drain() {
        if case .established(let negotiated) = self.phase {
            self.phase = .draining(negotiated)
        }
    }

    /// The connection closed.
    package mutating func closed() {
        self.phase = .closed
    }

    private mutating func violate(_ code: StatusCode, _ message: String) -> InboundAction {
        self.phase = .closed
        return .violation(ProtocolError(code: code, message: message))
    }
}
