public import NIOCore

/// Compresses the payloads of a connection's outbound frames (PROTOCOL.md, section 2.5), as the
/// encoder and the frame writer see it: `TetherCompression`'s `PayloadDeflater` (zlib) is the
/// one Tether uses.
public protocol PayloadDeflating: AnyObject {
    /// The smallest payload worth compressing.
    var threshold: Int { get }
    /// Writes the compressed form of `payload` at the end of `buffer`.
    /// - Returns: `false`, with `buffer` as it was, if `payload` goes as it is (below the
    ///   threshold, or it does not shrink).
    func deflate(_ payload: ByteBuffer, into buffer: inout ByteBuffer) -> Bool
    /// The payload bytes compressed since the last call: what compressing cost.
    func takeWork() -> Int
}

/// Inflates the payloads of a connection's inbound COMPRESSED frames, as the decoder and the
/// frame reader see it: `TetherCompression`'s `PayloadInflater` (zlib) is the one Tether uses.
public protocol PayloadInflating: AnyObject {
    /// The inflated payload, never past `limit` bytes nor ``Compression/maximumRatio`` times
    /// its size.
    /// - Throws: ``ProtocolError``: `frame too large` past `limit`, `protocol error` for data
    ///   that is not one complete DEFLATE stream or inflates past the ratio.
    func inflate(_ payload: ByteBuffer, limit: Int, of type: FrameType) throws(ProtocolError) -> ByteBuffer
    /// The bytes inflated since the last call: what decompressing cost.
    func takeWork() -> Int
}

/// How a side compresses payloads once both offered ``Features/compression`` (PROTOCOL.md,
/// section 2.5). Each side compresses what it sends by its own settings; it inflates whatever
/// it receives, up to its maximum body size.
///
/// ```swift
/// configuration.connection.compression = try Compression(threshold: 1024, level: 1)  // client
/// configuration.compression = nil                                                     // gateway: not offered
/// ```
public struct Compression: Sendable, Hashable {
    /// Payloads shorter than this go uncompressed: below a few hundred bytes DEFLATE saves
    /// little and costs a zlib call each.
    public var threshold: Int
    /// zlib's level: 1 (fastest) to 9 (smallest).
    public var level: Int

    /// - Throws: ``ConfigurationError`` for a threshold below 1 or a level outside 1...9.
    public init(threshold: Int = 512, level: Int = 6) throws(ConfigurationError) {
        self.threshold = threshold
        self.level = level
        try self.validate()
    }

    /// Payloads of 512 bytes or more, at zlib's default level 6.
    public static var defaults: Compression { try! Compression() }

    /// The most a compressed payload may inflate: 64 times its compressed size (PROTOCOL.md
    /// 2.5). A sender sends a payload that would compress more than that as it is; a receiver
    /// refuses one that inflates more (`protocol error`).
    public static let maximumRatio = 64

    public func validate() throws(ConfigurationError) {
        guard self.threshold >= 1 else { throw ConfigurationError("compression.threshold must be at least 1 byte") }
        guard (1...9).contains(self.level) else { throw ConfigurationError("compression.level must be from 1 to 9") }
    }
}
