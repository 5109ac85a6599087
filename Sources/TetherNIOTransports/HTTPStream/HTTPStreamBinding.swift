import Crypto
import Foundation
public import NIOCore
package import NIOHTTP2
import TetherNIO

/// The constants of the HTTP-stream binding (PROTOCOL.md, section 11.5): Tether frames flow
/// from the gateway down one long streaming response to `GET <path>`, and from the client up
/// in the bodies of `POST <path>` requests naming the stream's session.
public enum HTTPStreamBinding {
    /// The header a POST names its stream's session in (and the stream's response repeats).
    public static let sessionHeader = "Tether-Session"
    /// The header a POST proves in that it comes from the stream's reader: the
    /// ``proof(key:post:body:)`` of its body with the session key only the stream carries.
    public static let proofHeader = "Tether-Proof"
    /// How many characters a session key and a proof have: 32 bytes in unpadded base64url.
    public static let keyLength = 43
    /// The content type of the stream and of the POST bodies.
    public static let contentType = "application/octet-stream"
    /// How many characters a session token has: 32 random bytes in unpadded base64url.
    public static let tokenLength = 43
    /// The most bytes a client sends in one POST body; a gateway accepts at least this much
    /// (``maximumTokenLineLength`` is what precedes frames on the stream).
    public static let clientPostBodySize = 256 * 1024
    /// The longest first line of a stream a client reads before giving up on it.
    public static let maximumTokenLineLength = 128

    /// A new session key: 32 bytes from the system's secure random source, base64url. It is
    /// sent in the stream's first line only (never in a header), so that only the stream's
    /// reader has it.
    public static func makeKey() -> String {
        var generator = SystemRandomNumberGenerator()
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        for _ in 0..<4 { withUnsafeBytes(of: generator.next() as UInt64) { bytes.append(contentsOf: $0) } }
        return Self.base64URL(bytes)
    }

    /// The stream's first line, without its line feed: the token, a space, the session key.
    public static func sessionLine(token: String, key: String) -> String {
        "\(token) \(key)"
    }

    /// The token and the key of a stream's first line (without its line feed; a `\r` before it
    /// is allowed); `nil` if it is not a well-formed session line.
    public static func parseSessionLine(_ line: some StringProtocol) -> (token: String, key: String)? {
        var line = Substring(line)
        if line.hasSuffix("\r") { line.removeLast() }
        let fields = line.split(separator: " ", omittingEmptySubsequences: false)
        guard fields.count == 2, Self.isWellFormedToken(fields[0]), Self.isWellFormedKey(fields[1]) else { return nil }
        return (String(fields[0]), String(fields[1]))
    }

    /// Whether `text` has the form of a session key or a proof (43 base64url characters).
    public static func isWellFormedKey(_ text: some StringProtocol) -> Bool {
        Self.isWellFormedToken(text)
    }

    /// The proof a session's POST number `post` (0 for its first) carries for `body`: the
    /// HMAC-SHA256 of the POST's number (8 bytes, big-endian) followed by the body, keyed with
    /// the session key's 32 bytes, in unpadded base64url.
    /// - Returns: `nil` if `key` is not a well-formed session key.
    public static func proof(key: String, post: UInt64, body: ByteBuffer) -> String? {
        guard let keyBytes = Self.bytes(ofBase64URL: key), keyBytes.count == 32 else { return nil }
        return Self.proof(key: SymmetricKey(data: keyBytes), post: post, body: body)
    }

    /// The proof of `body` as POST number `post`, with the session key's bytes.
    static func proof(key: SymmetricKey, post: UInt64, body: ByteBuffer) -> String {
        var mac = HMAC<SHA256>(key: key)
        withUnsafeBytes(of: post.bigEndian) { mac.update(data: $0) }
        body.withUnsafeReadableBytes { mac.update(data: $0) }
        return Self.base64URL(Array(mac.finalize()))
    }

    /// The session key's bytes, as the gateway keeps them.
    static func symmetricKey(_ key: String) -> SymmetricKey? {
        guard let bytes = Self.bytes(ofBase64URL: key), bytes.count == 32 else { return nil }
        return SymmetricKey(data: bytes)
    }

    /// The bytes of unpadded base64url text.
    static func bytes(ofBase64URL text: some StringProtocol) -> [UInt8]? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.utf8.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64).map { Array($0) }
    }

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

    /// The client's HTTP/2 settings: windows of 1 MiB (HTTP/2's 64 KiB default held the stream's
    /// responses back for WINDOW_UPDATEs), 100 streams at once.
    package static var http2Connection: NIOHTTP2Handler.ConnectionConfiguration {
        var configuration = NIOHTTP2Handler.ConnectionConfiguration()
        configuration.initialSettings = [
            HTTP2Setting(parameter: .maxConcurrentStreams, value: 100),
            HTTP2Setting(parameter: .maxHeaderListSize, value: 16 * 1024),
            HTTP2Setting(parameter: .initialWindowSize, value: 1 << 20),
        ]
        return configuration
    }

    /// The client's HTTP/2 stream settings: a 1 MiB window, and a stream channel that stays
    /// writable up to 64 KiB buffered (as a socket does here), not NIOHTTP2's 8 KiB.
    package static var http2Stream: NIOHTTP2Handler.StreamConfiguration {
        var configuration = NIOHTTP2Handler.StreamConfiguration()
        configuration.targetWindowSize = 1 << 20
        configuration.outboundBufferSizeHighWatermark = 64 * 1024
        configuration.outboundBufferSizeLowWatermark = 32 * 1024
        return configuration
    }

    /// What a peer may send on one of the gateway's HTTP/2 streams before the gateway reads it:
    /// a client's largest POST (256 KiB), in one window.
    package static let gatewayStreamWindow = clientPostBodySize

    /// The gateway's HTTP/2 settings. A peer may send a stream's window whether the gateway reads
    /// it or not, so streams are few (16 at once: a session needs two, its GET and a POST) and
    /// their windows just hold a client's largest POST; 32 resets per 10 s close the connection
    /// (each is also a new connection's worth of the address's rate).
    package static var gatewayHTTP2Connection: NIOHTTP2Handler.ConnectionConfiguration {
        var configuration = NIOHTTP2Handler.ConnectionConfiguration()
        configuration.initialSettings = [
            HTTP2Setting(parameter: .maxConcurrentStreams, value: 16),
            HTTP2Setting(parameter: .maxHeaderListSize, value: 16 * 1024),
            HTTP2Setting(parameter: .initialWindowSize, value: gatewayStreamWindow),
        ]
        return configuration
    }

    /// The gateway's HTTP/2 stream settings: the window of ``gatewayStreamWindow``, writable up to
    /// 64 KiB buffered.
    package static var gatewayHTTP2Stream: NIOHTTP2Handler.StreamConfiguration {
        var configuration = NIOHTTP2Handler.StreamConfiguration()
        configuration.targetWindowSize = gatewayStreamWindow
        configuration.outboundBufferSizeHighWatermark = 64 * 1024
        configuration.outboundBufferSizeLowWatermark = 32 * 1024
        configuration.streamResetFrameRateLimit.maximumCount = 32
        configuration.streamResetFrameRateLimit.windowLength = .seconds(10)
        return configuration
    }
}
