// Tether's payload compression (PROTOCOL.md, section 2.5) with zlib (CompressNIO): raw
// DEFLATE, each payload on its own. The codec in TetherCore sees it only through
// PayloadDeflating and PayloadInflating.
import CompressNIO
public import NIOCore
public import TetherCore

/// Compresses the payloads of a connection's outbound frames (PROTOCOL.md, section 2.5): raw
/// DEFLATE, each payload on its own.
///
/// A payload is compressed only if it is at least ``threshold`` bytes long and shrinks; the
/// stream is reset before every payload, so that no payload shares a compression context with
/// another (a secret in one frame cannot be guessed from the size of an attacker's next one).
/// One per connection, used on its event loop: it holds zlib's state (about 256 KiB), made
/// once rather than per payload.
///
/// ```swift
/// let deflater = try PayloadDeflater(threshold: 512)
/// if deflater.deflate(body, into: &frameBuffer) { /* set COMPRESSED */ } else { frameBuffer.writeImmutableBuffer(body) }
/// ```
public final class PayloadDeflater: PayloadDeflating {
    /// The smallest payload worth compressing.
    public let threshold: Int
    private let compressor: ZlibCompressor
    /// Payload bytes given to zlib since ``takeWork()``: what compressing cost.
    private var work = 0

    /// - Parameters:
    ///   - threshold: Payloads shorter than this go as they are.
    ///   - level: zlib's level, 1 (fastest) to 9 (smallest); 6 is zlib's default.
    /// - Throws: ``ProtocolError`` if zlib cannot allocate its state.
    public init(threshold: Int, level: Int32 = 6) throws(ProtocolError) {
        self.threshold = max(1, threshold)
        do {
            // A small hash table (memory level 4: 4 KiB, not 64): it is cleared before every
            // payload, and Tether's payloads are mostly a few KiB, where a larger one gains little.
            self.compressor = try ZlibCompressor(
                algorithm: .deflate,
                configuration: .init(windowSize: 15, compressionLevel: level, memoryLevel: 4)
            )
        } catch {
            throw ProtocolError(code: .protocolError, message: "cannot set up compression: \(error)")
        }
    }

    /// Writes the compressed form of `payload` at the end of `buffer`, where the frame's body
    /// goes, without a buffer of its own in between.
    /// - Returns: `false`, with `buffer` as it was, if `payload` is below the threshold or does
    ///   not shrink: the caller writes it as it is.
    public func deflate(_ payload: ByteBuffer, into buffer: inout ByteBuffer) -> Bool {
        guard payload.readableBytes >= self.threshold else { return false }
        self.work += payload.readableBytes
        let start = buffer.writerIndex
        var input = payload
        buffer.reserveCapacity(minimumWritableBytes: self.compressor.maxSize(from: input))
        do {
            try self.compressor.reset()
            try self.compressor.deflate(from: &input, to: &buffer, flush: .finish)
        } catch {
            buffer.moveWriterIndex(to: start)
            return false  // sent as it is
        }
        let compressed = buffer.writerIndex - start
        // Not smaller: not worth it. Smaller than the receiver accepts (PROTOCOL.md 2.5: at most
        // 64 times smaller): sent as it is.
        guard compressed < payload.readableBytes, payload.readableBytes <= compressed * Compression.maximumRatio else {
            buffer.moveWriterIndex(to: start)
            return false
        }
        return true
    }

    /// The payload bytes given to zlib since the last call: what compressing cost.
    public func takeWork() -> Int {
        defer { self.work = 0 }
        return self.work
    }
}

@available(*, unavailable)
extension PayloadDeflater: Sendable {}

/// Inflates the payloads of a connection's inbound COMPRESSED frames, each on its own, never
/// past a limit: a payload that would inflate beyond the receiver's maximum body size is
/// refused (`frame too large`) once that many bytes came out, and one that would inflate to
/// more than ``Compression/maximumRatio`` times its size is refused (`protocol error`) as soon
/// as it does, whatever it claims or holds (a "zip bomb" costs the receiver at most the limit,
/// and at most 64 bytes for each byte it carried).
public final class PayloadInflater: PayloadInflating {
    private let decompressor: ZlibDecompressor
    /// Bytes inflated since ``takeWork()``: what decompressing cost.
    private var work = 0

