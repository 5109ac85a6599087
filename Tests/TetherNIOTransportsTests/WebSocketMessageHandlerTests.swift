import NIOCore
import NIOEmbedded
import NIOWebSocket
import Testing
import TetherCore
import TetherNIO
import TetherNIOTransports

/// Catches the errors a handler fires, as the Tether handler above it would.
private final class ErrorCatcher: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    var errors: [any Error] = []
    var reads: [ByteBuffer] = []
    /// Whether it closes the channel when told of an error, as the gateway's handler does.
    var closesOnError = false
    func channelRead(context: ChannelHandlerContext, data: NIOAny) { self.reads.append(Self.unwrapInboundIn(data)) }
    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.errors.append(error)
        if self.closesOnError { context.close(promise: nil) }
    }
}

@Suite("WebSocket message handler")
struct WebSocketMessageHandlerTests {
    private func channel(_ role: WebSocketMessageHandler.Role, maxMessageSize: Int? = nil) throws -> (EmbeddedChannel, ErrorCatcher) {
        let channel = EmbeddedChannel()
        let catcher = ErrorCatcher()
        let handler =
            if let maxMessageSize {
                WebSocketMessageHandler(role: role, maxMessageSize: maxMessageSize)
            } else {
                WebSocketMessageHandler(role: role)
            }
        try channel.pipeline.syncOperations.addHandler(handler)
        try channel.pipeline.syncOperations.addHandler(catcher)
        try channel.connect(to: .init(ipAddress: "127.0.0.1", port: 1)).wait()
        return (channel, catcher)
    }

    private func encoded(_ payload: Frame.Payload) throws -> ByteBuffer {
        var buffer = ByteBuffer()
        try FrameEncoder().encode(Frame(payload), into: &buffer)
        return buffer
    }

    /// A frame as NIOWebSocket's decoder delivers it: with a masking key, its data is masked.
    private func frame(_ opcode: WebSocketOpcode, _ data: ByteBuffer, masked: Bool, fin: Bool = true) -> WebSocketFrame {
        guard masked else { return WebSocketFrame(fin: fin, opcode: opcode, data: data) }
        let key = WebSocketMaskingKey.random()
        var maskedData = data
        maskedData.webSocketMask(key)
        return WebSocketFrame(fin: fin, opcode: opcode, maskKey: key, data: maskedData)
    }

    /// `message` as a client sends it in fragments of `sizes` bytes (the last takes the rest):
    /// a binary frame, then continuations, each masked with a key of its own.
    private func fragments(of message: ByteBuffer, sizes: [Int]) -> [WebSocketFrame] {
        var rest = message
        var frames: [WebSocketFrame] = []
        for size in sizes where rest.readableBytes > size {
            frames.append(self.frame(frames.isEmpty ? .binary : .continuation, rest.readSlice(length: size)!, masked: true, fin: false))
        }
        frames.append(self.frame(frames.isEmpty ? .binary : .continuation, rest, masked: true, fin: true))
        return frames
    }

    /// The WebSocket frames the handler wrote since the last call, as NIOWebSocket's decoder
    /// reads them: the handler writes headers itself, and the decoder checks them.
    private func sentFrames(_ channel: EmbeddedChannel) throws -> [WebSocketFrame] {
        var bytes = ByteBuffer()
        while var part = try channel.readOutbound(as: ByteBuffer.self) { bytes.writeBuffer(&part) }
        return try self.decoded(bytes)
    }

    /// WebSocket frames, as NIOWebSocket's decoder reads them from `bytes`.
    private func decoded(_ bytes: ByteBuffer) throws -> [WebSocketFrame] {
        let decoder = EmbeddedChannel(handler: ByteToMessageHandler(WebSocketFrameDecoder(maxFrameSize: 1 << 24)))
        try decoder.writeInbound(bytes)
        var frames: [WebSocketFrame] = []
        while let frame = try decoder.readInbound(as: WebSocketFrame.self) { frames.append(frame) }
        #expect(try decoder.finish().isClean, "no bytes left over: whole frames only")
        return frames
    }

    /// The one frame the handler wrote since the last call.
    private func sentFrame(_ channel: EmbeddedChannel) throws -> WebSocketFrame? {
        let frames = try self.sentFrames(channel)
        #expect(frames.count <= 1, "one frame only")
        return frames.first
    }

    /// The close code of a frame the handler wrote.
    private func closeCode(of frame: WebSocketFrame?) -> UInt16? {
        guard let frame, frame.opcode == .connectionClose else { return nil }
        var data = frame.unmaskedData
        return data.readInteger(as: UInt16.self)
    }

