import NIOCore
import SwiftProtobuf

extension SwiftProtobuf.Message {
    /// The message in protobuf binary format, as a `ByteBuffer`.
    func serializedByteBuffer() throws -> ByteBuffer {
        let bytes: [UInt8] = try self.serializedBytes()
        return ByteBuffer(bytes: bytes)
    }

    /// Decodes a message from the readable bytes of a buffer, without copying them.
    init(decoding buffer: ByteBuffer) throws {
        self = try buffer.withUnsafeReadableBytes { bytes in
            try Self(serializedBytes: bytes.bytes)
        }
    }
}
