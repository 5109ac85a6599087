import Logging
import NIOCore
import NIOEmbedded
import NIOHTTP1

@testable import TetherCore
@testable import TetherGateway
@testable import TetherNIO
@testable import TetherNIOTransports

/// A little program that drives the gateway's HTTP listener (WebSocket upgrades, the HTTP
/// stream's GETs and POSTs, HTTP/2 with prior knowledge) on `EmbeddedChannel`s with virtual
/// time: the fuzz target FuzzHTTPListener runs the programs libFuzzer writes (this file is
/// linked into it), and `swift test` replays the committed ones (FuzzTesting/Corpus/HTTPListener).
///
/// Several connections come and go, with small limits (two connections per address, one POST
/// body in progress at a time before the memory budget is full): raw bytes, requests made from
/// a little grammar (a stream's GET, its POSTs with the live session's token and proof or a
/// wrong one, upgrades, other paths and methods, bodies of any length, declared or not), time
/// passing, reads, closes. Nothing may crash (a precondition in NIO's HTTP handlers kills the
/// process), and once every connection is closed and the time limits are out, the gateway
/// must count nothing: no admitted connection, no upgrade waiting, no session, no byte of its
/// memory budget.
///
/// The bytes: the first chooses the setup (bit 0: HTTP/2 with prior knowledge for the
/// connections, instead of HTTP/1.1); then operations, each an opcode byte and its operands:
/// 0 c n: connection c gets the next n bytes; 1 c k: connection c gets request k of the grammar
/// (its next bytes choose the parts); 2 t: t × 100 ms pass; 3: the loop runs; 4 c: connection
/// c's output is read (a stream's session line is kept); 5 c: connection c closes; 6: a new
/// connection opens (at most 6).
///
/// Not thread-safe: one program runs at a time, on the thread that made it.
final class HTTPListenerProgram {
    let loop = EmbeddedEventLoop()
    let gateway: Gateway
    private let settings: GatewayConfiguration.WebSocket
    private let logger = Logger(label: "fuzz") { _ in SwiftLogNoOpLogHandler() }

    /// A live stream's session, as its reader knows it.
    private struct Session {
        var token: String
        var key: String
        var posts: UInt64 = 0
    }

    init() {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = nil
        configuration.webSocket = .init(host: "127.0.0.1", port: 0, stream: .init(maxPostBodySize: 256 * 1024))
        configuration.limits.maxBodySize = 4096
        configuration.limits.maxBufferedInboundBytes = 8192
        configuration.limits.maxConnectionsPerAddress = 2
        configuration.limits.maxUnauthenticatedConnections = 3
        configuration.limits.memoryBudget = 64 * 1024  // paced from 48 KiB
        configuration.timeouts.body = .seconds(2)
        configuration.timeouts.handshake = .seconds(3)
        self.settings = configuration.webSocket!
        self.gateway = try! Gateway(
            configuration: configuration,
            eventLoopGroup: self.loop,
            clock: EventLoopClock(self.loop),
            logger: self.logger
        )
        self.gateway.handleInline("echo") { request, _ in request.body }
        _ = self.gateway.services
    }

