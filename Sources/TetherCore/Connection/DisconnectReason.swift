/// Why an established connection closed.
public enum DisconnectReason: Sendable, CustomStringConvertible {
    /// The gateway or the network closed the connection.
    case closedByPeer
    /// Nothing arrived within the heartbeat timeout: the link is dead or half-open.
    case heartbeatTimeout(silentFor: Duration)
    /// The gateway sent GOAWAY and the connection drained.
    case goingAway(Frame.GoAway)
    /// The gateway broke the protocol; the client sent ERROR and closed.
    case protocolViolation(ProtocolError)
    /// The gateway sent ERROR.
    case gatewayError(code: StatusCode, message: String)
    /// The transport failed (reset, unreachable, …).
    case transportError(String)
    /// The connection was up but failing: `timedOut` of the last `of` requests sent on it went
    /// unanswered within the failing-link window
    /// (``ClientConfiguration/Connection-swift.struct/failingLink``). The client penalises the
    /// endpoint and tries the others first.
    case linkFailing(timedOut: Int, of: Int)
    /// The client is shutting down.
    case shutdown
    /// A better endpoint (earlier in the client's list) answered a probe while this connection
    /// served a fallback: the client drained this one to move there
    /// (``ClientConfiguration/Connection-swift.struct/moveUpInterval``).
    case movingUp(to: Endpoint)

    public var description: String {
        switch self {
        case .closedByPeer: "closed by the gateway or the network"
        case .heartbeatTimeout(let silence): "no sign of life for \(silence.shortDescription) (heartbeat timeout)"
        case .goingAway(let goAway):
            "gateway going away (\(goAway.reason)\(goAway.message.isEmpty ? "" : ": \(goAway.message)"))"
        case .protocolViolation(let error): "protocol violation by the gateway: \(error)"
        case .gatewayError(let code, let message): "gateway error \(code): \(message)"
        case .transportError(let message): "transport error: \(message)"
        case .linkFailing(let timedOut, let total): "link failing: \(timedOut) of the last \(total) requests timed out"
        case .shutdown: "client shut down"
        case .movingUp(let endpoint): "moving up to \(endpoint)"
        }
    }
}
