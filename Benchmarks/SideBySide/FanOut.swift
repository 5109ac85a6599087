import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TetherCompression
import TetherCore
import TetherNIO

/// Push fan-out: one room of N members, M pushes to the room, deliveries per second.
///
/// The members are wire-level Tether clients (a NIO handler that does the handshake, joins the
/// room with a REQUEST, answers PINGs and counts PUSH frames, CRC-32C checked by the decoder),
/// in load-generator processes. They stand for N devices; using the full client for each
/// would measure the generators' machine (the same 2 cores) more than the gateway.
///
/// `--compression both` runs it twice, the members first without and then with compression
/// negotiated (the gateway's default settings: payloads of 512 bytes or more, level 6), with
/// `--json` bodies (a chat room's messages as JSON, which compresses about as real traffic
/// does); the members inflate every push, as clients do.
struct FanOut: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "fanout",
        abstract: "Push M messages to a room of N members; report deliveries per second."
    )

    @Option(help: "Room members.")
    var members = 10_000

    @Option(help: "Members per load-generator process.")
    var perProcess = 5_000

    @Option(help: "Pushes to the room.")
    var messages = 100

    @Option(help: "Push body size in bytes.")
    var body = 32

    @Flag(help: "Bodies are JSON (chat messages) instead of one repeated byte.")
    var json = false

    @Option(help: "Members negotiate compression: off, on, or both (one run each).")
    var compression = CompressionRuns.off

    @Flag(
        help: """
            With compression: each member inflates and checks its first \(InflatingFrameDecoder.sampled) pushes, then             counts compressed pushes by their header without inflating them, so that the generators (on the             gateway's cores) measure the gateway rather than their own inflating.
            """
    )
    var sampleInflation = false

    enum CompressionRuns: String, ExpressibleByArgument, CaseIterable {
        case off, on, both
    }

    @Option(help: "Pushes per publish request (the publisher sends requests one after another).")
    var perRequest = 10

    @Option(help: "Where fanout.json goes.")
    var output = "bench-results"

    @Option(help: "Run the gateways as nodes of a cluster on this PostgreSQL database; members are spread over them.")
    var postgres: String?

    @Option(help: "With --postgres: gateway nodes; the publisher is on the first.")
    var nodes = 1

    /// What the members receive.
    enum Target: String, ExpressibleByArgument, CaseIterable, Codable {
        /// Pushes to a room they joined (fire-and-forget).
        case room
        /// Publications of a channel they subscribed to, its history in memory.
        case channel
        /// Publications of a channel whose history is in the store (SQLite, or PostgreSQL
        /// with --postgres): each appended before it is sent.
        case channelStore = "channel-store"

        /// The channel the members subscribe to, for a channel target.
        var channel: String? {
            switch self {
            case .room: nil
            case .channel: "bench.memory"
            case .channelStore: "bench.store"
            }
        }
    }

    @Option(parsing: .upToNextOption, help: "What the members receive, one run each: room, channel, channel-store.")
    var targets: [Target] = [.room]

    struct Result: Codable {
        var target: Target
        var members: Int
        var messages: Int
        var bodyBytes: Int
        var json: Bool
        var compression: Bool
        /// The members inflated only their first pushes (``InflatingFrameDecoder/sampled``).
        var sampledInflation: Bool
        var delivered: Int
        /// From the publish request until the last member had every push.
        var seconds: Double
        var deliveriesPerSecond: Double
        var gatewayCPUSeconds: Double
        /// The load generators' CPU (the members, decoding and, with compression, inflating every push).
        var membersCPUSeconds: Double
    }

    func run() async throws {
        var results: [Result] = []
        if self.targets.contains(.channelStore), self.postgres == nil {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-bench-channels-\(UUID().uuidString).sqlite")
                .path
            setenv("TETHER_BENCH_CHANNEL_STORE", path, 1)  // read by the gateway processes
        }
        for target in self.targets {
            for compressed in [false, true] where self.compression == .both || (self.compression == .on) == compressed {
                results.append(try await self.run(target: target, compressed: compressed))
            }
        }
        if self.targets.count > 1 {
            let first = results[0]
            for result in results.dropFirst() where result.compression == first.compression {
                emit(
                    "\(result.target.rawValue) / \(first.target.rawValue): deliveries per second "
                        + "\(String(format: "%.2f", result.deliveriesPerSecond / first.deliveriesPerSecond))x, "
                        + "gateway CPU \(String(format: "%.2f", result.gatewayCPUSeconds / first.gatewayCPUSeconds))x"
                )
            }
        }
        if results.count == 2, self.targets.count == 1 {
            let (off, on) = (results[0], results[1])
            emit(
                "compression on / off: deliveries per second \(String(format: "%.2f", on.deliveriesPerSecond / off.deliveriesPerSecond))x, "
                    + "gateway CPU per delivery \(String(format: "%.2f", on.gatewayCPUSeconds / off.gatewayCPUSeconds))x"
            )
        }
        let targets = self.targets == [.room] ? "" : "-" + self.targets.map(\.rawValue).joined(separator: "-")
        let name =
            "fanout\(targets)\(self.nodeCount > 1 ? "-\(self.nodeCount)-nodes" : "")\(self.compression == .off ? "" : "-compression")"
        try writeJSON(results.count == 1 ? AnyEncodable(results[0]) : AnyEncodable(results), to: "\(self.output)/\(name).json")
    }

    /// The gateway processes: one, or `--nodes` with `--postgres`.
    private var nodeCount: Int { self.postgres == nil ? 1 : max(1, self.nodes) }

    private func run(target: Target, compressed: Bool) async throws -> Result {
        let executable = try ChildProcess.thisExecutable()
        var servers: [(process: ChildProcess, port: Int)] = []
        defer { for server in servers { server.process.terminate() } }
        for node in 0..<self.nodeCount {
            let arguments = self.postgres.map { ["--postgres", $0, "--node-name", "n\(node + 1)"] } ?? []
            servers.append(try ChildProcess.server(.tether, executable: executable, arguments: arguments))
        }
        let port = servers[0].port
        // Each node gets an equal share of the members, in generators of at most perProcess.
        var generators: [ChildProcess] = []
        for (node, server) in servers.enumerated() {
            var share = self.members / servers.count + (node < self.members % servers.count ? 1 : 0)
            while share > 0 {
                let count = min(self.perProcess, share)
                generators.append(
                    try ChildProcess(
                        executable,
                        [
                            "listen", "--port", "\(server.port)", "--count", "\(count)", "--messages", "\(self.messages)",
                            "--body", "\(self.body)",
                        ] + (compressed ? ["--compression"] : []) + (target.channel.map { ["--channel", $0] } ?? [])
                            + (compressed && self.sampleInflation ? ["--sample-inflation"] : [])
                    )
                )
                share -= count
            }
        }
        for generator in generators {
            guard let line = generator.readLine(), line.hasPrefix("joined ") else {
                throw BenchError("a generator failed: \(generator.errors())")
            }
        }
        let cpuBefore = processCPUSeconds(pids: servers.map(\.process.pid))
        let started = Date().timeIntervalSince1970
        let perRequest = self.perRequest
        let messages = self.messages
        let bodySize = self.body
        let json = self.json
        let channel = target.channel
        let method = channel == nil ? "room.publish" : "channel.publish"
        let recipients = try await TetherPeer.withClient(port: port, transport: .tcp, method: method, onLoop: false) { client in
            let client = (client as! TetherPeer.Client).client
            var recipients = 0
            var sent = 0
            while sent < messages {
                let count = min(perRequest, messages - sent)
                var publish = ByteBuffer()
                publish.writeInteger(UInt32(count))
                publish.writeInteger(UInt32(bodySize))
                publish.writeInteger(UInt32(json ? 1 : 0))
                if let channel { publish.writeString(channel) }
                let reply = try await client.request(method, body: publish, timeout: .seconds(60))
                recipients = Int(reply.getInteger(at: reply.readerIndex, as: UInt32.self) ?? 0)
                sent += count
            }
            return recipients
        }
        // The publisher's node counts its own members only (a channel's publications say
        // nothing: the members' tally checks them).
        let local = self.members / servers.count + (self.members % servers.count > 0 ? 1 : 0)
        guard channel != nil || recipients == (servers.count == 1 ? self.members : local) else {
            throw BenchError("the room has \(recipients) members on the publisher's node, not \(servers.count == 1 ? self.members : local)")
        }
        var delivered = 0
        var membersCPU = 0.0
        var last = started
        for generator in generators {
            // "received N AT CPU": N pushes in all, the last at AT (seconds since 1970), the
            // generator's CPU seconds.
            guard let line = generator.readLine(), line.hasPrefix("received ") else {
                throw BenchError("a generator failed: \(generator.errors())")
            }
            let fields = line.split(separator: " ")
            delivered += Int(fields[1]) ?? 0
            last = max(last, Double(fields[2]) ?? 0)
            membersCPU += fields.count > 3 ? Double(fields[3]) ?? 0 : 0
            generator.wait()
        }
        let cpu = processCPUSeconds(pids: servers.map(\.process.pid)) - cpuBefore
        let expected = self.members * self.messages
        guard delivered == expected else { throw BenchError("\(delivered) pushes delivered of \(expected)") }
        let seconds = last - started
        let result = Result(
            target: target,
            members: self.members,
            messages: self.messages,
            bodyBytes: self.body,
            json: self.json,
            compression: compressed,
            sampledInflation: compressed && self.sampleInflation,
            delivered: delivered,
            seconds: seconds,
            deliveriesPerSecond: Double(delivered) / seconds,
            gatewayCPUSeconds: cpu,
            membersCPUSeconds: membersCPU
        )
        emit(
            "\(target.rawValue): \(self.messages) \(channel == nil ? "pushes" : "publications") of \(self.body) B\(self.json ? " JSON" : "")\(compressed ? ", compressed," : "") to \(self.members) members: \(delivered) delivered in "
                + "\(String(format: "%.2f", seconds)) s = \(Int(result.deliveriesPerSecond)) deliveries/s, "
                + "gateway CPU \(String(format: "%.2f", cpu)) s, members' CPU \(String(format: "%.2f", membersCPU)) s"
        )
        return result
    }
}

