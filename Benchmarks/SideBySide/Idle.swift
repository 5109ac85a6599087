import ArgumentParser
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Tether
import TetherCore
import TetherNIO

/// Gateway scale: idle connections held with heartbeats, and what each costs the gateway.
struct Idle: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Hold N idle Tether connections (heartbeats on) against one gateway process; report its RSS per connection."
    )

    @Option(parsing: .upToNextOption, help: "Connection counts, one run (and fresh gateway processes) each.")
    var connections: [Int] = [5_000, 10_000, 19_000]

    @Option(help: "Gateway processes sharing one port (SO_REUSEPORT); the counts are totals across them.")
    var workers = 1

    @Option(help: "Connections per load-generator process (each process may hold at most 20,000 descriptors).")
    var perProcess = 5_000

    @Option(help: "Seconds to hold the connections (heartbeats run) before reading the gateway's memory.")
    var hold = 25.0

    @Option(help: "Where idle.json goes.")
    var output = "bench-results"

    @Flag(help: "Generators hold wire-level connections (handshake, then a PING every heartbeat interval) instead of full TetherClients.")
    var wireClients = false

    struct Result: Codable {
        var connections: Int
        /// Gateway processes sharing the port.
        var workers: Int?
        /// Load-generator processes, each connecting from its own 127.0.x.y source address.
        var processes: Int
        /// Whether the generators held wire-level connections instead of full TetherClients.
        var wireClients: Bool?
        /// Connected / seconds from the first attempt to the last handshake.
        var handshakesPerSecond: Double
        /// Summed over the gateway processes.
        var gatewayRSSBeforeKiB: Int
        var gatewayRSSAfterKiB: Int
        /// Each gateway process's RSS growth.
        var workerRSSGrowthKiB: [Int]?
        var kibPerConnection: Double { Double(self.gatewayRSSAfterKiB - self.gatewayRSSBeforeKiB) / Double(self.connections) }
        /// Connections still up at the end, as the generators saw them.
        var stillConnected: Int
    }

    /// The source address of generator `index`: 127.0.0.1 is left to everything else.
    static func sourceAddress(_ index: Int) -> String { "127.0.\(1 + index / 250).\(1 + index % 250)" }

    func run() async throws {
        guard self.workers >= 1 else { throw BenchError("--workers must be at least 1") }
        let executable = try ChildProcess.thisExecutable()
        var results: [Result] = []
        for count in self.connections {
            var servers: [ChildProcess] = []
            defer { for server in servers { server.terminate() } }
            let reusePort = self.workers > 1 ? ["--reuse-port"] : []
            let (first, port) = try ChildProcess.server(.tether, executable: executable, arguments: reusePort)
            servers.append(first)
            for _ in 1..<self.workers {
                servers.append(try ChildProcess.server(.tether, executable: executable, arguments: ["--port", "\(port)"] + reusePort).0)
            }
            try await Task.sleep(for: .seconds(1))
            let before = servers.map { residentKiB(pid: $0.pid) ?? 0 }
            let processes = (count + self.perProcess - 1) / self.perProcess
            let started = Date()
            var generators: [ChildProcess] = []
            for index in 0..<processes {
                let share = min(self.perProcess, count - index * self.perProcess)
                generators.append(
                    try ChildProcess(
                        executable,
                        [
                            "hold", "--port", "\(port)", "--count", "\(share)", "--seconds", "\(self.hold)",
                            "--source", Self.sourceAddress(index),
                        ] + (self.wireClients ? ["--wire"] : [])
                    )
                )
            }
            // Each generator prints "connected N" once all its clients are, then "still N" at the end.
            for generator in generators {
                guard let line = generator.readLine(), line.hasPrefix("connected ") else {
                    throw BenchError("a generator failed: \(generator.errors())")
                }
            }
            let ramp = Date().timeIntervalSince(started)
            try await Task.sleep(for: .seconds(self.hold))
            let after = servers.map { residentKiB(pid: $0.pid) ?? 0 }
            var still = 0
            for generator in generators {
                if let line = generator.readLine(), line.hasPrefix("still "), let n = Int(line.dropFirst(6)) { still += n }
                generator.wait()
            }
            let growth = zip(before, after).map { $1 - $0 }
            let result = Result(
                connections: count,
                workers: self.workers,
                processes: processes,
                wireClients: self.wireClients,
                handshakesPerSecond: Double(count) / ramp,
                gatewayRSSBeforeKiB: before.reduce(0, +),
                gatewayRSSAfterKiB: after.reduce(0, +),
                workerRSSGrowthKiB: growth,
                stillConnected: still
            )
            emit(
                "\(count) idle connections (\(self.workers) gateway processes, \(processes) generators): "
                    + "\(Int(result.handshakesPerSecond)) handshakes/s while ramping, "
                    + "gateway RSS \(result.gatewayRSSBeforeKiB / 1024) → \(result.gatewayRSSAfterKiB / 1024) MiB "
                    + "(growth per process, MiB: \(growth.map { String($0 / 1024) }.joined(separator: ", "))), "
                    + "\(String(format: "%.1f", result.kibPerConnection)) KiB per connection, "
                    + "\(still) still connected after \(Int(self.hold)) s"
            )
            results.append(result)
        }
        try writeJSON(results, to: "\(self.output)/idle.json")
    }
}

