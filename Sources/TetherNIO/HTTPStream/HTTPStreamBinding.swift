import Foundation

/// The constants of the HTTP-stream binding (PROTOCOL.md, section 11.5): Tether frames flow
/// from the gateway down one long streaming response to `GET <path>`, and from the client up
/// in the bodies of `POST <path>` requests naming the stream's session.
public enum HTTPStreamBinding {
    /// The header a POST names its stream's session in (and the stream's response repeats).
    public static let sessionHeader = "Tether-Session"
    /// The content type of the stream and of the POST bodies.
    public static let contentType = "application/octet-stream"
    /// How many characters a session token has: 32 random bytes in unpadded base64url.
    public static let tokenLength = 43
    /// The most bytes a client sends in one POST body; a gateway accepts at least this much
    /// (``maximumTokenLineLength`` is what precedes frames on the stream).
    public static let clientPostBodySize = 256 * 1024
    /// The longest first line of a stream a client reads before giving up on it.
    public static let maximumTokenLineLength = 128

    /// A new session token: 32 bytes from the system's secure random source, base64url.
    public static func makeToken() -> String {
        var generator = SystemRandomNumberGenerator()
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for _ in 0..<4 {
            withUnsafeBytes(of: generator.next() as UInt64) { bytes.append(contentsOf: $0) }
        }
        return Self.base64URL(bytes)
    }

    /// Whether `text` has the form of a session token (43 base64url characters).
    public static func isWellFormedToken(_ text: some StringProtocol) -> Bool {
        text.utf8.count == Self.tokenLength
            && text.utf8.allSatisfy { byte in
                (UInt8(ascii: "A")...UInt8(ascii: "Z")).contains(byte) || (UInt8(ascii: "a")...UInt8(ascii: "z")).contains(byte)
                    || (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(byte) || byte == UInt8(ascii: "-") || byte == UInt8(ascii: "_")
            }
    }

    private static func base64URL(_ bytes: [UInt8]) -> String {
        Data(bytes).base64EncodedString()
            .replacingOccurrences(of: "+", with: "-")
            .replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// The `Host` header's value for `host` and `port` (IPv6 addresses in brackets).
    package static func hostHeader(host: String, port: Int) -> String {
        host.contains(":") ? "[\(host)]:\(port)" : "\(host):\(port)"
    }
}
