/// A connection a transport could not set up, or that its transport layer ended: a failed TLS
/// handshake, a certificate that matches no pin, a refused WebSocket upgrade, a WebSocket
/// closed by the peer.
///
/// Transports throw it from ``ClientTransport/connect(to:timeout:eventLoop:initializer:)`` and
/// fire it down the pipeline; the client reports it as a `TetherError` with a code of its own
/// (`tlsFailed`, `certificatePinMismatch`, `webSocketUpgradeFailed`), not as a lost connection.
public struct TransportError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What went wrong, in kinds a program can act on.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        enum Value: Hashable, Sendable {
            case tlsHandshakeFailed, certificatePinMismatch, webSocketUpgradeFailed, webSocketClosed, timedOut, proxyFailed
            case httpStreamFailed
        }
        let value: Value
        init(_ value: Value) { self.value = value }

        /// The TLS handshake failed: an untrusted or expired certificate, a name that does not
        /// match, no common protocol version or ALPN protocol.
        public static let tlsHandshakeFailed = Code(.tlsHandshakeFailed)
        /// The server's certificate is trusted but its public key matches none of the pins.
        public static let certificatePinMismatch = Code(.certificatePinMismatch)
        /// The server did not accept the WebSocket upgrade (an HTTP status other than 101, or
        /// a response without the `tether.v1` subprotocol).
        public static let webSocketUpgradeFailed = Code(.webSocketUpgradeFailed)
        /// The peer closed the WebSocket; ``TransportError/webSocketCloseCode`` says how.
        public static let webSocketClosed = Code(.webSocketClosed)
        /// The TLS handshake or the WebSocket upgrade did not finish within the connect timeout.
        public static let timedOut = Code(.timedOut)
        /// The HTTP proxy could not be reached, or did not open the `CONNECT` tunnel: it wants
        /// credentials or refused them, does not allow the gateway's port, or did not answer.
        public static let proxyFailed = Code(.proxyFailed)
        /// The HTTP stream could not be opened or broke: the gateway answered the stream's GET
        /// or a POST with an error status (`404` for an unknown path or session, `410` for an
        /// ended session, …), or the stream did not start with a session token.
        public static let httpStreamFailed = Code(.httpStreamFailed)

        public var description: String {
            switch self.value {
            case .tlsHandshakeFailed: "TLS handshake failed"
            case .certificatePinMismatch: "certificate pin mismatch"
            case .webSocketUpgradeFailed: "WebSocket upgrade failed"
            case .webSocketClosed: "WebSocket closed"
            case .timedOut: "timed out"
            case .proxyFailed: "HTTP proxy failed"
            case .httpStreamFailed: "HTTP stream failed"
            }
        }
    }

    /// What went wrong.
    public var code: Code
    /// A sentence for people: what happened and, where it helps, what to check.
    public var message: String
    /// With ``Code/webSocketClosed``, the close code the peer sent (RFC 6455, section 7.4).
    public var webSocketCloseCode: UInt16?
    /// The underlying error's description, if there was one.
    public var cause: String?

    public init(code: Code, message: String, webSocketCloseCode: UInt16? = nil, cause: (any Error)? = nil) {
        self.code = code
        self.message = message
        self.webSocketCloseCode = webSocketCloseCode
        self.cause = cause.map { "\($0)" }
    }

    public var description: String { "\(self.code): \(self.message)" }
}
