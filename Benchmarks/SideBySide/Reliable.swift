import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Synchronization
import Tether
import TetherGateway

/// `tether-bench reliable`: end-to-end reliable delivery with the embedded SQLite stores, each
/// party in a process of its own (so that each can be profiled): alice (this process) sends,
/// the gateway (`reliable-gateway`) processes each message once and delivers it to bob
/// (`reliable-receiver`), whose app counts what it receives.
///
/// It runs twice, side by side: with the gateway's default limits (where the connection's
/// message rate, `messagesPerSecondPerConnection`, paces alice) and with the limits off
/// (what the pipeline itself sustains); `--limits` picks one. Then NATS JetStream moves the
/// same messages in the same run (see ``ReliableJetStream``), when `Benchmarks/setup-jetstream`
/// has installed it; `--peers` picks.
///
///     tether-bench reliable --messages 100000 --senders 64
struct Reliable: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Reliable messages end to end: alice → gateway (SQLite) → bob, three processes."
    )

    @Option(help: "Messages alice sends.")
    var messages = 100_000

    @Option(help: "Concurrent senders, each its own conversation.")
    var senders = 64

    @Option(help: "Message body size in bytes.")
    var body = 32

    @Option(help: "Where reliable.json goes (nothing is written without it).")
    var output: String?

    enum Limits: String, ExpressibleByArgument, CaseIterable, Codable {
        case defaults, off, both
    }

    @Option(help: "The gateway's limits: defaults, off, or both (one run each).")
    var limits = Limits.both

    @Option(help: "Run the gateways as nodes of a cluster on this PostgreSQL database instead of SQLite.")
    var postgres: String?

    @Option(help: "With --postgres: gateway nodes; alice connects to the first, bob to the last.")
    var nodes = 1

    @Option(help: "Append the gateways' warnings and errors to this file.")
    var gatewayLog: String?

    enum Peer: String, ExpressibleByArgument, CaseIterable, Codable {
        case tether, jetstream
    }

    @Option(
        parsing: .upToNextOption,
        help: "tether, jetstream (NATS JetStream, installed by Benchmarks/setup-jetstream), or both; one run each."
    )
    var peers: [Peer] = [.tether, .jetstream]

    struct Result: Codable {
        /// `tether` or `jetstream`.
        var peer: Peer = .tether
        /// Tether's limits, `defaults` or `off`; `nil` for JetStream, which has none.
        var limits: Limits?
        /// The gateway's per-connection message rate in this run, if limited.
        var limitPerConnection: Int?
        var messages: Int
        var senders: Int
        var bodyBytes: Int
        /// Until alice's last `send` returned (every message in her outbox).
        var acceptedSeconds: Double
        /// Until bob's app had every message.
        var deliveredSeconds: Double
        var deliveredPerSecond: Double
        /// CPU seconds over the run, per process.
        var aliceCPUSeconds: Double
        /// The gateway's or nats-server's.
        var gatewayCPUSeconds: Double
        var bobCPUSeconds: Double

        /// Alice's reliable messages sent again after a timeout, and her connections' reconnects.
        var aliceRetransmissions: Int? = nil
        var aliceReconnects: Int? = nil
        /// Bytes bob read and wrote on his connection.
        var bobBytesReceived: Int? = nil
        var bobBytesSent: Int? = nil

        /// CPU seconds of all three processes.
        var cpuSeconds: Double { self.aliceCPUSeconds + self.gatewayCPUSeconds + self.bobCPUSeconds }
    }

    func validate() throws {
        guard !self.peers.isEmpty else { throw ValidationError("--peers needs at least one of tether, jetstream") }
        guard self.messages > 0, self.senders > 0, self.senders <= self.messages, self.body >= 0 else {
            throw ValidationError("--messages and --senders must be positive, with no more senders than messages")
        }
        if self.peers.contains(.jetstream), self.postgres != nil {
            throw ValidationError("--postgres is for Tether's gateways; run JetStream without it (--peers tether)")
        }
    }

    func run() async throws {
        var results: [Result] = []
        for limits in !self.peers.contains(.tether) ? [] : self.limits == .both ? [Limits.defaults, .off] : [self.limits] {
            let result = try await self.run(limits: limits)
            var line =
                "tether, limits \(limits.rawValue): \(result.messages) reliable messages of \(result.bodyBytes) B from \(result.senders) senders: "
                + "accepted in \(String(format: "%.2f", result.acceptedSeconds)) s (\(Int(Double(result.messages) / result.acceptedSeconds))/s), "
                + "delivered in \(String(format: "%.2f", result.deliveredSeconds)) s = \(Int(result.deliveredPerSecond))/s"
            if let limit = result.limitPerConnection, result.messages > limit {
                // The bucket starts full: the first second's worth goes at once, the rest at the rate.
                let sustained = Double(result.messages - limit) / result.deliveredSeconds
                let share = String(format: "%.0f", 100 * sustained / Double(limit))
                line += " (after the \(limit)-message burst, \(Int(sustained))/s = \(share) % of the \(limit)/s limit)"
            }
            line +=
                "; CPU alice \(String(format: "%.2f", result.aliceCPUSeconds)) s, gateway \(String(format: "%.2f", result.gatewayCPUSeconds)) s, "
                + "bob \(String(format: "%.2f", result.bobCPUSeconds)) s; alice retransmitted \(result.aliceRetransmissions ?? 0), "
                + "reconnected \(result.aliceReconnects ?? 0); bob read \(result.bobBytesReceived ?? 0) B, wrote \(result.bobBytesSent ?? 0) B"
            emit(line)
            results.append(result)
        }
        if self.peers.contains(.jetstream) {
            let jetstream = ReliableJetStream(messages: self.messages, senders: self.senders, body: self.body)
            if let result = try await jetstream.run() {
                results.append(result)
                if let tether = results.first(where: { $0.peer == .tether && $0.limits == .off }) {
                    emit(
                        "Tether (limits off) / JetStream: delivered \(String(format: "%.2f", tether.deliveredPerSecond / result.deliveredPerSecond))×, "
                            + "CPU per message \(String(format: "%.2f", tether.cpuSeconds / result.cpuSeconds))×"
                    )
                }
            }
        }
        if let output = self.output { try writeJSON(results, to: "\(output)/reliable.json") }
    }

    private func run(limits: Limits) async throws -> Result {
        let executable = try ChildProcess.thisExecutable()
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("tether-reliable-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }

        var gateways: [(process: ChildProcess, port: Int)] = []
        defer { for gateway in gateways { gateway.process.terminate() } }
        for node in 0..<(self.postgres == nil ? 1 : max(1, self.nodes)) {
            let storeArguments =
                self.postgres.map { ["--postgres", $0, "--node-name", "n\(node + 1)"] }
                ?? ["--store", scratch.appendingPathComponent("gateway.sqlite").path]
            let process = try ChildProcess(
                executable,
                ["reliable-gateway"] + storeArguments + (limits == .off ? ["--limits-off"] : [])
                    + (self.gatewayLog.map { ["--log", $0] } ?? [])
            )
            guard let ready = process.readLine(), ready.hasPrefix("ready "), let port = Int(ready.dropFirst(6)) else {
                throw BenchError("the gateway did not start: \(process.errors())")
            }
            gateways.append((process, port))
        }
        let port = gateways[0].port
        let bob = try ChildProcess(
            executable,
            [
                "reliable-receiver", "--port", "\(gateways[gateways.count - 1].port)", "--messages", "\(self.messages)",
                "--outbox", scratch.appendingPathComponent("bob.sqlite").path,
            ]
        )
        defer { bob.terminate() }
        guard bob.readLine() == "connected" else { throw BenchError("bob did not connect: \(bob.errors())") }

        var configuration = ClientConfiguration(endpoints: [Endpoint(host: "127.0.0.1", port: port)], clientID: "alice")
        configuration.reliability = try .init(
            outbox: try SQLiteOutboxStore(path: scratch.appendingPathComponent("alice.sqlite").path),
            capacity: max(self.messages, 10_000)
        )
        let alice = try TetherClient(configuration: configuration)
        let body = ByteBuffer(repeating: UInt8(ascii: "m"), count: self.body)
        let (messages, senders) = (self.messages, self.senders)

        let result = try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await alice.run() }
            defer { alice.shutdown() }
            try await waitUntilConnected(alice)
            let cpu = (
                alice: processCPUSeconds(), gateway: processCPUSeconds(pids: gateways.map(\.process.pid)),
                bob: processCPUSeconds(pid: bob.pid) ?? 0
            )
            let clock = ContinuousClock()
            let started = clock.now
            let startedAt = Date().timeIntervalSince1970
            try await withThrowingDiscardingTaskGroup { senderGroup in
                for sender in 0..<senders {
                    let share = messages / senders + (sender < messages % senders ? 1 : 0)
                    senderGroup.addTask {
                        for _ in 0..<share {
                            _ = try await alice.send("dm", body: body, conversation: "bob-\(sender)")
                        }
                    }
                }
            }
            let accepted = (clock.now - started).totalSeconds
            // "received N AT IN OUT": bob's app had N messages, the last at AT (seconds since
            // 1970); his connection read IN bytes and wrote OUT.
            guard let line = bob.readLine(), line.hasPrefix("received ") else { throw BenchError("bob failed: \(bob.errors())") }
            let fields = line.split(separator: " ")
            guard fields.count == 5, let count = Int(fields[1]), let last = Double(fields[2]) else {
                throw BenchError("bob reported '\(line)' for \(messages) messages")
            }
            guard count == messages else {
                throw BenchError(
                    "bob had \(count) of \(messages) messages and none came for 30 s: the gateway refused some (its delivery quotas, "
                        + "with --limits defaults) or stalled; their outcomes are on alice's side (TetherClient.outcome(of:))"
                )
            }
            let delivered = last - startedAt
            return Result(
                limits: limits,
                limitPerConnection: limits == .off ? nil : GatewayConfiguration.Limits.defaults.messagesPerSecondPerConnection,
                messages: messages,
                senders: senders,
                bodyBytes: body.readableBytes,
                acceptedSeconds: accepted,
                deliveredSeconds: delivered,
                deliveredPerSecond: Double(messages) / delivered,
                aliceCPUSeconds: processCPUSeconds() - cpu.alice,
                gatewayCPUSeconds: processCPUSeconds(pids: gateways.map(\.process.pid)) - cpu.gateway,
                bobCPUSeconds: (processCPUSeconds(pid: bob.pid) ?? 0) - cpu.bob,
                aliceRetransmissions: alice.statistics.messagesRetransmitted,
                aliceReconnects: alice.statistics.reconnects,
                bobBytesReceived: Int(fields[3]),
                bobBytesSent: Int(fields[4])
            )
        }
        return result
    }
}

