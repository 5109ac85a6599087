/// A status carried by RESPONSE frames and an error code carried by ERROR frames.
///
/// Codes 0–99 describe the outcome of one request, 100–199 describe the failure of a whole
/// connection, and 1000–65535 are free for applications. The table is in PROTOCOL.md.
public struct StatusCode: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }

    // MARK: Request outcomes (RESPONSE)

    /// The request succeeded; the body is the handler's reply.
    public static let ok = StatusCode(rawValue: 0)
    /// The request was cancelled before it completed. (The reference gateway sends no RESPONSE
    /// for a cancelled request; applications may use this status for their own cancellations.)
    public static let cancelled = StatusCode(rawValue: 1)
    /// No handler is registered for the request's method.
    public static let unknownMethod = StatusCode(rawValue: 2)
    /// The handler rejected the request's body or arguments.
    public static let invalidRequest = StatusCode(rawValue: 3)
    /// The handler did not finish before the request's deadline.
    public static let deadlineExceeded = StatusCode(rawValue: 4)
    /// The handler failed with an error it did not map to a status.
    public static let internalError = StatusCode(rawValue: 5)
    /// The gateway is going away and did not run the handler; retry on another connection.
    public static let unavailable = StatusCode(rawValue: 6)
    /// The gateway refused the request because a limit was reached.
    public static let resourceExhausted = StatusCode(rawValue: 7)
    /// The caller is not authenticated.
    public static let unauthenticated = StatusCode(rawValue: 8)
    /// The caller is authenticated but not allowed to do this.
    public static let permissionDenied = StatusCode(rawValue: 9)

    // MARK: Connection errors (ERROR)

    /// A frame was malformed: truncated fields, invalid UTF-8, reserved bits set, and so on.
    public static let protocolError = StatusCode(rawValue: 100)
    /// A frame did not start with the magic bytes.
    public static let badMagic = StatusCode(rawValue: 101)
    /// A frame's checksum did not match its bytes, or a required checksum was missing.
    public static let checksumMismatch = StatusCode(rawValue: 102)
    /// A frame announced a body larger than the receiver's limit.
    public static let frameTooLarge = StatusCode(rawValue: 103)
    /// The peers have no protocol version in common, or a frame used another version.
    public static let unsupportedVersion = StatusCode(rawValue: 104)
    /// A frame had a type the receiver does not know and may not ignore.
    public static let unknownFrameType = StatusCode(rawValue: 105)
    /// The handshake (HELLO, authentication, WELCOME) did not complete in time.
    public static let handshakeTimeout = StatusCode(rawValue: 106)
    /// A frame arrived that is not allowed in the connection's current state.
    public static let unexpectedFrame = StatusCode(rawValue: 107)

    /// The first code applications may define for themselves.
    public static let firstApplicationCode: UInt16 = 1000

    /// Whether the code describes a failed connection rather than one request.
    public var isConnectionError: Bool { (100..<200).contains(self.rawValue) }

    public var description: String {
        switch self {
        case .ok: "ok"
        case .cancelled: "cancelled"
        case .unknownMethod: "unknown method"
        case .invalidRequest: "invalid request"
        case .deadlineExceeded: "deadline exceeded"
        case .internalError: "internal error"
        case .unavailable: "unavailable"
        case .resourceExhausted: "resource exhausted"
        case .unauthenticated: "unauthenticated"
        case .permissionDenied: "permission denied"
        case .protocolError: "protocol error"
        case .badMagic: "bad magic"
        case .checksumMismatch: "checksum mismatch"
        case .frameTooLarge: "frame too large"
        case .unsupportedVersion: "unsupported version"
        case .unknownFrameType: "unknown frame type"
        case .handshakeTimeout: "handshake timeout"
        case .unexpectedFrame: "unexpected frame"
        default: "status \(self.rawValue)"
        }
    }
}
