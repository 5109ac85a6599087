import Crypto
import NIOCore
import NIOWebSocket

/// The header of a WebSocket frame as ``WebSocketMessageHandler`` writes it (RFC 6455, 5.2):
/// FIN set (Tether never fragments what it sends), the opcode, the payload's length in 7, 16
/// or 64 bits, and on the client the masking key.
///
/// Reading stays NIOWebSocket's (`WebSocketFrameDecoder`); only writing is done here, so that
/// a batch of frames shares one buffer and one `iovec`, as it does over TCP. The tests decode
/// what this writes with NIOWebSocket's decoder.
struct WebSocketFrameHeader {
    /// The largest header: 2 bytes, a 64-bit length and a masking key.
    static let maxSize = 14

    let opcode: WebSocketOpcode
    let length: Int
    let maskKey: WebSocketMaskingKey?

    /// The header's size in bytes.
    var size: Int {
        let extendedLength = self.length <= 125 ? 0 : self.length <= Int(UInt16.max) ? 2 : 8
        return 2 + extendedLength + (self.maskKey == nil ? 0 : 4)
    }

    /// Writes the header at `buffer`'s writer index.
    func write(into buffer: inout ByteBuffer) {
        let mask: UInt8 = self.maskKey == nil ? 0 : 0x80
        buffer.writeInteger(0x80 | UInt8(webSocketOpcode: self.opcode))  // FIN, no extension bits
        switch self.length {
        case 0...125:
            buffer.writeInteger(UInt8(self.length) | mask)
        case 126...Int(UInt16.max):
            buffer.writeInteger(126 | mask)
            buffer.writeInteger(UInt16(self.length))
        default:
            buffer.writeInteger(127 | mask)
            buffer.writeInteger(UInt64(self.length))
        }
        if let maskKey = self.maskKey { buffer.writeBytes(maskKey) }
    }

    /// Writes a whole frame at `message`'s writer index: this header, then `payload`, masked
    /// with the header's key if it has one.
    func write(payload: ByteBuffer, into message: inout ByteBuffer) {
        self.write(into: &message)
        let start = message.writerIndex
        message.writeImmutableBuffer(payload)
        guard let maskKey = self.maskKey else { return }
        // NIOWebSocket masks a buffer's readable bytes: those of the payload just written.
        let readerIndex = message.readerIndex
        message.moveReaderIndex(to: start)
        message.webSocketMask(maskKey)
        message.moveReaderIndex(to: readerIndex)
    }
}

/// Masking keys from a strong random source (RFC 6455, 5.3), drawn 1 KiB at a time:
/// `WebSocketMaskingKey.random()` costs a `getrandom` system call per message on Linux.
struct MaskingKeys {
    private var pool: [UInt8] = []
    private var index = 0

    mutating func next() -> WebSocketMaskingKey {
        if self.index + 4 > self.pool.count { self.refill() }
        defer { self.index += 4 }
        return WebSocketMaskingKey(self.pool[self.index..<self.index + 4])!
    }

    private mutating func refill() {
        // A key of swift-crypto is 1 KiB from the platform's CSPRNG (BoringSSL's RAND_bytes
        // on Linux), in one call.
        self.pool = SymmetricKey(size: SymmetricKeySize(bitCount: 8192)).withUnsafeBytes { Array($0) }
        self.index = 0
    }
}
