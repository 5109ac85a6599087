import Logging
import NIOCore
import NIOEmbedded

@testable import TetherCore
@testable import TetherGateway

/// A little program that drives the gateway's connection handler on an `EmbeddedChannel` with
/// virtual time: the fuzz target FuzzGatewayConnection runs the programs libFuzzer writes
/// (this file is linked into it), and `swift test` replays the committed ones
/// (FuzzTesting/Corpus/GatewayConnection).
///
/// Arbitrary bytes arrive (after a HELLO the program sends, or none: the connection is then
/// established without checksums, so that the fuzzer's frames need none), the clock advances, the
/// loop runs, the client's reads stop and resume, in any order. Nothing may crash, and once
/// the channel is closed the gateway must count nothing of it: a request, task or slot left
/// behind would keep a gateway from ever shutting down.
///
/// The bytes: the first chooses the setup (bit 0: a HELLO without checksums first, so that the
/// program starts on an established connection; bit 1: one frame per message, as over
/// WebSocket, instead of a byte stream); then operations, each an opcode byte and its operand:
/// 0 n: the next n bytes arrive (one read); 1 t: t × 100 ms pass; 2: the loop runs; 3: what the
/// gateway wrote is taken; 4: the client stops or resumes reading.
///
/// Not thread-safe: one program runs at a time, on the thread that made it.
final class GatewayConnectionProgram {
    let loop = EmbeddedEventLoop()
    let gateway: Gateway
    private let services: GatewayServices
    private let logger = Logger(label: "fuzz") { _ in SwiftLogNoOpLogHandler() }
    private var connections: UInt64 = 0

    init() {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = nil
        // Two slots, so that requests also wait for one; the admission limits out of the way,
        // so that each program starts alike; a low request rate, so that it is reached.
        configuration.limits.maxConcurrentRequestsPerConnection = 2
        configuration.limits.maxBodySize = 4096
        configuration.limits.maxBufferedInboundBytes = 8192
        configuration.limits.maxConnections = 1 << 30
        configuration.limits.maxConnectionsPerAddress = 1 << 30
        configuration.limits.handshakesPerSecond = 1 << 30
        configuration.limits.handshakesPerSecondPerAddress = 1 << 30
        configuration.limits.requestsPerSecondPerConnection = 50
        self.gateway = try! Gateway(
            configuration: configuration,
            eventLoopGroup: self.loop,
            clock: EventLoopClock(self.loop),
            logger: self.logger
        )
        self.gateway.handle("task") { request, _ in request.body }
        // Suspends, so that its slot stays taken until the loop runs: later requests wait.
        self.gateway.handle("yield") { request, _ in
            await Task.yield()
            return request.body
        }
        self.gateway.handleInline("inline") { request, _ in request.body }
        self.gateway.handle("join") { request, context in ByteBuffer(string: "\(context.join(String(buffer: request.body)))") }
        self.services = self.gateway.services
    }

    /// Runs one program.
    /// - Returns: What went wrong, or `nil`.
    func run(_ program: some Collection<UInt8>) -> String? {
        var input = Array(program)[...]
        guard let setup = input.popFirst() else { return nil }
        self.connections += 1
        let channel = EmbeddedChannel(loop: self.loop)
        let handler = GatewayConnectionHandler(
            services: self.services,
            id: self.connections,
            framing: setup & 2 == 0 ? .byteStream : .messages,
            eventLoop: self.loop,
            pushes: self.gateway.pushBatchers[ObjectIdentifier(self.loop)],
            logger: self.logger
        )
        try! channel.pipeline.syncOperations.addHandler(handler)
        try! channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        if setup & 1 != 0 {
            let hello = Frame.Hello(versions: 1...1, features: [], maxBodySize: 4096, clientID: "fuzz-\(self.connections)")
            _ = try? channel.writeInbound(try! FrameEncoder().encode(Frame(.hello(hello), flags: .checksum), allocator: channel.allocator))
            self.loop.run()
        }
        while channel.isActive, let opcode = input.popFirst() {
            switch opcode % 5 {
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
        let counted = self.gateway.activity.active
        return counted == 0 ? nil : "a closed connection is still counted by the gateway (\(counted)): something it started never ended"
    }

    /// Programs that reach an established connection's every path: requests to each kind of
    /// handler, `$auth`, an unknown method, a CANCEL, PINGs, a time jump, over both framings.
    static func seeds() throws -> [String: [UInt8]] {
        func chunk(_ payload: Frame.Payload) throws -> [UInt8] {
            // A handshake frame carries a checksum (PROTOCOL.md 4.1); the others need none.
            let flags: FrameFlags = if case .hello = payload { .checksum } else { [] }
            let bytes = try FrameEncoder().encode(Frame(payload, flags: flags), allocator: ByteBufferAllocator())
            return [0, UInt8(bytes.readableBytes)] + Array(bytes.readableBytesView)
        }
        let requests = try ["task", "yield", "inline", "join", "$auth", "nope", "yield"].enumerated().flatMap { index, method in
            try chunk(.request(.init(id: UInt64(index + 1), method: method, body: ByteBuffer(string: "room"))))
        }
        return [
            "requests": [1] + requests + [2, 3],
            "requests-as-messages": [3] + requests + [2, 3],
            "auth-waits-for-a-slot": try [1] + chunk(.request(.init(id: 1, method: "yield")))
                + chunk(.request(.init(id: 2, method: "yield")))
                + chunk(.request(.init(id: 3, method: "$auth"))) + chunk(.request(.init(id: 4, method: "yield"))) + [2, 3, 2, 3],
            "cancel": try [1] + chunk(.request(.init(id: 7, method: "task"))) + chunk(.cancel(.init(requestID: 7))) + [2, 3],
            "ping-and-wait": try [1] + chunk(.ping(.init(id: 1))) + [2, 3, 1, 50, 2, 4, 1, 255, 2],
            "hello-by-hand": try [0] + chunk(.hello(.init(versions: 1...1, features: [], maxBodySize: 4096, clientID: "x"))) + [2, 3],
        ]
    }
}
