/// The protocol rules of one gateway connection: the handshake, which frames are allowed when,
/// the requests in flight, and draining after GOAWAY.
///
/// ```
///  awaitingHello ──HELLO──▶ negotiating ──WELCOME sent──▶ established ──drain──▶ draining
///        │                       │                            │                      │
///        └─────────── ERROR / violation / close ──────────────┴──────────────────────┴──▶ closed
/// ```
/// While draining (after GOAWAY), new requests are refused with ``StatusCode/unavailable``
/// (their handler never runs, so the client may send them again elsewhere), requests in flight
/// are answered, and the gateway waits for the *client* to close the connection: only the
/// client knows when it has no more requests on the wire. (The gateway's handler closes it
/// anyway when its grace period ends.)
///
/// The machine classifies frames; the requests in flight are its owner's (the gateway's
/// connection machine keeps them, with their deadlines and handlers).
package struct GatewaySessionStateMachine: Sendable {
    package enum Phase: Hashable, Sendable {
        case awaitingHello
        case negotiating
        case established(Handshake.Negotiated)
        case draining(Handshake.Negotiated)
        case closed
    }

    /// What the handler must do with an inbound frame.
    package enum InboundAction: Hashable, Sendable {
        /// Pass the HELLO to the application layer, which authenticates and answers it.
        case forwardHello(Frame.Hello)
        /// Pass the request to the application layer.
        case forwardRequest(Frame.Request)
        /// Cancel the request, if it is in flight: stop its handler, send no RESPONSE for it.
        case cancelRequest(Frame.Cancel)
        /// Answer the request at once with this status; its handler must not run.
        case refuseRequest(Frame.Response)
        /// Pass the reliable message to the application layer.
        case forwardMessage(Frame.Message)
        /// The client received every delivery up to a sequence number.
        case forwardDeliveryAck(Frame.DeliveryAck)
        /// Answer with a PONG echoing this PING.
        case replyPong(Frame.Ping)
        /// The client reported a connection error: close.
        case peerError(Frame.ErrorReport)
        /// The frame breaks the protocol: send ERROR with this error, then close.
        case violation(ProtocolError)
        /// Nothing to do.
        case ignore
    }

    package private(set) var phase: Phase = .awaitingHello

    package init() {}

    /// The negotiated parameters once established.
    package var negotiated: Handshake.Negotiated? {
        switch self.phase {
        case .established(let negotiated), .draining(let negotiated): negotiated
        case .awaitingHello, .negotiating, .closed: nil
        }
    }

    /// The flags to set on every outbound frame.
    @inlinable
    package var outboundFlags: FrameFlags {
        switch self.phase {
        case .awaitingHello, .negotiating: [.checksum]  // WELCOME and handshake errors carry checksums
        case .established(let negotiated), .draining(let negotiated): negotiated.checksums ? [.checksum] : []
        case .closed: [.checksum]  // a closing ERROR carries one whatever was negotiated
        }
    }

    /// Classifies an inbound frame.
    package mutating func received(_ frame: Frame) -> InboundAction {
        switch self.phase {
        case .closed:
            return .ignore

        case .awaitingHello:
            guard case .hello(let hello) = frame.payload else {
                if case .error(let report) = frame.payload {
                    self.phase = .closed
                    return .peerError(report)
                }
                return self.violate(.unexpectedFrame, "the first frame must be HELLO, got \(frame.type)")
            }
            guard frame.flags.contains(.checksum) else {
                return self.violate(.checksumMismatch, "HELLO must carry a checksum")
            }
            self.phase = .negotiating
            return .forwardHello(hello)

        case .negotiating:
            switch frame.payload {
            case .error(let report):
                self.phase = .closed
                return .peerError(report)
            case .pong, .extension:
                return .ignore
            default:
                return self.violate(.unexpectedFrame, "\(frame.type) before WELCOME; wait for the handshake to finish")
            }

        case .established(let negotiated), .draining(let negotiated):
            if negotiated.checksums && !frame.flags.contains(.checksum) {
                return self.violate(.checksumMismatch, "\(frame.type) lacks the negotiated checksum")
            }
            let draining = if case .draining = self.phase { true } else { false }
            switch frame.payload {
            case .request(let request):
                if draining {
                    return .refuseRequest(
                        Frame.Response(
                            id: request.id,
                            status: .unavailable,
                            message: "the gateway is going away; retry on a new connection"
                        )
                    )
                }
                return .forwardRequest(request)
            case .cancel(let cancel):
                return .cancelRequest(cancel)
            case .ping(let ping):
                return .replyPong(ping)
            case .pong, .extension:
                return .ignore
            case .error(let report):
                self.phase = .closed
                return .peerError(report)
            case .message(let message) where negotiated.features.contains(.reliableDelivery):
                // While draining, a message is not processed; the client sends it again on its
                // next connection (messages are idempotent).
                return draining ? .ignore : .forwardMessage(message)
            case .deliveryAck(let ack) where negotiated.features.contains(.reliableDelivery):
                return .forwardDeliveryAck(ack)
            case .message, .deliveryAck:
                return self.violate(.unexpectedFrame, "\(frame.type) without the negotiated reliable-delivery feature")
            case .hello, .welcome, .response, .push, .goAway, .messageAck, .delivery:
                return self.violate(.unexpectedFrame, "\(frame.type) is not allowed from a client after the handshake")
            }
        }
    }

    /// The WELCOME was sent: the connection is established.
    package mutating func welcomeSent(_ negotiated: Handshake.Negotiated) {
        if case .negotiating = self.phase {
            self.phase = .established(negotiated)
        }
    }

    /// What to do when the gateway wants a connection gone.
    package enum DrainAction: Hashable, Sendable {
        /// Send GOAWAY and wait for the client to close (bounded by the grace period).
        case sendGoAway
        /// Send GOAWAY and close at once: the handshake had not completed, no request can be in flight.
        case sendGoAwayAndClose
        /// Nothing: already draining or closed.
        case none
    }

    /// The gateway wants this connection gone.
    package mutating func drain() -> DrainAction {
        switch self.phase {
        case .established(let negotiated):
            self.phase = .draining(negotiated)
            return .sendGoAway
        case .awaitingHello, .negotiating:
            self.phase = .closed
            return .sendGoAwayAndClose
        case .draining, .closed:
            return .none
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