/// Load generator for `fanout`: `count` room members; prints "joined N" once all joined, then
/// "received N AT CPU" once each has `messages` pushes (or after 120 s).
struct Listen: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Load generator for `fanout`.")

    @Option var port: Int
    @Option var count: Int
    @Option var messages: Int
    @Option(help: "Connections opened at once.") var batch = 500
    @Option(help: "The size of every push's body; a push of another size is an error.") var body: Int?
    @Flag(help: "Negotiate compression (and inflate every push).") var compression = false
    @Flag(help: "With --compression: inflate only the first pushes of each member.") var sampleInflation = false
    @Option(help: "Subscribe to this channel (and count its publications) instead of joining the room.") var channel: String?

    func run() async throws {
        let tally = RoomMember.Tally(members: self.count, messages: self.messages)
        let (body, compression, channel) = (self.body, self.compression, self.channel)
        let inflating: InflatingFrameDecoder.Mode? = compression ? (self.sampleInflation ? .sampled : .all) : nil
        try await openWireConnections(count: self.count, batch: self.batch, port: self.port, source: nil, inflating: inflating) {
            index,
            joined in
            RoomMember(
                clientID: "member-\(ProcessInfo.processInfo.processIdentifier)-\(index)",
                joined: joined,
                tally: tally,
                bodySize: body,
                compression: compression,
                channel: channel
            )
        }
        emit("joined \(self.count)")
        let (received, last) = await tally.waitForAll(timeout: .seconds(120))
        if let wrong = tally.wrongSize { throw BenchError("a push's body had \(wrong) bytes, not \(self.body ?? 0)") }
        emit("received \(received) \(last) \(processCPUSeconds())")
    }
}