    /// - Throws: ``ProtocolError`` if zlib cannot allocate its state.
    public init() throws(ProtocolError) {
        do {
            self.decompressor = try ZlibDecompressor(algorithm: .deflate)
        } catch {
            throw ProtocolError(code: .protocolError, message: "cannot set up decompression: \(error)")
        }
    }

    /// The inflated payload.
    /// - Parameters:
    ///   - payload: Raw DEFLATE data: exactly one complete stream.
    ///   - limit: The most bytes it may inflate to.
    ///   - type: The frame's type, for the error's message.
    /// - Throws: ``ProtocolError``: `frame too large` past `limit`, `protocol error` for data
    ///   that is not one complete DEFLATE stream.
    public func inflate(_ payload: ByteBuffer, limit: Int, of type: FrameType) throws(ProtocolError) -> ByteBuffer {
        // The tighter of the two: the receiver's body limit, and 64 bytes per compressed byte.
        let ratioLimit = payload.readableBytes * Compression.maximumRatio
        let ratioBinds = ratioLimit < limit
        let limit = min(limit, ratioLimit)
        func beyond() -> ProtocolError {
            ratioBinds
                ? ProtocolError(
                    code: .protocolError,
                    message:
                        "compressed \(type) payload of \(payload.readableBytes) bytes inflates to more than \(Compression.maximumRatio) times its size"
                )
                : ProtocolError(
                    code: .frameTooLarge,
                    message: "compressed \(type) payload of \(payload.readableBytes) bytes inflates beyond the limit of \(limit) bytes"
                )
        }
        var input = payload
        // DEFLATE shrinks typical payloads 3 to 10 times; the buffer grows (to the limit) if not.
        var output = ByteBufferAllocator().buffer(capacity: min(limit, max(1024, payload.readableBytes * 4)))
        do {
            try self.decompressor.reset()
        } catch {
            throw ProtocolError(code: .protocolError, message: "cannot reset decompression: \(error)")
        }
        while true {
            do {
                try self.decompressor.inflate(from: &input, to: &output)
                // zlib stopped with room to spare: the stream ended, or the input did first. A
                // second call with no new input tells them apart (an unfinished stream makes
                // no progress: `inputBufferOverflow`).
                if input.readableBytes == 0 {
                    if output.writableBytes == 0 { output.reserveCapacity(minimumWritableBytes: 1) }
                    try self.decompressor.inflate(from: &input, to: &output)
                }
                break
            } catch let error as CompressNIOError where error == .bufferOverflow {
                // More output than room: grow, unless the limit is reached.
                guard output.readableBytes < limit else {
                    self.work += output.readableBytes
                    throw beyond()
                }
                output.reserveCapacity(minimumWritableBytes: min(limit - output.readableBytes, max(4096, output.readableBytes)))
            } catch let error as CompressNIOError where error == .inputBufferOverflow {
                throw ProtocolError(code: .protocolError, message: "compressed \(type) payload ends before its DEFLATE stream does")
            } catch {
                throw ProtocolError(code: .protocolError, message: "compressed \(type) payload is not valid DEFLATE data: \(error)")
            }
        }
        self.work += output.readableBytes
        guard output.readableBytes <= limit else { throw beyond() }
        guard input.readableBytes == 0 else {
            throw ProtocolError(code: .protocolError, message: "compressed \(type) payload has bytes after its DEFLATE stream")
        }
        return output
    }

    /// The bytes inflated since the last call: what decompressing cost.
    public func takeWork() -> Int {
        defer { self.work = 0 }
        return self.work
    }
}

@available(*, unavailable)
extension PayloadInflater: Sendable {}

extension Compression {
    /// The compressor and decompressor of one connection, by these settings.
    package func makeCodecs() throws(ProtocolError) -> (deflater: PayloadDeflater, inflater: PayloadInflater) {
        (try PayloadDeflater(threshold: self.threshold, level: Int32(self.level)), try PayloadInflater())
    }
}
