import NIOCore
import TetherCore

/// One push, or several consecutive pushes to the same recipients, encoded once for all of
/// them: with and without a checksum, since each connection negotiated whether its frames carry
/// one.
struct EncodedPush: Sendable {
    /// The pushes themselves, in order, for connections that cannot take these bytes: a channel
    /// without Tether's encoder, one still in its handshake, or one whose size limit is below
    /// ``largestBody``.
    var pushes: [Frame.Push]
    /// The frames without a checksum, one after another.
    var plain: ByteBuffer
    /// The frames with their CRC-32C, one after another.
    var checksummed: ByteBuffer
    /// The size of the largest body among ``pushes``, for the recipients' size limits.
    var largestBody: Int

    init(_ push: Frame.Push, allocator: ByteBufferAllocator) throws(FrameEncodingError) {
        let encoder = FrameEncoder()
        self.pushes = [push]
        self.plain = try encoder.encode(Frame(.push(push)), allocator: allocator)
        self.checksummed = try encoder.encode(Frame(.push(push), flags: .checksum), allocator: allocator)
        self.largestBody = push.bodySize
    }

    /// Several encoded pushes as one, their frames joined in order.
    init(joining parts: some Collection<EncodedPush>, allocator: ByteBufferAllocator) {
        self.pushes = []
        self.largestBody = 0
        self.plain = allocator.buffer(capacity: parts.reduce(0) { $0 + $1.plain.readableBytes })
        self.checksummed = allocator.buffer(capacity: parts.reduce(0) { $0 + $1.checksummed.readableBytes })
        for part in parts {
            self.pushes.append(contentsOf: part.pushes)
            self.plain.writeImmutableBuffer(part.plain)
            self.checksummed.writeImmutableBuffer(part.checksummed)
            self.largestBody = max(self.largestBody, part.largestBody)
        }
    }

    /// The same pushes in buffers of their own.
    ///
    /// Every connection that gets the bytes retains their storage; threads that share one
    /// storage fight over its reference count, so each event loop gets its own copy.
    func copy(allocator: ByteBufferAllocator) -> EncodedPush {
        var copy = self
        copy.plain = allocator.buffer(buffer: self.plain)
        copy.checksummed = allocator.buffer(buffer: self.checksummed)
        return copy
    }
}