/// Opens `count` wire-level Tether connections to 127.0.0.1:`port`, `batch` at a time, and
/// returns once each has completed the promise its handler was given.
/// - Parameters:
///   - source: The local address to connect from; `nil`: the system's choice.
///   - makeHandler: The protocol handler of connection `index`, on top of Tether's framing; it
///     succeeds the promise when the connection is ready (or fails it).
func openWireConnections(
    count: Int,
    batch: Int,
    port: Int,
    source: SocketAddress?,
    inflating: InflatingFrameDecoder.Mode? = nil,
    makeHandler: @escaping @Sendable (_ index: Int, _ ready: EventLoopPromise<Void>) -> any ChannelHandler
) async throws {
    let group = MultiThreadedEventLoopGroup.singleton
    var index = 0
    while index < count {
        let end = min(count, index + batch)
        var ready: [EventLoopFuture<Void>] = []
        for connection in index..<end {
            let promise = group.next().makePromise(of: Void.self)
            ready.append(promise.futureResult)
            var bootstrap = ClientBootstrap(group: promise.futureResult.eventLoop)
                .channelOption(.tcpOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        if let inflating {
                            try channel.pipeline.syncOperations.addHandler(ByteToMessageHandler(InflatingFrameDecoder(inflating)))
                            try channel.pipeline.syncOperations.addHandler(MessageToByteHandler(FrameEncoder()))
                        } else {
                            try TetherFraming.addHandlers(to: channel.pipeline.syncOperations)
                        }
                        try channel.pipeline.syncOperations.addHandler(makeHandler(connection, promise))
                    }
                }
            if let source { bootstrap = bootstrap.bind(to: source) }
            bootstrap.connect(host: "127.0.0.1", port: port).whenFailure { promise.fail($0) }
        }
        for future in ready { try await future.get() }
        index = end
    }
}

