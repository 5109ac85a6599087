public import TetherCore

/// The error every client operation throws.
///
/// Match on ``code``; read ``message`` for the details and ``status`` for the gateway's status
/// when the gateway answered with an error.
///
/// ```swift
/// do {
///     let reply = try await client.request("room.enter", body: body, timeout: .seconds(3))
/// } catch let error where error.code == .timedOut {
///     showRetryButton()
/// } catch where error.code == .serverError && error.status == .permissionDenied {
///     showForbidden()
/// }
/// ```
public struct TetherError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        enum Wrapped: Hashable, Sendable {
            case timedOut, cancelled, notConnected, connectionLost, serverError, protocolError
            case shutdown, invalidArgument, requestTooLarge, invalidConfiguration, handshakeFailed, invalidResponse
            case outboxFull, storage
            case tlsFailed, certificatePinMismatch, webSocketUpgradeFailed, proxyFailed, httpStreamFailed
            case notDispatched
        }

        let wrapped: Wrapped
        init(_ wrapped: Wrapped) { self.wrapped = wrapped }

        /// The request's deadline passed: waiting for a connection, or waiting for the response.
        public static let timedOut = Code(.timedOut)
        /// The caller cancelled the request (Swift task cancellation or ``TetherDataTask/cancel()``).
        public static let cancelled = Code(.cancelled)
        /// There is no connection and the client gave up trying (attempt limit reached).
        public static let notConnected = Code(.notConnected)
        /// The connection closed while the request was in flight; the gateway may or may not have run it.
        public static let connectionLost = Code(.connectionLost)
        /// The gateway answered with a non-ok status; see ``TetherError/status``.
        public static let serverError = Code(.serverError)
        /// A peer broke the wire protocol.
        public static let protocolError = Code(.protocolError)
        /// The client is shut down.
        public static let shutdown = Code(.shutdown)
        /// An argument was invalid, for example an empty method name.
        public static let invalidArgument = Code(.invalidArgument)
        /// The request body exceeds the gateway's maximum body size.
        public static let requestTooLarge = Code(.requestTooLarge)
        /// The configuration is invalid.
        public static let invalidConfiguration = Code(.invalidConfiguration)
        /// The connection opened but the handshake failed (rejected, timed out or refused).
        public static let handshakeFailed = Code(.handshakeFailed)
        /// The response arrived but its body could not be decoded into the expected type.
        public static let invalidResponse = Code(.invalidResponse)
        /// The outbox is full and ``ClientConfiguration/Reliability-swift.struct/whenFull`` is `.fail`.
        public static let outboxFull = Code(.outboxFull)
        /// The outbox's storage failed; the message was not accepted.
        public static let storage = Code(.storage)
        /// The TLS handshake failed: the gateway's certificate is not trusted (unknown
        /// authority, expired, issued for another name), or no TLS version or ALPN protocol is
        /// in common. Counts as a failed connection attempt (with backoff), like a refusal.
        public static let tlsFailed = Code(.tlsFailed)
        /// The gateway's certificate is trusted, but its public key matches none of
        /// ``ClientTLSConfiguration/pins``: someone may be intercepting the connection, or the
        /// gateway's key changed without the app's pins.
        public static let certificatePinMismatch = Code(.certificatePinMismatch)
        /// The server refused the WebSocket upgrade (an HTTP status other than 101: a wrong
        /// path, a proxy that does not pass WebSockets) or is not a Tether gateway.
        public static let webSocketUpgradeFailed = Code(.webSocketUpgradeFailed)
        /// The HTTP proxy (``TetherNIO/ProxySetting``) could not be reached or did not open the
        /// tunnel: it wants credentials or refused them, or does not allow the gateway's port.
        /// Counts as a failed connection attempt, with backoff.
        public static let proxyFailed = Code(.proxyFailed)
        /// The gateway (or something in front of it) refused the HTTP stream: an HTTP status
        /// other than `200` for the stream, or an error status for a POST, or a stream that is
        /// not a Tether stream. Counts as a failed connection attempt, with backoff.
        public static let httpStreamFailed = Code(.httpStreamFailed)
        /// Internal: the request never reached a gateway handler and can be sent again.
        static let notDispatched = Code(.notDispatched)

        public var description: String {
            switch self.wrapped {
            case .timedOut: "timed out"
            case .cancelled: "cancelled"
            case .notConnected: "not connected"
            case .connectionLost: "connection lost"
            case .serverError: "server error"
            case .protocolError: "protocol error"
            case .shutdown: "shut down"
            case .invalidArgument: "invalid argument"
            case .requestTooLarge: "request too large"
            case .invalidConfiguration: "invalid configuration"
            case .handshakeFailed: "handshake failed"
            case .invalidResponse: "invalid response"
            case .outboxFull: "outbox full"
            case .storage: "storage failure"
            case .tlsFailed: "TLS failed"
            case .certificatePinMismatch: "certificate pin mismatch"
            case .webSocketUpgradeFailed: "WebSocket upgrade failed"
            case .proxyFailed: "HTTP proxy failed"
            case .httpStreamFailed: "HTTP stream failed"
            case .notDispatched: "not dispatched"
            }
        }
    }

    /// What kind of failure this is.
    public var code: Code
    /// A description of what happened, meant for logs and developers.
    public var message: String
    /// For ``Code/serverError`` (and handshake rejections): the gateway's status code.
    public var status: StatusCode?
    /// The underlying error, if any.
    public var cause: (any Error)?

    public init(code: Code, message: String, status: StatusCode? = nil, cause: (any Error)? = nil) {
        self.code = code
        self.message = message
        self.status = status
        self.cause = cause
    }

    /// The code, the message and the gateway's status; the ``cause`` is not repeated, as the
    /// message already says what it means.
    public var description: String {
        var text = "\(self.code): \(self.message)"
        if let status = self.status { text += " [status \(status.rawValue) \(status)]" }
        return text
    }
}

extension TetherError {
    /// Wraps any error as a ``TetherError``; a ``TetherError`` is returned unchanged.
    static func wrapping(_ error: any Error, as code: Code, _ message: String) -> TetherError {
        if let error = error as? TetherError { return error }
        if error is CancellationError { return TetherError(code: .cancelled, message: "the task was cancelled") }
        if let error = error as? ProtocolError {
            return TetherError(code: .protocolError, message: "\(message): \(error.message)", status: error.code, cause: error)
        }
        return TetherError(code: code, message: "\(message): \(TransportErrors.describe(error))", cause: error)
    }
}
