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
