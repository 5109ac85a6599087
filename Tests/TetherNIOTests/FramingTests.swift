import NIOCore
import NIOEmbedded
import NIOTestUtils
import Testing

@testable import TetherCore
@testable import TetherNIO

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

@Suite("Framing for tools and test peers")
struct FramingTests {
    @Test("FrameDecoder passes NIO's ByteToMessageDecoderVerifier (byte-at-a-time, all-at-once, and everything between)")
    func decoderVerifier() throws {
        let pairs = try frames.map { frame in (try encoded([frame]), [frame]) } + [(try encoded(frames), frames)]
        try ByteToMessageDecoderVerifier.verifyDecoder(inputOutputPairs: pairs) {
            FrameDecoder(maxBodySize: 4096)
        }
    }

    @Test("TetherFraming's pipeline reads frames fed one byte at a time and writes the exact bytes of FrameEncoder")
    func pipeline() throws {
        let channel = EmbeddedChannel()
        try TetherFraming.addHandlers(to: channel.pipeline.syncOperations, maxBodySize: 4096)
        var input = try encoded(frames)
        while let byte = input.readSlice(length: 1) {
            try channel.writeInbound(byte)
        }
        for frame in frames {
            #expect(try channel.readInbound(as: Frame.self) == frame)
        }
        #expect(try channel.readInbound(as: Frame.self) == nil)
        for frame in frames {
            try channel.writeOutbound(frame)
            #expect(try channel.readOutbound(as: ByteBuffer.self) == (try encoded([frame])))
        }
        #expect(try channel.finish().isClean)
    }

    @Test("TetherFraming's limit holds: an oversized length fails before its body arrives")
    func pipelineLimit() throws {
        let channel = EmbeddedChannel()
        try TetherFraming.addHandlers(to: channel.pipeline.syncOperations, maxBodySize: 1024)
        let header = try encoded([Frame(.push(.init(topic: "t", body: ByteBuffer(repeating: 0, count: 5000))))]).getSlice(
            at: 0,
            length: FrameHeader.size
        )!
        do {
            try channel.writeInbound(header)
            Issue.record("expected frameTooLarge")
        } catch let error as ProtocolError {
            #expect(error.code == .frameTooLarge)
        }
        _ = try? channel.finish()
    }
}