    /// Runs one program.
    /// - Returns: What went wrong, or `nil`.
    func run(_ program: some Collection<UInt8>) -> String? {
        var input = Array(program)[...]
        guard let setup = input.popFirst() else { return nil }
        let http2 = setup & 1 != 0
        var connections: [EmbeddedChannel] = []
        var upgraders: [Weak<HTTPServerUpgradeHandler>] = []
        var session: Session?

        func open() {
            guard connections.count < 6 else { return }
            let channel = EmbeddedChannel(loop: self.loop)
            try! channel.connect(to: SocketAddress(ipAddress: "10.0.0.\(1 + connections.count % 2)", port: 1000 + connections.count)).wait()
            do {
                if let stopWaiting = try self.gateway.admitHTTPConnection(channel, timeout: .seconds(3), tls: false) {
                    if http2 {
                        try self.gateway.configureHTTP2(
                            channel,
                            settings: self.settings,
                            stream: self.settings.stream!,
                            stopWaiting: stopWaiting
                        )
                    } else {
                        try self.gateway.configureHTTP1(channel, settings: self.settings, stopWaiting: stopWaiting)
                        if let upgrader = try? channel.pipeline.syncOperations.handler(type: HTTPServerUpgradeHandler.self) {
                            upgraders.append(Weak(upgrader))
                        }
                    }
                }
            } catch {
                channel.close(promise: nil)
            }
            connections.append(channel)
        }
        func connection(_ byte: UInt8?) -> EmbeddedChannel? {
            guard !connections.isEmpty else { return nil }
            return connections[Int(byte ?? 0) % connections.count]
        }
        func read(_ channel: EmbeddedChannel) {
            while let bytes = try? channel.readOutbound(as: ByteBuffer.self) {
                let text = String(decoding: bytes.readableBytesView.prefix(4096), as: UTF8.self)
                for line in text.split(separator: "\n") {
                    if let (token, key) = HTTPStreamBinding.parseSessionLine(line.suffix(87)) { session = Session(token: token, key: key) }
                }
            }
        }

        open()
        while let opcode = input.popFirst() {
            switch opcode % 7 {
            case 0:
                let channel = connection(input.popFirst())
                let length = Int(input.popFirst() ?? 0)
                let bytes = input.prefix(length)
                input = input.dropFirst(length)
                if let channel, channel.isActive { _ = try? channel.writeInbound(ByteBuffer(bytes: bytes)) }
            case 1:
                let channel = connection(input.popFirst())
                let request = Self.request(from: &input, session: &session, http2: http2)
                if let channel, channel.isActive { _ = try? channel.writeInbound(request) }
            case 2:
                self.loop.advanceTime(by: .milliseconds(100 * Int64(input.popFirst() ?? 0)))
            case 3:
                self.loop.run()
            case 4:
                if let channel = connection(input.popFirst()) { read(channel) }
            case 5:
                if let channel = connection(input.popFirst()) { _ = try? channel.finish(acceptAlreadyClosed: true) }
            default:
                open()
            }
        }
        for channel in connections {
            read(channel)
            _ = try? channel.finish(acceptAlreadyClosed: true)
        }
        self.loop.run()
        self.loop.advanceTime(by: .seconds(600))
        self.loop.run()
        // Nothing may keep a closed connection alive (a retain cycle through its pipeline).
        let alive = connections.map { Weak($0) }
        connections.removeAll()
        self.loop.run()
        let leaked = alive.filter { $0.value != nil }.count
        let leakedUpgraders = upgraders.filter { $0.value != nil }.count

        var left: [String] = []
        if leaked > 0 { left.append("\(leaked) closed connections still alive (a retain cycle)") }
        if leakedUpgraders > 0 { left.append("\(leakedUpgraders) upgrade handlers of closed connections still alive (a retain cycle)") }
        let counts = self.gateway.admission.counts
        if counts != (0, 0) { left.append("admitted connections \(counts)") }
        let pending = self.gateway.pendingUpgrades.load(ordering: .relaxed)
        if pending != 0 { left.append("\(pending) connections waiting to upgrade") }
        let refusing = self.gateway.refusing.load(ordering: .relaxed)
        if refusing != 0 { left.append("\(refusing) connections being refused") }
        if self.gateway.httpStreams.liveCount != 0 { left.append("\(self.gateway.httpStreams.liveCount) live sessions") }
        if self.gateway.memoryBudget.usedBytes != 0 { left.append("\(self.gateway.memoryBudget.usedBytes) bytes of the memory budget") }
        if self.gateway.activity.active != 0 { left.append("activity \(self.gateway.activity.active)") }
        return left.isEmpty ? nil : "once every connection closed, the gateway still counts: " + left.joined(separator: ", ")
    }

