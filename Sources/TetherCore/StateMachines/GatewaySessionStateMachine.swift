/// The protocol rules of one gateway connection: the handshake, which frames are allowed when,
/// the requests in flight, and draining after GOAWAY.
///
/// ```
///  awaitingHello ──HELLO──▶ negotiating ──WELCOME sent──▶ established ──drain──▶ draining
///        │                       │                            │                      │
///        └─────────── ERROR / violation / close ──────────────┴──────────────────────┴──▶ closed
/// ```
/// While draining, new requests are refused with ``StatusCode/unavailable`` (their handler
/// never runs, so the client may retry them elsewhere) and the connection closes as soon as
/// the last request in flight is answered. Each request is answered at most once: a RESPONSE
/// for a request that was cancelled or already answered (its deadline passed) is dropped.
public struct GatewaySessionStateMachine: Sendable {
    public enum Phase: Hashable, Sendable {
        case awaitingHello
        case negotiating
        case established(Handshake.Negotiated)
        case draining(Handshake.Negotiated)
        case closed
    }

    /// What the handler must do with an inbound frame.
    public enum InboundAction: Hashable, Sendable {
        /// Pass the HELLO to the application layer, which authenticates and answers it.
        case forwardHello(Frame.Hello)
        /// Pass the request to the application layer.
        case forwardRequest(Frame.Request)
        /// Pass the cancellation of a request in flight to the application layer.
        case forwardCancel(Frame.Cancel)
        /// Answer the request at once with this status; its handler must not run.
        case refuseRequest(Frame.Response)
        /// Answer with a PONG echoing this PING.
        case replyPong(Frame.Ping)
        /// The client reported a connection error: close.
        case peerError(Frame.ErrorReport)
        /// The frame breaks the protocol: send ERROR with this error, then close.
        case violation(ProtocolError)
        /// The last request of a draining connection was cancelled: close now.
        case close
        /// Nothing to do.
        case ignore
    }

    public private(set) var phase: Phase = .awaitingHello
    private var inFlight: Set<UInt64> = []

    public init() {}

    /// The number of requests forwarded and not yet answered or cancelled.
    public var requestsInFlight: Int { self.inFlight.count }

    /// The flags to set on every outbound frame.
    public var outboundFlags: FrameFlags {
        switch self.phase {
        case .awaitingHello, .negotiating: [.checksum]  // WELCOME and handshake errors carry checksums
        case .established(let negotiated), .draining(let negotiated): negotiated.checksums ? [.checksum] : []
        case .closed: [.checksum]  // a closing ERROR carries one whatever was negotiated
        }
    }

    /// Classifies an inbound frame.
    public mutating func received(_ frame: Frame) -> InboundAction {
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
            if case .error(let report) = frame.payload {
                self.phase = .closed
                return .peerError(report)
            }
            return self.violate(.unexpectedFrame, "\(frame.type) before WELCOME; wait for the handshake to finish")

        case .established(let negotiated), .draining(let negotiated):
            if negotiated.checksums && !frame.flags.contains(.checksum) {
                return self.violate(.checksumMismatch, "\(frame.type) lacks the negotiated checksum")
            }
            let draining = if case .draining = self.phase { true } else { false }
            switch frame.payload {
            case .request(let request):
                if draining {
                    return .refuseRequest(
                        Frame.Response(id: request.id, status: .unavailable, message: "the gateway is going away; retry on a new connection")
                    )
                }
                guard self.inFlight.insert(request.id).inserted else {
                    return self.violate(.protocolError, "request id \(request.id) is already in flight")
                }
                return .forwardRequest(request)
            case .cancel(let cancel):
                guard self.inFlight.remove(cancel.requestID) != nil else { return .ignore }
                if draining && self.inFlight.isEmpty { return .close }
                return .forwardCancel(cancel)
            case .ping(let ping):
                return .replyPong(ping)
            case .pong, .extension:
                return .ignore
            case .error(let report):
                self.phase = .closed
                return .peerError(report)
            case .hello, .welcome, .response, .push, .goAway:
                return self.violate(.unexpectedFrame, "\(frame.type) is not allowed from a client after the handshake")
            }
        }
    }

    /// The WELCOME was sent: the connection is established.
    public mutating func welcomeSent(_ negotiated: Handshake.Negotiated) {
        if case .negotiating = self.phase {
            self.phase = .established(negotiated)
        }
    }

    /// What to do with a RESPONSE about to be sent.
    public enum ResponseAction: Hashable, Sendable {
        /// Send it.
        case send
        /// Send it, then close: it answers the last request of a draining connection.
        case sendAndClose
        /// Do not send it: the request was already answered (deadline) or cancelled.
        case drop
    }

    /// Whether a request with this id was forwarded and is not yet answered or cancelled.
    public func isInFlight(_ id: UInt64) -> Bool {
        self.inFlight.contains(id)
    }

    /// A RESPONSE for request `id` is about to be sent (by a handler, or because its deadline passed).
    public mutating func responseSent(id: UInt64) -> ResponseAction {
        guard self.inFlight.remove(id) != nil else { return .drop }
        if case .draining = self.phase, self.inFlight.isEmpty { return .sendAndClose }
        return .send
    }

    /// The gateway wants this connection gone.
    /// - Returns: Whether to send GOAWAY, and whether to close at once because nothing is in
    ///   flight (a connection still in its handshake gets GOAWAY and is closed at once).
    public mutating func drain() -> (sendGoAway: Bool, closeNow: Bool) {
        switch self.phase {
        case .established(let negotiated):
            self.phase = .draining(negotiated)
            return (true, self.inFlight.isEmpty)
        case .draining:
            return (false, self.inFlight.isEmpty)
        case .awaitingHello, .negotiating:
            self.phase = .closed
            return (true, true)
        case .closed:
            return (false, false)
        }
    }

    /// The connection closed.
    public mutating func closed() {
        self.phase = .closed
        self.inFlight.removeAll()
    }

    private mutating func violate(_ code: StatusCode, _ message: String) -> InboundAction {
        self.phase = .closed
        return .violation(ProtocolError(code: code, message: message))
    }
}
