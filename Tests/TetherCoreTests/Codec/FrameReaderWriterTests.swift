import NIOCore
import Testing

@testable import TetherCore

private let frames: [Frame] = [
    Frame(.hello(.init(versions: 1...1, features: .checksum, maxBodySize: 4096, clientID: "alice")), flags: .checksum),
    Frame(.request(.init(id: 1, method: "echo", timeout: .seconds(1), body: ByteBuffer(string: "hello")))),
    Frame(.response(.init(id: 1, body: ByteBuffer(repeating: 7, count: 300))), flags: .checksum),
    Frame(.push(.init(topic: "t", body: ByteBuffer()))),
    Frame(.ping(.init(id: 9, data: ByteBuffer(string: "12345678")))),
    Frame(.goAway(.init(reason: .maintenance, retryAfter: .milliseconds(250), alternateEndpoint: nil, message: "")), flags: .checksum),
]

private func encoded(_ frames: [Frame]) throws -> ByteBuffer {
    var buffer = ByteBuffer()
    for frame in frames { try FrameEncoder().encode(frame, into: &buffer) }
    return buffer
}

/// Every frame the reader has from what it was given.
private func drain(_ reader: inout FrameReader) throws -> [Frame] {
    var decoded: [Frame] = []
    while let frame = try reader.next() { decoded.append(frame) }
    return decoded
}

@Suite("Frame reader and writer (the connection handlers' codec)")
struct FrameReaderWriterTests {
    @Test("a byte stream fed one byte at a time decodes every frame, once")
    func oneByteAtATime() throws {
        var reader = FrameReader(framing: .byteStream)
        var input = try encoded(frames)
        var decoded: [Frame] = []
        while let byte = input.readSlice(length: 1) {
            reader.append(byte)
            decoded += try drain(&reader)
            reader.readComplete()
        }
        #expect(decoded == frames)
        #expect(!reader.hasPartialFrame)
    }

    @Test("many frames in one read, and a frame split across reads")
    func manyFramesPerRead() throws {
        var reader = FrameReader(framing: .byteStream)
        var input = try encoded(frames + frames)
        reader.append(input.readSlice(length: input.readableBytes / 2 + 3)!)
        var decoded = try drain(&reader)
        #expect(reader.hasPartialFrame)
        reader.readComplete()
        reader.append(input)
        decoded += try drain(&reader)
        #expect(decoded == frames + frames)
    }

    @Test("before the handshake the limit is 64 KiB; raising it lets bigger frames in; an oversized length fails before its body")
    func limits() throws {
        let big = Frame(.push(.init(topic: "t", body: ByteBuffer(repeating: 1, count: 100_000))))
        var reader = FrameReader(framing: .byteStream)
        reader.append(try encoded([big]).getSlice(at: 0, length: FrameHeader.size)!)
        #expect(throws: ProtocolError.self) { try reader.next() }

        var raised = FrameReader(framing: .byteStream)
        raised.maxBodySize = 1 << 20
        raised.append(try encoded([big]))
        #expect(try raised.next() == big)
        raised.maxBodySize = .max
        #expect(raised.maxBodySize == FrameHeader.absoluteMaximumBodySize, "never above the protocol's limit")
    }

    @Test("after an error the reader decodes nothing more, even valid frames")
    func stopsAfterError() throws {
        var reader = FrameReader(framing: .byteStream)
        var garbage = ByteBuffer(string: "GET / HTTP/1.1\r\n\r\n")
        garbage.writeImmutableBuffer(try encoded(frames))
        reader.append(garbage)
        #expect(throws: ProtocolError.self) { try reader.next() }
        #expect(reader.failed)
        reader.append(try encoded(frames))
        #expect(try reader.next() == nil)
    }

    @Test("messages: each holds exactly one frame; two, or a truncated one, are protocol errors")
    func messages() throws {
        var reader = FrameReader(framing: .messages)
        for frame in frames {
            reader.append(try encoded([frame]))
            #expect(try reader.next() == frame)
            #expect(try reader.next() == nil)
        }
        var two = FrameReader(framing: .messages)
        two.append(try encoded([frames[1], frames[2]]))
        #expect(throws: ProtocolError.self) { try two.next() }
        var truncated = FrameReader(framing: .messages)
        let whole = try encoded([frames[2]])
        truncated.append(whole.getSlice(at: 0, length: whole.readableBytes - 1)!)
        #expect(throws: ProtocolError.self) { try truncated.next() }
    }