/// A load generator: `count` Tether clients with the default configuration (heartbeats on),
/// connected in batches, held for `seconds`.
struct Hold: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Load generator for `idle` (prints 'connected N', later 'still N').")

    @Option var port: Int
    @Option var count: Int
    @Option var seconds: Double
    @Option(help: "Clients started at once.") var batch = 500
    @Option(help: "The local address the clients connect from (default: the system's choice).") var source: String?
    @Flag(help: "Wire-level clients (handshake, PING every heartbeat interval) instead of TetherClients.") var wire = false

    func run() async throws {
        if self.wire {
            try await self.holdWireClients()
            return
        }
        var logger = Logger(label: "tether-bench.hold")
        logger.logLevel = ProcessInfo.processInfo.environment["HOLD_LOG"] != nil ? .info : .critical
        let endpoint = Endpoint(host: "127.0.0.1", port: self.port)
        let transport = try self.source.map { try TCPClientTransport(sourceAddress: $0) } ?? TCPClientTransport()
        var clients: [TetherClient] = []
        try await withThrowingDiscardingTaskGroup { group in
            for index in 0..<self.count {
                let client = try TetherClient(
                    configuration: .init(endpoints: [endpoint], clientID: "idle-\(index)"),
                    transport: transport,
                    logger: logger
                )
                clients.append(client)
                group.addTask { try? await client.run() }
                if clients.count % self.batch == 0 || index == self.count - 1 {
                    let batch = clients.suffix(clients.count % self.batch == 0 ? self.batch : clients.count % self.batch)
                    while !batch.allSatisfy({ if case .connected = $0.connectionState { true } else { false } }) {
                        try await Task.sleep(for: .milliseconds(20))
                    }
                }
            }
            emit("connected \(clients.count)")
            try await Task.sleep(for: .seconds(self.seconds))
            let still = clients.filter { if case .connected = $0.connectionState { true } else { false } }.count
            emit("still \(still)")
            for client in clients { client.shutdown() }
        }
    }
}