/// One room member on the wire: HELLO, then REQUEST room.join, then counts PUSHes; or, with
/// a channel, SUBSCRIBE, then counts its PUBLICATIONs.
final class RoomMember: ChannelInboundHandler {
    typealias InboundIn = Frame
    typealias OutboundOut = Frame

    /// Pushes received by every member of the process, and when the last member got its last one.
    final class Tally: Sendable {
        private struct State {
            var received = 0
            var complete = 0
            var lastAt = 0.0
            var wrongSize: Int?
            var waiter: CheckedContinuation<Void, Never>?
        }

        let members: Int
        let messages: Int
        private let state: NIOLockedValueBox<State>

        init(members: Int, messages: Int) {
            self.members = members
            self.messages = messages
            self.state = NIOLockedValueBox(State())
        }

        /// The size of a push body that was not the expected one, if one was seen.
        var wrongSize: Int? { self.state.withLockedValue { $0.wrongSize } }

        func sawWrongSize(_ size: Int) { self.state.withLockedValue { $0.wrongSize = size } }

        /// A member received `count` more pushes; `complete` once it has them all.
        func add(_ count: Int, complete: Bool) {
            let waiter = self.state.withLockedValue { state -> CheckedContinuation<Void, Never>? in
                state.received += count
                guard complete else { return nil }
                state.complete += 1
                state.lastAt = Date().timeIntervalSince1970
                guard state.complete == self.members else { return nil }
                defer { state.waiter = nil }
                return state.waiter
            }
            waiter?.resume()
        }