    /// A reference that does not keep its object alive.
    private struct Weak<Object: AnyObject> {
        weak var value: Object?
        init(_ value: Object) { self.value = value }
    }

    /// A request of the grammar, its parts chosen by the next bytes: the method, the path, the
    /// session's token and proof (right, wrong, missing), an upgrade's headers, a declared and
    /// a sent body length, whether it ends.
    private static func request(from input: inout ArraySlice<UInt8>, session: inout Session?, http2: Bool) -> ByteBuffer {
        let choice = input.popFirst() ?? 0
        let declared = Int(input.popFirst() ?? 0) * 97
        let sent = Int(input.popFirst() ?? 0) * 89
        let method = ["GET", "POST", "PUT", "GET"][Int(choice & 3)]
        let path = ["/tether/stream", "/tether", "/other", "/tether/stream?x=1"][Int(choice >> 2 & 3)]
        var body = ByteBuffer(repeating: 0x54, count: sent)
        if choice & 0x80 != 0,
            let hello = try? FrameEncoder().encode(
                Frame(.hello(.init(versions: 1...1, features: [], maxBodySize: 4096, clientID: "fuzz")), flags: .checksum),
                allocator: ByteBufferAllocator()
            )
        {
            body = hello
        }
        var headers = ["Host: gateway"]
        switch choice >> 4 & 3 {
        case 0 where session != nil:
            // The live session's next POST, proven.
            headers.append("Tether-Session: \(session!.token)")
            headers.append("Tether-Proof: \(HTTPStreamBinding.proof(key: session!.key, post: session!.posts, body: body) ?? "")")
            session!.posts += 1
        case 1 where session != nil:
            headers.append("Tether-Session: \(session!.token)")  // the token without the key
            headers.append("Tether-Proof: \(HTTPStreamBinding.makeKey())")
        case 2:
            headers += ["Upgrade: websocket", "Connection: Upgrade", "Sec-WebSocket-Version: 13"]
            headers += ["Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol: tether.v1"]
        default:
            headers.append("Tether-Session: \(HTTPStreamBinding.makeToken())")
        }
        if choice & 0x40 != 0 { headers.append("Content-Length: \(choice & 0x80 != 0 ? body.readableBytes : declared)") }
        var request = ByteBuffer()
        if http2 {
            // With prior knowledge: the preface; the rest is for the fuzzer to find.
            request.writeString("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            request.writeBuffer(&body)
            return request
        }
        request.writeString("\(method) \(path) HTTP/1.1\r\n" + headers.joined(separator: "\r\n") + "\r\n\r\n")
        request.writeBuffer(&body)
        return request
    }

    /// Programs that reach the listener's paths: a stream opened and POSTed to (proven, and
    /// not), an upgrade, a body that stalls, connections over the limits, HTTP/2.
    static func seeds() -> [String: [UInt8]] {
        [
            "stream-and-posts": [0, 6, 1, 0, 0, 0, 0, 3, 4, 0, 1, 1, 0xC1, 0, 0, 3, 4, 1, 1, 1, 0x51, 5, 5, 3, 4, 1, 2, 30, 3],
            "upgrade": [0, 1, 0, 0x20, 0, 0, 3, 4, 0, 0, 0, 4, 0x82, 0x80, 0x00, 0x00, 3],
            "stalled-body": [0, 6, 1, 0, 0, 0, 0, 3, 4, 0, 1, 1, 0x41, 200, 3, 3, 2, 25, 3, 4, 1],
            "over-the-limits": [0, 6, 6, 6, 6, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0, 1, 2, 0, 0, 0, 1, 3, 0, 0, 0, 3, 2, 40, 3],
            "http2": [1, 0, 0, 24] + Array("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".utf8) + [3, 4, 0, 2, 50, 3],
            "garbage": [0, 0, 0, 12] + Array("GET / HTTP/9".utf8) + [0, 0, 4, 0xFF, 0x00, 0x0D, 0x0A, 3, 4, 0, 5, 0, 3],
        ]
    }
}