extension Hold {
    /// `count` wire-level connections: each completes the handshake, then sends a PING every
    /// heartbeat interval the WELCOME announced and expects its PONG before the next one.
    /// Much lighter than a `TetherClient`, so that a 2-core machine can hold 100k of them.
    func holdWireClients() async throws {
        let source = try self.source.map { try SocketAddress(ipAddress: $0, port: 0) }
        let live = NIOLockedValueBox(0)
        let missedPongs = NIOLockedValueBox(0)
        try await openWireConnections(count: self.count, batch: self.batch, port: self.port, source: source) { index, welcomed in
            HeartbeatMember(
                clientID: "idle-\(ProcessInfo.processInfo.processIdentifier)-\(index)",
                welcomed: welcomed,
                live: live,
                missedPongs: missedPongs
            )
        }
        emit("connected \(self.count)")
        try await Task.sleep(for: .seconds(self.seconds))
        let missed = missedPongs.withLockedValue { $0 }
        if missed > 0 { FileHandle.standardError.write(Data("\(missed) PONGs missed\n".utf8)) }
        emit("still \(live.withLockedValue { $0 })")
    }
}

/// One idle connection on the wire: HELLO, then a PING every heartbeat interval.
final class HeartbeatMember: ChannelInboundHandler {
    typealias InboundIn = Frame
    typealias OutboundOut = Frame

    private let clientID: String
    private let welcomed: EventLoopPromise<Void>
    private let live: NIOLockedValueBox<Int>
    private let missedPongs: NIOLockedValueBox<Int>
    private var flags: FrameFlags = []
    private var established = false
    private var settled = false
    private var pingsUnanswered = 0
    private var interval = TimeAmount.seconds(10)
    private var nextPing: UInt64 = 1
    private var timer: Scheduled<Void>?

    init(clientID: String, welcomed: EventLoopPromise<Void>, live: NIOLockedValueBox<Int>, missedPongs: NIOLockedValueBox<Int>) {
        self.clientID = clientID
        self.welcomed = welcomed
        self.live = live
        self.missedPongs = missedPongs
    }

    func channelActive(context: ChannelHandlerContext) {
        let hello = Frame.Hello(versions: 1...1, features: .checksum, maxBodySize: 1 << 20, clientID: self.clientID)
        context.writeAndFlush(Self.wrapOutboundOut(Frame(.hello(hello), flags: .checksum)), promise: nil)
        context.fireChannelActive()
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch Self.unwrapInboundIn(data).payload {
        case .welcome(let welcome):
            self.flags = welcome.features.contains(.checksum) ? .checksum : []
            self.established = true
            self.live.withLockedValue { $0 += 1 }
            self.interval = TimeAmount(welcome.heartbeatInterval)
            self.schedulePing(context: context)
            self.settle(.success(()))
        case .pong:
            self.pingsUnanswered = 0
        case .ping(let ping):
            context.writeAndFlush(Self.wrapOutboundOut(Frame(.pong(ping), flags: self.flags)), promise: nil)
        case .error(let report):
            self.settle(.failure(BenchError("the gateway refused: \(report.message)")))
        default:
            break
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        self.timer?.cancel()
        if self.established { self.live.withLockedValue { $0 -= 1 } }
        self.established = false
        self.settle(.failure(ChannelError.ioOnClosedChannel))
        context.fireChannelInactive()
    }

    func errorCaught(context: ChannelHandlerContext, error: any Error) {
        self.settle(.failure(error))
        context.close(promise: nil)
    }

    private func schedulePing(context: ChannelHandlerContext) {
        self.timer = context.eventLoop.assumeIsolated().scheduleTask(in: self.interval) {
            if self.pingsUnanswered > 0 { self.missedPongs.withLockedValue { $0 += 1 } }
            self.pingsUnanswered += 1
            context.writeAndFlush(Self.wrapOutboundOut(Frame(.ping(.init(id: self.nextPing)), flags: self.flags)), promise: nil)
            self.nextPing += 1
            self.schedulePing(context: context)
        }
    }

    private func settle(_ result: Result<Void, any Error>) {
        guard !self.settled else { return }
        self.settled = true
        self.welcomed.completeWith(result)
    }
}

/// Resident memory of process `pid`, KiB, from /proc (Linux).
func residentKiB(pid: Int32) -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return Int(line.split(separator: " ").dropFirst().first ?? "")
    }
    return nil
}
