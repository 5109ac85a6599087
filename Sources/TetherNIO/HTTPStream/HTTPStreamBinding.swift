import Foundation
package import NIOHTTP2

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

    /// The header a gateway adds to a POST it forwards to the node that holds its stream; a
    /// gateway never forwards a POST that carries it (no loops between nodes).
    public static let forwardedHeader = "Tether-Forwarded"

    /// A new session token: 32 bytes from the system's secure random source, base64url.
    /// - Parameter nodeKey: A gateway in a cluster makes its tokens' first 8 bytes its node key
    ///   (big-endian), so that any node can tell which one holds a stream; the other 24 bytes
    ///   stay random.
    public static func makeToken(nodeKey: UInt64? = nil) -> String {
        var generator = SystemRandomNumberGenerator()
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for index in 0..<4 {
            let word = index == 0 ? (nodeKey?.bigEndian ?? generator.next()) : generator.next() as UInt64
            withUnsafeBytes(of: word) { bytes.append(contentsOf: $0) }
        }
        return Self.base64URL(bytes)
    }

    /// The node key a well-formed token starts with (see ``makeToken(nodeKey:)``); `nil` for a
    /// malformed token.
    public static func nodeKey(of token: some StringProtocol) -> UInt64? {
        guard Self.isWellFormedToken(token) else { return nil }
        // The first 12 characters are 9 whole bytes (no padding needed); the key is the first 8.
        let base64 = String(token.prefix(12)).replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        guard let data = Data(base64Encoded: base64), data.count >= 8 else { return nil }
        return data.prefix(8).reduce(0) { ($0 << 8) | UInt64($1) }
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

    /// HTTP/2 settings for both ends: windows of 1 MiB (HTTP/2's 64 KiB default held every
    /// POST of 256 KiB and the stream's response back for WINDOW_UPDATEs), 100 streams at once.
    package static var http2Connection: NIOHTTP2Handler.ConnectionConfiguration {
        var configuration = NIOHTTP2Handler.ConnectionConfiguration()
        configuration.initialSettings = [
            HTTP2Setting(parameter: .maxConcurrentStreams, value: 100),
            HTTP2Setting(parameter: .maxHeaderListSize, value: 16 * 1024),
            HTTP2Setting(parameter: .initialWindowSize, value: 1 << 20),
        ]
        return configuration
    }

    /// HTTP/2 stream settings for both ends: a 1 MiB window, and a stream channel that stays
    /// writable up to 64 KiB buffered (as a socket does here), not NIOHTTP2's 8 KiB.
    package static var http2Stream: NIOHTTP2Handler.StreamConfiguration {
        var configuration = NIOHTTP2Handler.StreamConfiguration()
        configuration.targetWindowSize = 1 << 20
        configuration.outboundBufferSizeHighWatermark = 64 * 1024
        configuration.outboundBufferSizeLowWatermark = 32 * 1024
        return configuration
    }
}