/// The gateway of `reliable`: a SQLite message store; every "dm" is delivered to "bob".
struct ReliableGateway: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "reliable-gateway", abstract: "The gateway of `reliable`.")

    @Option(help: "The SQLite file of the message store.")
    var store: String?

    @Option(help: "Be a node of the cluster on this PostgreSQL database (instead of --store).")
    var postgres: String?

    @Option(help: "With --postgres: the node's name.")
    var nodeName = "node"

    @Option(help: "The port (0 picks one).")
    var port = 0

    @Flag(help: "Turn off the per-connection rates and the delivery quotas.")
    var limitsOff = false

    @Option(help: "Append the gateway's log (warnings and errors) to this file; without it, errors go to stderr.")
    var log: String?

    func run() async throws {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = .init(host: "127.0.0.1", port: self.port)
        if self.limitsOff {
            // The rates, and the quotas that refuse a message for good when its recipient has
            // too much waiting or its sender delivered too much this minute (a run of over
            // 100,000 messages, or bob behind by 10,000, would have some refused).
            configuration.limits.messagesPerSecondPerConnection = .max
            configuration.limits.requestsPerSecondPerConnection = .max
            configuration.limits.maxDeliveriesPerRecipient = .max
            configuration.limits.maxDeliveryBytesPerRecipient = .max
            configuration.limits.maxDeliveriesPerSenderPerMinute = .max
            configuration.limits.maxDeliveryBytesPerSenderPerMinute = .max
        }
        var logger = Peer.logger
        if let log = self.log {
            // The parent reads only the first line of stderr: a busy log must not fill the pipe.
            let file = open(log, O_WRONLY | O_CREAT | O_APPEND, 0o644)
            guard file >= 0, dup2(file, STDERR_FILENO) >= 0 else { throw BenchError("cannot open \(log): errno \(errno)") }
            logger.logLevel = .warning
        }
        let gateway: Gateway
        if let postgres = self.postgres {
            let node = try await ClusterNodeOptions(url: postgres, name: self.nodeName).join()
            gateway = try Gateway(configuration: configuration, messageStore: node.store, cluster: node.cluster, logger: logger)
        } else {
            guard let store = self.store else { throw BenchError("reliable-gateway needs --store or --postgres") }
            gateway = try Gateway(configuration: configuration, messageStore: try SQLiteMessageStore(path: store), logger: logger)
        }
        gateway.onMessage("dm") { message, context in
            try context.deliver(to: "bob", topic: "dm", body: message.body)
        }
        try await TetherPeer.run(gateway) { port in emit("ready \(port)") }
    }
}

