import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TetherCore
import TetherNIO

/// A hand-driven TCP connection to a gateway, for tests that must send what a real client never
/// would: garbage, oversized lengths, bad checksums, frames out of order, or nothing at all.
///
/// `@unchecked Sendable`: one test task at a time reads frames from it; the iterator is
/// guarded by a lock all the same.
final class RawConnection: @unchecked Sendable {
    let channel: any Channel
    private let frames: AsyncStream<Frame>
    private let iterator: NIOLockedValueBox<AsyncStream<Frame>.AsyncIterator>

    static func connect(to endpoint: Endpoint) async throws -> RawConnection {
        let (stream, continuation) = AsyncStream.makeStream(of: Frame.self)
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder(maxBodySize: 1 << 24)))
                    try channel.pipeline.syncOperations.addHandler(Collector(continuation: continuation))
                }
            }
            .connect(host: endpoint.host, port: endpoint.port)
            .get()
        return RawConnection(channel: channel, frames: stream)
    }

    private init(channel: any Channel, frames: AsyncStream<Frame>) {
        self.channel = channel
        self.frames = frames
        self.iterator = NIOLockedValueBox(frames.makeAsyncIterator())
    }

    /// Sends a frame, with a checksum unless told otherwise.
    func send(_ payload: Frame.Payload, flags: FrameFlags = .checksum) async throws {
        var buffer = ByteBuffer()
        try FrameEncoder().encode(Frame(payload, flags: flags), into: &buffer)
        try await self.send(bytes: buffer)
    }

    /// Sends raw bytes.
    func send(bytes: ByteBuffer) async throws {
        try await self.channel.writeAndFlush(bytes)
    }

    /// Sends HELLO and returns the WELCOME.
    func handshake(
        clientID: String = "raw",
        features: Features = .checksum,
        resume: Frame.Hello.Resume? = nil,
        outboxEpoch: UInt64? = nil
    ) async throws -> Frame.Welcome? {
        try await self.send(
            .hello(
                .init(
                    versions: 1...1,
                    features: features,
                    maxBodySize: 1 << 20,
                    clientID: clientID,
                    resume: resume,
                    outboxEpoch: outboxEpoch
                )
            )
        )
        guard case .welcome(let welcome)? = await self.next()?.payload else { return nil }
        return welcome
    }

    /// The next frame matching `matches`, skipping others (PONGs, for example).
    func next(where matches: (Frame.Payload) -> Bool) async -> Frame.Payload? {
        while let frame = await self.next() {
            if matches(frame.payload) { return frame.payload }
        }
        return nil
    }

    /// The entries of the next MESSAGE_ACK.
    func nextMessageAck() async -> [Frame.MessageAck.Entry]? {
        guard case .messageAck(let ack)? = await self.next(where: { if case .messageAck = $0 { true } else { false } }) else {
            return nil
        }
        return ack.entries
    }

    /// The entries of the MESSAGE_ACKs that arrive until `count` entries are in (a gateway may
    /// acknowledge several messages in one frame).
    func nextMessageAcks(count: Int) async -> [Frame.MessageAck.Entry] {
        var entries: [Frame.MessageAck.Entry] = []
        while entries.count < count, let more = await self.nextMessageAck() { entries += more }
        return entries
    }

    /// The next DELIVERY.
    func nextDelivery() async -> Frame.Delivery? {
        guard case .delivery(let delivery)? = await self.next(where: { if case .delivery = $0 { true } else { false } }) else {
            return nil
        }
        return delivery
    }

    /// The next frame from the gateway, or `nil` once the connection is closed.
    func next() async -> Frame? {
        var iterator = self.iterator.withLockedValue { $0 }
        let frame = await iterator.next()
        self.iterator.withLockedValue { $0 = iterator }
        return frame
    }

    /// Waits until the gateway closes the connection.
    func waitForClose() async throws {
        try await self.channel.closeFuture.get()
    }

    func close() {
        self.channel.close(promise: nil)
    }

    /// Stops reading from the socket, as a client that hangs would.
    func stopReading() async throws {
        try await self.channel.setOption(ChannelOptions.autoRead, value: false).get()
    }

    func resumeReading() async throws {
        try await self.channel.setOption(ChannelOptions.autoRead, value: true).get()
    }

    private final class Collector: ChannelInboundHandler, @unchecked Sendable {
        // @unchecked: only touched on the channel's event loop.
        typealias InboundIn = Frame
        let continuation: AsyncStream<Frame>.Continuation

        init(continuation: AsyncStream<Frame>.Continuation) {
            self.continuation = continuation
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            self.continuation.yield(Self.unwrapInboundIn(data))
        }

        func channelInactive(context: ChannelHandlerContext) {
            self.continuation.finish()
            context.fireChannelInactive()
        }

        func errorCaught(context: ChannelHandlerContext, error: any Error) {
            context.close(promise: nil)
        }
    }
}
