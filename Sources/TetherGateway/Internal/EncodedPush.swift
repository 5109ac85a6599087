import NIOCore
import TetherCore

/// A push encoded once for all its recipients: with and without a checksum, since each
/// connection negotiated whether its frames carry one.
struct EncodedPush: Sendable {
    /// The push itself, for connections that cannot take bytes (a channel without Tether's
    /// encoder) and for those still in their handshake.
    var push: Frame.Push
    /// The frame without a checksum.
    var plain: ByteBuffer
    /// The frame with its CRC-32C.
    var checksummed: ByteBuffer

    init(_ push: Frame.Push, allocator: ByteBufferAllocator) throws(FrameEncodingError) {
        let encoder = FrameEncoder()
        self.push = push
        self.plain = try encoder.encode(Frame(.push(push)), allocator: allocator)
        self.checksummed = try encoder.encode(Frame(.push(push), flags: .checksum), allocator: allocator)
    }

    /// The same push in buffers of its own.
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
