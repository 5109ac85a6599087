/// A violation of the wire protocol, found while decoding or by a protocol state machine.
///
/// Every protocol error maps to the ``StatusCode`` that the detecting side sends in an ERROR
/// frame before it closes the connection.
public struct ProtocolError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The code sent to the peer in the ERROR frame.
    public var code: StatusCode
    /// What exactly was wrong, for logs and for the ERROR frame's message.
    public var message: String

    public init(code: StatusCode, message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(self.code): \(self.message)" }

    static func malformed(_ frameType: FrameType, _ detail: String) -> ProtocolError {
        ProtocolError(code: .protocolError, message: "malformed \(frameType) frame: \(detail)")
    }
}