        func waitForAll(timeout: Duration) async -> (received: Int, lastAt: Double) {
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    await withCheckedContinuation { continuation in
                        let done = self.state.withLockedValue { state in
                            if state.complete == self.members { return true }
                            state.waiter = continuation
                            return false
                        }
                        if done { continuation.resume() }
                    }
                }
                group.addTask { try? await Task.sleep(for: timeout) }
                await group.next()
                group.cancelAll()
                // The sleeper ends on cancellation; a waiter still parked is resumed here.
                self.state.withLockedValue { state in
                    defer { state.waiter = nil }
                    return state.waiter
                }?.resume()
            }
            return self.state.withLockedValue { ($0.received, $0.lastAt) }
        }
    }

    private let clientID: String
    private let joined: EventLoopPromise<Void>
    private let tally: Tally
    private let bodySize: Int?
    private let compression: Bool
    private var flags: FrameFlags = []
    private var received = 0
    private var unreported = 0
    private var joinSettled = false
    private let channel: String?

    init(
        clientID: String,
        joined: EventLoopPromise<Void>,
        tally: Tally,
        bodySize: Int? = nil,
        compression: Bool = false,
        channel: String? = nil
    ) {
        self.clientID = clientID
        self.joined = joined
        self.tally = tally
        self.bodySize = bodySize
        self.compression = compression
        self.channel = channel
    }

    func channelActive(context: ChannelHandlerContext) {
        var features: Features = self.compression ? [.checksum, .compression] : .checksum
        if self.channel != nil { features.insert(.channels) }
        let hello = Frame.Hello(versions: 1...1, features: features, maxBodySize: 1 << 20, clientID: self.clientID)
        context.writeAndFlush(Self.wrapOutboundOut(Frame(.hello(hello), flags: .checksum)), promise: nil)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = Self.unwrapInboundIn(data)
        switch frame.payload {
        case .welcome(let welcome):
            self.flags = welcome.features.contains(.checksum) ? .checksum : []
            if self.compression && !welcome.features.contains(.compression) {
                self.settleJoin(.failure(BenchError("the gateway did not agree to compression")))
                return
            }
            if let channel = self.channel {
                let subscribe = Frame.Subscribe(id: 1, channel: channel)
                context.writeAndFlush(Self.wrapOutboundOut(Frame(.subscribe(subscribe), flags: self.flags)), promise: nil)
                return
            }
            let join = Frame.Request(id: 1, method: "room.join")
            context.writeAndFlush(Self.wrapOutboundOut(Frame(.request(join), flags: self.flags)), promise: nil)
        case .subscribed(let subscribed):
            self.settleJoin(
                subscribed.status == .ok ? .success(()) : .failure(BenchError("SUBSCRIBE: \(subscribed.status) \(subscribed.message)"))
            )
        case .publication(let publication):
            if let size = self.bodySize, publication.body.readableBytes != size {
                self.tally.sawWrongSize(publication.body.readableBytes)
            }
            self.received += 1
            self.unreported += 1
        case .response(let response) where response.id == 1:
            self.settleJoin(
                response.status == .ok ? .success(()) : .failure(BenchError("room.join: \(response.status) \(response.message)"))
            )
        case .push(let push):
            if let size = self.bodySize, push.topic != InflatingFrameDecoder.notInflated, push.body.readableBytes != size {
                self.tally.sawWrongSize(push.body.readableBytes)
            }
            self.received += 1
            self.unreported += 1
        case .ping(let ping):
            context.writeAndFlush(Self.wrapOutboundOut(Frame(.pong(ping), flags: self.flags)), promise: nil)
        case .error(let report):
            self.settleJoin(.failure(BenchError("the gateway refused: \(report.message)")))
        default:
            break
        }
    }

    func channelReadComplete(context: ChannelHandlerContext) {
        // Reported per read, not per push: the tally's lock is shared by the whole process.
        if self.unreported > 0 {
            self.tally.add(self.unreported, complete: self.received == self.tally.messages)
            self.unreported = 0
        }
        context.fireChannelReadComplete()
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.settleJoin(.failure(ChannelError.ioOnClosedChannel))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.settleJoin(.failure(error))
        context.close(promise: nil)
    }

    private func settleJoin(_ result: Result<Void, any Error>) {
        guard !self.joinSettled else { return }
        self.joinSettled = true
        self.joined.completeWith(result)
    }
}

/// Tether's frame decoder with compression negotiated: COMPRESSED payloads are inflated, all
/// of them or (``Mode/sampled``) those of a connection's first ``sampled`` pushes; a later
/// compressed push is then taken whole by its header and handed on with the topic
/// ``notInflated`` and no body.
struct InflatingFrameDecoder: NIOSingleStepByteToMessageDecoder {
    typealias InboundOut = Frame
    enum Mode { case all, sampled }
    static let sampled = 5
    static let notInflated = "(not inflated)"

    private var decoder = FrameDecoder(maxBodySize: 1 << 20)
    private let inflater: PayloadInflater
    private let mode: Mode
    private var pushes = 0

    init(_ mode: Mode) throws {
        self.inflater = try PayloadInflater()
        self.mode = mode
    }

    mutating func decode(buffer: inout ByteBuffer) throws -> Frame? {
        if self.mode == .sampled, self.pushes >= Self.sampled, buffer.readableBytes >= FrameHeader.size,
            let header = buffer.withUnsafeReadableBytes({
                FrameHeader.read(from: UnsafeRawBufferPointer(rebasing: $0.prefix(FrameHeader.size)))
            }),
            header.type == .push, header.flags.contains(.compressed)
        {
            guard buffer.readableBytes >= FrameHeader.size + Int(header.length) else { return nil }
            buffer.moveReaderIndex(forwardBy: FrameHeader.size + Int(header.length))
            return Frame(.push(Frame.Push(topic: Self.notInflated, body: ByteBuffer())))
        }
        let frame = try self.decoder.decodeFrame(from: &buffer, inflater: self.inflater)
        if case .push = frame?.payload { self.pushes += 1 }
        return frame
    }

    mutating func decodeLast(buffer: inout ByteBuffer, seenEOF: Bool) throws -> Frame? {
        try self.decode(buffer: &buffer)
    }
}

/// A type-erased `Encodable`, for writing one result or several.
struct AnyEncodable: Encodable {
    private let value: any Encodable
    init(_ value: any Encodable) { self.value = value }
    func encode(to encoder: any Encoder) throws { try self.value.encode(to: encoder) }
}