    @Test("a byte stream's frames are joined until taken, byte for byte what FrameEncoder makes")
    func writerJoins() throws {
        var writer = FrameWriter(framing: .byteStream)
        #expect(writer.isEmpty && writer.take() == nil)
        for frame in frames { #expect(try writer.append(frame) == nil) }
        #expect(writer.take() == (try encoded(frames)))
        #expect(writer.isEmpty, "taken once")
    }

    @Test(
        "from the second batch on, a batch reuses the last one's storage once its bytes were let go, and never writes over bytes still held"
    )
    func writerReusesStorage() throws {
        func address(_ buffer: ByteBuffer) -> UnsafeRawPointer? {
            buffer.withVeryUnsafeBytes { UnsafeRawPointer($0.baseAddress) }
        }
        var writer = FrameWriter(framing: .byteStream)
        _ = try writer.append(frames[0])
        var first: ByteBuffer? = writer.take()
        let firstAddress = address(first!)
        // Still held (a write in progress): the next batch goes elsewhere, the first is intact.
        _ = try writer.append(frames[1])
        let second = writer.take()!
        #expect(address(second) != firstAddress)
        #expect(first == (try encoded([frames[0]])))
        #expect(second == (try encoded([frames[1]])))
        first = nil
        // Let go of (written): the third batch is encoded into the second's memory (the first
        // batch's storage is not kept: a connection that wrote once and went quiet holds none).
        let secondAddress = address(second)
        _ = consume second
        _ = try writer.append(frames[2])
        let third = writer.take()!
        #expect(address(third) == secondAddress)
        #expect(third == (try encoded([frames[2]])))
        _ = first
    }

    @Test("the first batch's storage is not kept; from the second on it is, until releaseStorage, which keeps frames that wait")
    func writerReleasesStorage() throws {
        var writer = FrameWriter(framing: .byteStream)
        _ = try writer.append(frames[0])
        #expect(writer.take() == (try encoded([frames[0]])))
        #expect(writer.keptCapacity == 0, "a connection that wrote once and went quiet holds nothing")
        _ = try writer.append(frames[1])
        #expect(writer.take() == (try encoded([frames[1]])))
        #expect(writer.keptCapacity > 0, "kept from the second batch on")
        _ = try writer.append(frames[2])
        writer.releaseStorage()
        #expect(writer.take() == (try encoded([frames[2]])), "frames waiting are kept")
        writer.releaseStorage()
        #expect(writer.keptCapacity == 0)
        _ = try writer.append(frames[1])
        _ = writer.take()
        #expect(writer.keptCapacity == 0, "counted again from the release")
    }

    @Test("a frame that cannot be encoded is refused; the frames joined around it are intact")
    func writerFailure() throws {
        var writer = FrameWriter(framing: .byteStream)
        _ = try writer.append(frames[1])
        let tooLong = Frame(.push(.init(topic: String(repeating: "t", count: 70_000))))
        #expect(throws: FrameEncodingError.self) { _ = try writer.append(tooLong) }
        _ = try writer.append(frames[2])
        #expect(writer.take() == (try encoded([frames[1], frames[2]])))
    }

    @Test("joined frames past maxJoinedBytes are handed out at once")
    func writerPassesLargeBatches() throws {
        var writer = FrameWriter(framing: .byteStream)
        let big = Frame(.push(.init(topic: "t", body: ByteBuffer(repeating: 1, count: 20_000))))
        var handedOut: [ByteBuffer] = []
        for _ in 0..<4 { if let bytes = try writer.append(big) { handedOut.append(bytes) } }
        let four = try encoded([big, big, big, big])
        #expect(handedOut == [four])
        #expect(writer.isEmpty)
    }

    @Test("messages: each frame is a buffer of its own, at once")
    func writerMessages() throws {
        var writer = FrameWriter(framing: .messages)
        for frame in frames {
            #expect(try writer.append(frame) == (try encoded([frame])))
        }
        #expect(writer.isEmpty)
    }

    @Test("messages: a frame is encoded into the last one's storage once its bytes were let go, and never over bytes still held")
    func writerMessagesReuseStorage() throws {
        func address(_ buffer: ByteBuffer) -> UnsafeRawPointer? {
            buffer.withVeryUnsafeBytes { UnsafeRawPointer($0.baseAddress) }
        }
        var writer = FrameWriter(framing: .messages)
        let first = try #require(try writer.append(frames[0]))
        let firstAddress = address(first)
        // Held (a transport that keeps its buffers): the next frame goes elsewhere.
        let second = try #require(try writer.append(frames[1]))
        #expect(address(second) != firstAddress)
        #expect(first == (try encoded([frames[0]])))
        let secondAddress = address(second)
        _ = consume second
        // Let go of (copied out by the WebSocket handler): the next frame reuses its memory.
        let third = try #require(try writer.append(frames[2]))
        #expect(address(third) == secondAddress)
        #expect(third == (try encoded([frames[2]])))
        #expect(writer.keptCapacity > 0)
        writer.releaseStorage()
        #expect(writer.keptCapacity == 0, "an idle connection holds nothing")
    }
}