/// Bob, for `reliable`: prints "connected", then "received N AT" once his app has `messages`
/// deliveries, or as soon as 30 s pass without a new one (N is then short: the parent says so).
struct ReliableReceiver: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "reliable-receiver", abstract: "The recipient of `reliable`.")

    @Option var port: Int
    @Option var messages: Int
    @Option(help: "Bob's SQLite file (outbox and delivery checkpoint).") var outbox: String

    func run() async throws {
        var configuration = ClientConfiguration(endpoints: [Endpoint(host: "127.0.0.1", port: self.port)], clientID: "bob")
        configuration.reliability = try .init(outbox: try SQLiteOutboxStore(path: self.outbox))
        let bob = try TetherClient(configuration: configuration)
        let target = self.messages
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await bob.run() }
            defer { bob.shutdown() }
            try await waitUntilConnected(bob)
            emit("connected")
            // The count, published for the watchdog without a lock per delivery.
            let progress = DeliveryCount()
            let received = try await withThrowingTaskGroup(of: Int.self) { race in
                race.addTask {
                    var count = 0
                    for try await _ in bob.deliveries() {
                        count += 1
                        progress.value.store(count, ordering: .relaxed)
                        if count == target { break }
                    }
                    return count
                }
                race.addTask {
                    var last = -1
                    while true {
                        try await Task.sleep(for: .seconds(30))
                        let count = progress.value.load(ordering: .relaxed)
                        if count == last { return count }
                        last = count
                    }
                }
                defer { race.cancelAll() }
                return try await race.next()!
            }
            let statistics = bob.statistics
            emit("received \(received) \(Date().timeIntervalSince1970) \(statistics.bytesReceived) \(statistics.bytesSent)")
        }
    }
}

/// Bob's count of deliveries, read by his watchdog.
private final class DeliveryCount: Sendable {
    let value = Atomic<Int>(0)
}

/// Returns once `client` is connected (or throws after 30 s).
func waitUntilConnected(_ client: TetherClient) async throws {
    for _ in 0..<6_000 {
        if case .connected = client.connectionState { return }
        try await Task.sleep(for: .milliseconds(5))
    }
    throw BenchError("the client did not connect within 30 s")
}
