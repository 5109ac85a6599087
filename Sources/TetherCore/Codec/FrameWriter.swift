public import NIOCore

/// Turns a connection's outbound frames into the buffers its channel writes: a ``FrameEncoder``
/// and the frames encoded since the last write, owned as a value by the connection's handler.
///
/// With ``Framing/byteStream``, the frames written between two flushes are joined into one
/// buffer (one allocation and one `iovec` per flush, not per frame); a buffer that grows past
/// ``maxJoinedBytes`` is handed out at once, so that the channel's writability follows what was
/// written. With ``Framing/messages``, each frame is a buffer of its own, with
/// ``messageHeadroom`` bytes free in front of it: there a WebSocket encoder writes its own
/// header (and masks in place), rather than allocating a header buffer and a second `iovec`
/// per message.
///
/// ```swift
/// var writer = FrameWriter(framing: .byteStream)
/// if let bytes = try writer.append(frame) { channel.write(bytes) }   // past the join limit
/// if let bytes = writer.take() { channel.write(bytes) }              // before a flush
/// ```
public struct FrameWriter: Sendable {
    /// How many encoded bytes are joined before they are handed out without waiting for a flush.
    public static let maxJoinedBytes = 64 * 1024
    /// The bytes left free in front of each frame with ``Framing/messages``: the largest
    /// WebSocket frame header (2 bytes, an 8-byte length, a 4-byte masking key).
    public static let messageHeadroom = 14

    /// How the transport takes frames.
    public let framing: Framing
    private let encoder = FrameEncoder()
    private var allocator: ByteBufferAllocator
    /// Frames encoded since the last ``take()``. Empty and without storage between batches, so
    /// that an idle connection holds no buffer.
    private var joined = ByteBuffer()

    /// - Parameters:
    ///   - framing: How the transport takes frames.
    ///   - allocator: The channel's allocator.
    public init(framing: Framing, allocator: ByteBufferAllocator = ByteBufferAllocator()) {
        self.framing = framing
        self.allocator = allocator
    }

    /// Whether encoded frames wait to be taken.
    public var isEmpty: Bool { self.joined.readableBytes == 0 }

    /// Encodes a frame.
    /// - Returns: Bytes to write now: the frame itself with ``Framing/messages``; the joined
    ///   frames once they pass ``maxJoinedBytes``; otherwise `nil` (take them before flushing).
    /// - Throws: ``FrameEncodingError`` if a field is over its size limit; nothing is written.
    /// - Parameter deflater: With ``Features/compression`` negotiated: compresses payloads worth it.
    public mutating func append(_ frame: Frame, deflater: PayloadDeflater? = nil) throws(FrameEncodingError) -> ByteBuffer? {
        switch self.framing {
        case .messages:
            var buffer = self.allocator.buffer(capacity: Self.messageHeadroom + FrameHeader.size + 64)
            buffer.moveWriterIndex(forwardBy: Self.messageHeadroom)
            buffer.moveReaderIndex(forwardBy: Self.messageHeadroom)
            try self.encoder.encode(frame, into: &buffer, deflater: deflater)
            return buffer
        case .byteStream:
            if self.joined.readableBytes == 0 {
                // A new batch: a buffer of its own, big enough for a few small frames.
                self.joined = self.allocator.buffer(capacity: 512)
            }
            try self.encoder.encode(frame, into: &self.joined, deflater: deflater)
            return self.joined.readableBytes >= Self.maxJoinedBytes ? self.take() : nil
        }
    }

    /// The frames encoded since the last call, to write before a flush or a close.
    public mutating func take() -> ByteBuffer? {
        guard self.joined.readableBytes > 0 else { return nil }
        defer { self.joined = ByteBuffer() }
        return self.joined
    }
}
