import Logging
import NIOCore
import NIOEmbedded

@testable import Tether
@testable import TetherCore

/// A little program that drives the client's connection handler on an `EmbeddedChannel` with
/// virtual time: the fuzz target FuzzClientConnection runs the programs libFuzzer writes
/// (this file is linked into it), and `swift test` replays the committed ones
/// (FuzzTesting/Corpus/ClientConnection).
///
/// Arbitrary bytes arrive from the "gateway" (after a WELCOME the program sends, or none),
/// requests are sent and cancelled, the client drains, the clock advances, the loop runs.
/// Nothing may crash, and once the channel is closed every request must have its answer or its
/// error, and the connection its closure: a caller never waits for ever.
///
/// The bytes: the first chooses the setup (bit 0: a WELCOME without checksums arrives first;
/// bit 1: one frame per message, as over WebSocket); then operations, each an opcode byte and
/// its operands: 0 n: the next n bytes arrive (one read); 1 t: t × 100 ms pass; 2: the loop
/// runs; 3 i d: request i is sent with a deadline (d + 1) × 100 ms away; 4 i: request i is
/// cancelled; 5: the client drains; 6: what the client wrote is taken; 7: the socket's
/// writability flips.
///
/// Not thread-safe: one program runs at a time, on the thread that made it.
final class ClientConnectionProgram {
    let loop = EmbeddedEventLoop()
    private let logger = Logger(label: "fuzz") { _ in SwiftLogNoOpLogHandler() }
    static let hello = Frame.Hello(versions: 1...1, features: [], maxBodySize: 4096, clientID: "fuzz")
    static let welcome = Frame.Welcome(
        version: 1,
        features: [],
        connectionID: 1,
        heartbeatInterval: .seconds(10),
        idleTimeout: .seconds(30),
        maxBodySize: 4096,
        maxConcurrentRequests: 2
    )

    /// What completed, counted on the (embedded) event loop, which is the program's thread.
    private final class Settled: @unchecked Sendable {
        var requests = 0
        var closure = false
    }

    /// Runs one program.
    /// - Returns: What went wrong, or `nil`.
    func run(_ program: some Collection<UInt8>) -> String? {
        var input = Array(program)[...]
        guard let setup = input.popFirst() else { return nil }
        let channel = EmbeddedChannel(loop: self.loop)
        let settled = Settled()
        let established = self.loop.makePromise(of: Handshake.Negotiated.self)
        let closed = self.loop.makePromise(of: ConnectionClosure.self)
        closed.futureResult.whenComplete { _ in settled.closure = true }
        let handler = ClientConnectionHandler(
            configuration: .init(
                hello: Self.hello,
                handshakeTimeout: .seconds(5),
                heartbeat: HeartbeatPolicy(timeout: .seconds(5), minimumTimeout: .seconds(5)),
                reliability: nil
            ),
            maxInboundBodySize: 4096,
            framing: setup & 2 == 0 ? .byteStream : .messages,
            clock: EventLoopClock(self.loop),
            callbacks: .init(push: { _ in }, goAway: { _ in }, reliable: nil),
            established: established,
            closed: closed,
            logger: self.logger
        )
        try! channel.pipeline.syncOperations.addHandler(handler)
        try! channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        if setup & 1 != 0 {
            _ = try? channel.writeInbound(
                try! FrameEncoder().encode(Frame(.welcome(Self.welcome), flags: .checksum), allocator: channel.allocator)
            )
        }
        var requests = 0
        while channel.isActive, let opcode = input.popFirst() {
            switch opcode % 8 {
            case 0:
                let length = Int(input.popFirst() ?? 0)
                let bytes = input.prefix(length)
                input = input.dropFirst(length)
                _ = try? channel.writeInbound(ByteBuffer(bytes: bytes))
            case 1:
                self.loop.advanceTime(by: .milliseconds(100 * Int64(input.popFirst() ?? 0)))
            case 2:
                self.loop.run()
            case 3:
                let id = UInt64(input.popFirst() ?? 0)
                let deadline = EventLoopClock(self.loop).now + .milliseconds(100 * (1 + Int64(input.popFirst() ?? 0)))
                let promise = self.loop.makePromise(of: ByteBuffer.self)
                promise.futureResult.whenComplete { _ in settled.requests += 1 }
                requests += 1
                handler.sendRequest(.init(id: id, method: "m", body: ByteBuffer()), deadline: deadline, waiter: .promise(promise))
            case 4:
                handler.cancelRequest(id: UInt64(input.popFirst() ?? 0))
            case 5:
                handler.drain(for: .shutdown)
            case 6:
                while let _ = try? channel.readOutbound(as: ByteBuffer.self) {}
            default:
                channel.isWritable.toggle()
                channel.pipeline.fireChannelWritabilityChanged()
            }
        }
        _ = try? channel.finish(acceptAlreadyClosed: true)
        self.loop.run()
        self.loop.advanceTime(by: .seconds(600))
        self.loop.run()
        established.fail(CancellationError())  // no effect if it succeeded; a promise must complete
        if settled.requests != requests {
            return "\(requests - settled.requests) of \(requests) requests have neither an answer nor an error after the close"
        }
        return settled.closure ? nil : "the closed channel's closure was never reported"
    }

    /// Programs that reach an established connection's every path: requests answered, refused,
    /// cancelled and timed out, a push, a PING, GOAWAY and ERROR from the gateway, a drain.
    static func seeds() throws -> [String: [UInt8]] {
        func chunk(_ payload: Frame.Payload) throws -> [UInt8] {
            // A handshake frame carries a checksum (PROTOCOL.md 4.2); the others need none.
            let flags: FrameFlags = if case .welcome = payload { .checksum } else { [] }
            let bytes = try FrameEncoder().encode(Frame(payload, flags: flags), allocator: ByteBufferAllocator())
            return [0, UInt8(bytes.readableBytes)] + Array(bytes.readableBytesView)
        }
        let answered =
            try [3, 1, 10, 3, 2, 10, 3, 3, 10, 2] + chunk(.response(.init(id: 1, body: ByteBuffer(string: "a"))))
            + chunk(.response(.init(id: 2, status: .invalidRequest, message: "no"))) + [2, 6]
        return [
            "answered": [1] + answered,
            "answered-as-messages": [3] + answered,
            "cancel-and-timeout": [1, 3, 1, 10, 3, 2, 1, 2, 4, 1, 1, 5, 2, 6],
            "push-ping": try [1] + chunk(.push(.init(topic: "t", body: ByteBuffer(string: "p")))) + chunk(.ping(.init(id: 4))) + [2, 6],
            "goaway-drain": try [1, 3, 1, 50] + chunk(.goAway(.init(reason: .shutdown, message: "bye"))) + [2, 5, 2, 6, 1, 100, 2],
            "error": try [1, 3, 9, 50] + chunk(.error(.init(code: .protocolError, message: "bad"))) + [2],
            "welcome-by-hand": try [0] + chunk(.welcome(Self.welcome)) + [3, 1, 10, 2, 6],
        ]
    }
}
