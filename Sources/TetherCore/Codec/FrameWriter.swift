public import NIOCore

/// Turns a connection's outbound frames into the buffers its channel writes: a ``FrameEncoder``
/// and the frames encoded since the last write, owned as a value by the connection's handler.
///
/// With ``Framing/byteStream``, the frames written between two flushes are joined into one
/// buffer (one `iovec` per flush, not per frame); a buffer that grows past ``maxJoinedBytes`` is
/// handed out at once, so that the channel's writability follows what was written. The buffer's
/// storage is kept from one batch to the next, from the second batch on: once the channel has
/// written a batch (it holds the storage no longer), the next is encoded into the same memory,
/// without an allocation. A connection that wrote one batch (a handshake's answer) and went
/// quiet keeps nothing; ``releaseStorage()`` lets it go when a busy one becomes idle.
///
/// With ``Framing/messages``, each frame is a buffer of its own, handed out at once, and
/// encoded into the storage of the last one: the WebSocket handler below copies each frame into
/// the message it writes, so that storage is free again by the next frame, and frames are
/// encoded without an allocation. A transport that keeps the buffers it is given makes the next
/// frame allocate anew, as it must.
///
/// ```swift
/// var writer = FrameWriter(framing: .byteStream)
/// if let bytes = try writer.append(frame) { channel.write(bytes) }   // past the join limit
/// if let bytes = writer.take() { channel.write(bytes) }              // before a flush
/// ```
public struct FrameWriter: Sendable {
    /// How many encoded bytes are joined before they are handed out without waiting for a flush.
    public static let maxJoinedBytes = 64 * 1024
    /// How the transport takes frames.
    public let framing: Framing
    private let encoder = FrameEncoder()
    private var allocator: ByteBufferAllocator
    /// Frames encoded since the last ``take()``; between batches, empty, with the storage of the
    /// last batch (until ``releaseStorage()``).
    private var joined = ByteBuffer()

    /// Batches taken since the storage was last let go (counted up to 2).
    private var batchesTaken = 0

    /// The largest storage kept from one batch to the next: a bigger one (a large frame went
    /// through) is let go when its bytes are taken.
    public static let maxKeptCapacity = 4096

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
    public mutating func append(_ frame: Frame, deflater: (any PayloadDeflating)? = nil) throws(FrameEncodingError) -> ByteBuffer? {
        switch self.framing {
        case .messages:
            self.reuseOrAllocateStorage()
            try self.encoder.encode(frame, into: &self.joined, deflater: deflater)
            let bytes = self.joined
            if self.joined.capacity > Self.maxKeptCapacity {
                self.joined = ByteBuffer()
            } else {
                self.joined.moveReaderIndex(to: self.joined.writerIndex)  // empty, the storage kept
            }
            return bytes
        case .byteStream:
            if self.joined.readableBytes == 0 { self.reuseOrAllocateStorage() }
            try self.encoder.encode(frame, into: &self.joined, deflater: deflater)
            return self.joined.readableBytes >= Self.maxJoinedBytes ? self.take() : nil
        }
    }

    /// Starts a batch (a frame with ``Framing/messages``): in the storage kept, reused as it is
    /// once the channel let go of it (new storage of the same size while a write still holds
    /// it), or in new storage big enough for a few small frames.
    private mutating func reuseOrAllocateStorage() {
        if self.joined.capacity == 0 {
            self.joined = self.allocator.buffer(capacity: 512)
        } else {
            self.joined.clear()
        }
    }

    /// The frames encoded since the last call, to write before a flush or a close.
    public mutating func take() -> ByteBuffer? {
        guard self.joined.readableBytes > 0 else { return nil }
        let bytes = self.joined
        self.batchesTaken = min(self.batchesTaken + 1, 2)
        if self.batchesTaken < 2 || self.joined.capacity > Self.maxKeptCapacity {
            self.joined = ByteBuffer()
        } else {
            // Empty, the storage kept for the next batch.
            self.joined.moveReaderIndex(to: self.joined.writerIndex)
        }
        return bytes
    }

    /// The capacity of the storage held between batches (0: none), for tests.
    var keptCapacity: Int { self.joined.readableBytes == 0 ? self.joined.capacity : 0 }

    /// Lets go of the storage kept between batches (the connection is idle), unless frames
    /// wait to be taken.
    public mutating func releaseStorage() {
        guard self.joined.readableBytes == 0 else { return }
        self.joined = ByteBuffer()
        self.batchesTaken = 0
    }
}