    @Test("a binary message goes up as one frame's bytes; a Tether frame written goes out as one binary message, masked by the client only")
    func binaryBothWays() throws {
        for role in [WebSocketMessageHandler.Role.client, .server] {
            let (channel, catcher) = try self.channel(role)
            let ping = try self.encoded(.ping(.init(id: 7)))
            try channel.writeInbound(self.frame(.binary, ping, masked: role == .server))
            #expect(catcher.reads == [ping])
            try channel.writeOutbound(ping)
            let sent = try #require(try self.sentFrame(channel))
            #expect(sent.opcode == .binary && sent.fin)
            #expect((sent.maskKey != nil) == (role == .client))
            #expect(sent.unmaskedData == ping)
            if role == .client { #expect(sent.data != ping, "the client's payload is masked on the wire") }
        }
    }

    @Test("a PING is answered with a PONG carrying its data")
    func pingAnswered() throws {
        let (channel, _) = try self.channel(.server)
        try channel.writeInbound(self.frame(.ping, ByteBuffer(string: "hello?"), masked: true))
        let pong = try #require(try self.sentFrame(channel))
        #expect(pong.opcode == .pong && pong.data == ByteBuffer(string: "hello?"))
    }

    @Test(
        "a text message is refused with close 1003; an unmasked client frame with 1002; both are reported, and a handler above that closes on the report does not change the code",
        arguments: [false, true]
    )
    func refusals(handlerAboveCloses: Bool) throws {
        let (text, textCatcher) = try self.channel(.server)
        textCatcher.closesOnError = handlerAboveCloses
        try text.writeInbound(self.frame(.text, ByteBuffer(string: "{}"), masked: true))
        let sent = try self.sentFrames(text)
        #expect(sent.count == 1, "one CLOSE only")
        #expect(self.closeCode(of: sent.first) == 1003)
        #expect((textCatcher.errors.first as? TransportError)?.code == .webSocketClosed)
        #expect(!text.isActive)

        let (unmasked, _) = try self.channel(.server)
        try unmasked.writeInbound(self.frame(.binary, try self.encoded(.ping(.init(id: 1))), masked: false))
        #expect(self.closeCode(of: try self.sentFrame(unmasked)) == 1002)
        #expect(!unmasked.isActive)
    }

    @Test(
        "closing sends the close code of the last Tether frame: 1001 after GOAWAY, 1009 after ERROR frame too large, 1002 after another protocol error, 1000 otherwise"
    )
    func closeCodes() throws {
        let goAway = Frame.Payload.goAway(.init(reason: .shutdown, retryAfter: .zero, alternateEndpoint: nil, message: "bye"))
        let cases: [(Frame.Payload?, UInt16)] = [
            (goAway, 1001),
            (.error(.init(code: .frameTooLarge, message: "big")), 1009),
            (.error(.init(code: .protocolError, message: "bad")), 1002),
            (.error(.init(code: .unauthenticated, message: "who?")), 1008),
            (.ping(.init(id: 3)), 1000),
            (nil, 1000),
        ]
        for (last, code) in cases {
            let (channel, _) = try self.channel(.server)
            if let last {
                try channel.writeOutbound(try self.encoded(last))
                _ = try self.sentFrames(channel)
            }
            channel.close(promise: nil)
            #expect(self.closeCode(of: try self.sentFrame(channel)) == code, "after \(String(describing: last))")
            #expect(!channel.isActive)
        }
    }

    @Test("a close from the peer is answered with its code and reported as webSocketClosed with that code")
    func peerCloses() throws {
        let (channel, catcher) = try self.channel(.client)
        var data = ByteBuffer()
        data.writeInteger(UInt16(1001))
        data.writeString("restarting")
        try channel.writeInbound(self.frame(.connectionClose, data, masked: false))
        #expect(self.closeCode(of: try self.sentFrame(channel)) == 1001)
        let error = try #require(catcher.errors.first as? TransportError)
        #expect(error.code == .webSocketClosed && error.webSocketCloseCode == 1001)
        #expect(error.message.contains("going away") && error.message.contains("restarting"))
        #expect(!channel.isActive)
    }

    @Test("a message in two masked fragments, or one byte per fragment, goes up whole, once")
    func fragmented() throws {
        let request = try self.encoded(.request(.init(id: 9, method: "echo", body: ByteBuffer(string: "in pieces"))))
        for sizes in [[10], Array(repeating: 1, count: request.readableBytes - 1)] {
            let (channel, catcher) = try self.channel(.server)
            for fragment in self.fragments(of: request, sizes: sizes) {
                #expect(catcher.reads.isEmpty, "nothing goes up before the last fragment")
                try channel.writeInbound(fragment)
            }
            #expect(catcher.reads == [request])
            #expect(catcher.errors.isEmpty)
            #expect(try self.sentFrames(channel).isEmpty, "no CLOSE")
            #expect(channel.isActive)
        }
    }

    @Test("a PING between the fragments of a message is answered at once; the message goes up whole after its last fragment")
    func pingBetweenFragments() throws {
        let request = try self.encoded(.request(.init(id: 3, method: "echo", body: ByteBuffer(string: "ping in between"))))
        let (channel, catcher) = try self.channel(.server)
        let fragments = self.fragments(of: request, sizes: [20])
        try channel.writeInbound(fragments[0])
        try channel.writeInbound(self.frame(.ping, ByteBuffer(string: "still there?"), masked: true))
        let pong = try #require(try self.sentFrame(channel))
        #expect(pong.opcode == .pong && pong.data == ByteBuffer(string: "still there?"))
        #expect(catcher.reads.isEmpty)
        try channel.writeInbound(fragments[1])
        #expect(catcher.reads == [request])
    }

    @Test(
        "refused with close 1002: an unmasked continuation, a continuation without a message, a new message before the last ended; with 1009: a message over the limit, counted over all its fragments",
        arguments: ["unmasked continuation", "orphan continuation", "interleaved message", "over the limit"]
    )
    func fragmentRefusals(_ case: String) throws {
        let message = ByteBuffer(repeating: 0x41, count: 100)
        let (channel, catcher) = try self.channel(.server, maxMessageSize: 150)
        let first = self.frame(.binary, message, masked: true, fin: false)
        let expected: UInt16
        switch `case` {
        case "unmasked continuation":
            try channel.writeInbound(first)
            try channel.writeInbound(self.frame(.continuation, message, masked: false, fin: true))
            expected = 1002
        case "orphan continuation":
            try channel.writeInbound(self.frame(.continuation, message, masked: true, fin: true))
            expected = 1002
        case "interleaved message":
            try channel.writeInbound(first)
            try channel.writeInbound(self.frame(.binary, message, masked: true, fin: true))
            expected = 1002
        default:
            try channel.writeInbound(first)
            try channel.writeInbound(self.frame(.continuation, message, masked: true, fin: false))
            expected = 1009
        }
        #expect(self.closeCode(of: try self.sentFrame(channel)) == expected)
        #expect(catcher.reads.isEmpty, "nothing went up")
        #expect((catcher.errors.first as? TransportError)?.webSocketCloseCode == expected)
        #expect(!channel.isActive)
    }

    @Test(
        "messages written between two flushes leave in one buffer at the flush, each a frame of its own; the client masks each with a key of its own"
    )
    func joinedUntilFlush() throws {
        for role in [WebSocketMessageHandler.Role.client, .server] {
            let (channel, _) = try self.channel(role)
            let payloads = [0, 1, 125, 126, 1_000].map { ByteBuffer(repeating: UInt8($0 % 251), count: $0) }
            var completed = 0
            for payload in payloads {
                channel.write(payload).assumeIsolated().whenSuccess { completed += 1 }
            }
            #expect(try channel.readOutbound(as: ByteBuffer.self) == nil, "nothing passes before the flush")
            #expect(completed == 0)
            channel.flush()
            #expect(completed == payloads.count, "the writes complete with the joined buffer")
            let buffers = (try? channel.readOutbound(as: ByteBuffer.self)).flatMap { $0 }
            let joined = try #require(buffers)
            #expect(try channel.readOutbound(as: ByteBuffer.self) == nil, "one buffer")
            let frames = try self.decoded(joined)
            #expect(frames.map(\.unmaskedData) == payloads)
            #expect(frames.allSatisfy { $0.fin && $0.opcode == .binary })
            let keys = frames.compactMap(\.maskKey).map { Array($0) }
            #expect(keys.count == (role == .client ? payloads.count : 0))
            #expect(Set(keys).count == keys.count, "a key per message")
        }
    }

    @Test(
        "lengths in 7, 16 and 64 bits read back by NIOWebSocket's decoder; on the server a payload over maxCopiedPayload follows its header uncopied"
    )
    func lengths() throws {
        let sizes = [125, 126, 65_535, 65_536, 100_000]
        for role in [WebSocketMessageHandler.Role.client, .server] {
            let (channel, _) = try self.channel(role)
            let payloads = sizes.map { ByteBuffer(repeating: UInt8($0 % 253), count: $0) }
            for payload in payloads { channel.write(payload, promise: nil) }
            channel.flush()
            var buffers: [ByteBuffer] = []
            while let buffer = try channel.readOutbound(as: ByteBuffer.self) { buffers.append(buffer) }
            let large = buffers.filter { buffer in
                payloads.contains { $0.readableBytes > WebSocketMessageHandler.maxCopiedPayload && $0 == buffer }
            }
            #expect(large.count == (role == .server ? 3 : 0), "passed as they are on the server only")
            var bytes = ByteBuffer()
            for var buffer in buffers { bytes.writeBuffer(&buffer) }
            let frames = try self.decoded(bytes)
            #expect(frames.map(\.unmaskedData) == payloads)
        }
    }

    @Test("frames NIOWebSocket's decoder refuses are closed with 1009 (too large) or 1002 (a bad control frame) and reported")
    func decoderRefusals() throws {
        let cases: [(NIOWebSocketError, UInt16)] = [
            (.invalidFrameLength, 1009), (.fragmentedControlFrame, 1002), (.multiByteControlFrameLength, 1002),
        ]
        for (error, code) in cases {
            let (channel, catcher) = try self.channel(.server)
            channel.pipeline.fireErrorCaught(error)
            #expect(self.closeCode(of: try self.sentFrame(channel)) == code, "\(error)")
            #expect((catcher.errors.first as? TransportError)?.webSocketCloseCode == code)
            #expect(!channel.isActive)
        }
    }

    @Test("a CLOSE's reason is cut to the 123 bytes beside its code, between characters, so that it stays UTF-8")
    func closeReasonCut() {
        #expect(Array(WebSocketMessageHandler.closeReason("short")) == Array("short".utf8))
        #expect(WebSocketMessageHandler.closeReason(String(repeating: "a", count: 200)).count == 123)
        // 60 two-byte characters and a three-byte one fill exactly 123 bytes; the next is cut.
        let exact = String(repeating: "é", count: 60) + "€"
        #expect(Array(WebSocketMessageHandler.closeReason(exact + "é")) == Array(exact.utf8))
        // 61 two-byte characters are 122 bytes; half of the 62nd would be 123 bytes of invalid UTF-8.
        let cut = WebSocketMessageHandler.closeReason(String(repeating: "é", count: 70))
        #expect(cut.count == 122)
        #expect(String(validating: Array(cut), as: UTF8.self) == String(repeating: "é", count: 61))
    }

    @Test("what was written before a close leaves before the CLOSE; a write after it fails")
    func closeAfterWrites() throws {
        let (channel, _) = try self.channel(.server)
        let request = try self.encoded(.ping(.init(id: 5)))
        channel.write(request, promise: nil)
        channel.close(promise: nil)
        let frames = try self.sentFrames(channel)
        #expect(frames.map(\.opcode) == [.binary, .connectionClose])
        #expect(frames.first?.unmaskedData == request)
        #expect(throws: (any Error).self) { try channel.writeOutbound(request) }
    }

    @Test(
        "round trips, seeded: batches of random sizes written by one role's handler, cut at random and read by NIOWebSocket's decoder and the other role's handler, arrive whole and in order"
    )
    func randomRoundTrips() throws {
        var random = SplitMix64(seed: 0x7E7E_5EED)
        for senderRole in [WebSocketMessageHandler.Role.client, .server] {
            let (sender, _) = try self.channel(senderRole)
            let receiver = EmbeddedChannel()
            let catcher = ErrorCatcher()
            try receiver.pipeline.syncOperations.addHandler(ByteToMessageHandler(WebSocketFrameDecoder(maxFrameSize: 1 << 20)))
            try receiver.pipeline.syncOperations.addHandler(
                WebSocketMessageHandler(role: senderRole == .client ? .server : .client, maxMessageSize: 1 << 20)
            )
            try receiver.pipeline.syncOperations.addHandler(catcher)
            try receiver.connect(to: .init(ipAddress: "127.0.0.1", port: 1)).wait()
            var sent: [ByteBuffer] = []
            for _ in 0..<200 {
                for _ in 0..<Int.random(in: 1...8, using: &random) {
                    let size =
                        switch Int.random(in: 0..<20, using: &random) {
                        case 0: Int.random(in: 65_536...100_000, using: &random)
                        case 1...3: Int.random(in: 126...65_535, using: &random)
                        default: Int.random(in: 0...125, using: &random)
                        }
                    // Each message's bytes differ from its neighbours': a boundary in the wrong place shows.
                    let message = ByteBuffer(repeating: UInt8(truncatingIfNeeded: sent.count &* 31 &+ 7), count: size)
                    sent.append(message)
                    sender.write(message, promise: nil)
                }
                sender.flush()
                var wire = ByteBuffer()
                while var part = try sender.readOutbound(as: ByteBuffer.self) { wire.writeBuffer(&part) }
                // Read as the network delivers it: in pieces of any size.
                while wire.readableBytes > 0 {
                    let piece = wire.readSlice(length: min(wire.readableBytes, Int.random(in: 1...4_096, using: &random)))!
                    try receiver.writeInbound(piece)
                }
            }
            #expect(catcher.errors.isEmpty, "\(catcher.errors)")
            #expect(try receiver.readOutbound(as: ByteBuffer.self) == nil, "the receiver wrote nothing (no CLOSE)")
            #expect(catcher.reads.count == sent.count)
            #expect(catcher.reads == sent, "every message whole, in order (sender: \(senderRole))")
        }
    }
}
