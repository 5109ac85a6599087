import Histogram
import NIOCore
import NIOPosix

/// The floor: a SwiftNIO server that echoes length-prefixed frames (4-byte big-endian length,
/// then the body) with no protocol logic, and a client that is a NIO handler too: it keeps
/// `inFlight` requests on the wire and sends the next one from the event loop as each answer
/// arrives. Nothing here touches Swift concurrency on the hot path.
enum RawEcho {
    /// Splits the inbound bytes into frames (header included).
    struct FrameDecoder: ByteToMessageDecoder {
        typealias InboundOut = ByteBuffer
        mutating func decode(context: ChannelHandlerContext, buffer: inout ByteBuffer) throws -> DecodingState {
            guard let length = buffer.getInteger(at: buffer.readerIndex, as: UInt32.self),
                buffer.readableBytes >= 4 + Int(length),
                let frame = buffer.readSlice(length: 4 + Int(length))
            else { return .needMoreData }
            context.fireChannelRead(Self.wrapInboundOut(frame))
            return .continue
        }
    }

    final class EchoHandler: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer
        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            context.write(data, promise: nil)
        }
        func channelReadComplete(context: ChannelHandlerContext) {
            context.flush()
        }
    }

    static func serve(port: Int, ready: @escaping @Sendable (Int) -> Void) async throws {
        let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.tcpOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder()))
                    try channel.pipeline.syncOperations.addHandler(EchoHandler())
                }
            }
            .bind(host: "127.0.0.1", port: port)
            .get()
        ready(server.localAddress!.port!)
        try await withTaskCancellationHandler {
            try await server.closeFuture.get()
        } onCancel: {
            server.close(promise: nil)
        }
    }

    /// What a drive measured.
    struct Outcome: Sendable {
        var completed: Int
        var latency: Histogram<UInt64>
    }

    /// Keeps `inFlight` echoes on the wire until `requests` are answered or `deadline` passes.
    final class Driver: ChannelInboundHandler {
        typealias InboundIn = ByteBuffer
        typealias OutboundOut = ByteBuffer

        let request: ByteBuffer
        let inFlight: Int
        let requests: Int?
        let deadline: NIODeadline
        let done: EventLoopPromise<Outcome>
        private var sentAt = CircularBuffer<NIODeadline>()
        private var sent = 0
        private var outcome = Outcome(completed: 0, latency: Histogram(highestTrackableValue: 60_000_000_000))
        private var finished = false

        init(body: ByteBuffer, inFlight: Int, requests: Int?, deadline: NIODeadline, done: EventLoopPromise<Outcome>) {
            var request = ByteBuffer()
            request.writeInteger(UInt32(body.readableBytes))
            request.writeImmutableBuffer(body)
            self.request = request
            self.inFlight = inFlight
            self.requests = requests
            self.deadline = deadline
            self.done = done
        }

        func channelActive(context: ChannelHandlerContext) {
            for _ in 0..<self.inFlight { self.send(context: context) }
            context.flush()
            context.fireChannelActive()
        }

        private func send(context: ChannelHandlerContext) {
            if let requests, self.sent >= requests { return }
            self.sent += 1
            self.sentAt.append(.now())
            context.write(Self.wrapOutboundOut(self.request), promise: nil)
        }

        func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let now = NIODeadline.now()
            let started = self.sentAt.removeFirst()
            self.outcome.completed += 1
            _ = self.outcome.latency.record(UInt64((now - started).nanoseconds))
            if now < self.deadline { self.send(context: context) }
            if self.sentAt.isEmpty, !self.finished {
                self.finished = true
                self.done.succeed(self.outcome)
                context.close(promise: nil)
            }
        }

        func channelReadComplete(context: ChannelHandlerContext) {
            context.flush()
        }

        func channelInactive(context: ChannelHandlerContext) {
            if !self.finished { self.done.fail(ChannelError.ioOnClosedChannel) }
        }
    }

    static func drive(port: Int, body: ByteBuffer, inFlight: Int, requests: Int?, seconds: Double) async throws -> Outcome {
        let group = MultiThreadedEventLoopGroup.singleton
        let done = group.next().makePromise(of: Outcome.self)
        let deadline = NIODeadline.now() + .nanoseconds(Int64(seconds * 1e9))
        _ = try await ClientBootstrap(group: done.futureResult.eventLoop)
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(FrameDecoder()))
                    try channel.pipeline.syncOperations.addHandler(
                        Driver(body: body, inFlight: inFlight, requests: requests, deadline: deadline, done: done)
                    )
                }
            }
            .connect(host: "127.0.0.1", port: port)
            .get()
        return try await done.futureResult.get()
    }
}
