import Foundation
import Logging
import NIOCore
import Tether
import TetherCore
import TetherFaultProxy
import TetherNIO

/// A thousand restarts, counting descriptors (issue 44: "no process leaks descriptors across a
/// thousand restarts"): a client in this process talks to a `tether serve` process (SQLite
/// store) through a ``TCPFaultProxy``; the gateway is killed (SIGKILL) and started again
/// `gatewayRestarts` times, then every connection is cut `cycles` times, and after each the
/// client must answer a request again (it reconnected). Descriptors are counted in this process
/// (the client's side, the proxy's) and in the gateway's last incarnation, once the first
/// cycles warmed up, and at the end.
///
/// ```swift
/// let report = try await RestartsRun(configuration: .init(executable: tether, directory: "restarts")).run { print($0) }
/// ```
public struct RestartsRun: Sendable {
    public struct Configuration: Sendable {
        /// The `tether` executable (`serve`).
        public var executable: String
        /// Where the gateway's store and log go.
        public var directory: String
        /// Connections cut, each followed by a reconnection and an answered request.
        public var cycles = 1000
        /// Gateway processes killed and started again, before the cycles.
        public var gatewayRestarts = 10
        /// Cycles before the first count of descriptors (pools and caches filled).
        public var warmUp = 20

        public init(executable: String, directory: String) {
            self.executable = executable
            self.directory = directory
        }
    }

    /// What a run counted (`restarts.json`).
    public struct Report: Codable, Sendable {
        public var cycles: Int
        public var gatewayRestarts: Int
        public var seconds: Double
        /// This process's descriptors after the warm-up, and at the end.
        public var clientDescriptors: [Int]
        /// The gateway's (its last process), after the warm-up and at the end.
        public var gatewayDescriptors: [Int]
        /// The client's connections, as it counted them.
        public var connects: Int
    }

    public let configuration: Configuration

    public init(configuration: Configuration) {
        self.configuration = configuration
    }

    /// Runs, and writes `restarts.json` to the directory.
    public func run(say: @escaping @Sendable (String) -> Void = { _ in }) async throws -> Report {
        let configuration = self.configuration
        try FileManager.default.createDirectory(atPath: configuration.directory, withIntermediateDirectories: true)
        let started = ContinuousClock.now
        let gateway = GatewayProcess(
            executable: configuration.executable,
            port: try await GatewayProcess.freePort(),
            store: "\(configuration.directory)/gateway.sqlite",
            heartbeat: .seconds(1),
            logFile: "\(configuration.directory)/gateway.log"
        )
        try await gateway.start()
        defer { gateway.kill() }
        let proxy = TCPFaultProxy(upstream: Endpoint(host: "127.0.0.1", port: gateway.port))
        let address = try await proxy.start()
        var clientConfiguration = ClientConfiguration(endpoints: [Endpoint(host: "127.0.0.1", port: address.port!)], clientID: "restarts")
        // Cut connections never live long enough to reset the backoff: keep its ceiling low.
        clientConfiguration.reconnect.backoff = try Backoff(initial: .milliseconds(1), maximum: .milliseconds(5))
        var logger = Logger(label: "tether.lab.restarts")
        logger.logLevel = .critical
        let client = try TetherClient(configuration: clientConfiguration, logger: logger)
        let connects = TetherLock(0)
        var report = Report(
            cycles: configuration.cycles,
            gatewayRestarts: configuration.gatewayRestarts,
            seconds: 0,
            clientDescriptors: [],
            gatewayDescriptors: [],
            connects: 0
        )
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await client.run() }
            group.addTask {
                for await event in client.events {
                    if case .connected = event { connects.withLockedValue { $0 += 1 } }
                }
            }
            defer {
                client.shutdown()
                group.cancelAll()
            }
            func answered(_ step: String) async throws {
                let deadline = ContinuousClock.now + .seconds(20)
                while true {
                    do {
                        let answer = try await client.request("echo", body: ByteBuffer(string: step), timeout: .seconds(2))
                        guard String(buffer: answer) == step else {
                            throw Failure(description: "\(step): echoed \(String(buffer: answer))")
                        }
                        return
                    } catch let error as Failure {
                        throw error
                    } catch {
                        // Not reconnected yet: the request failed with the connection.
                        guard ContinuousClock.now < deadline else { throw Failure(description: "\(step): no answer within 20 s: \(error)") }
                        try await Task.sleep(for: .milliseconds(5))
                    }
                }
            }
            try await answered("first")
            for restart in 0..<configuration.gatewayRestarts {
                gateway.kill()
                try await gateway.start()
                try await answered("restart \(restart + 1)")
            }
            say("\(configuration.gatewayRestarts) gateway restarts; now \(configuration.cycles) connections cut")
            for cycle in 1...configuration.cycles {
                proxy.cutAll()
                try await answered("cycle \(cycle)")
                if cycle == configuration.warmUp || cycle == configuration.cycles {
                    // Closed connections are let go on the event loops: settle before counting.
                    try await Task.sleep(for: .milliseconds(200))
                    report.clientDescriptors.append(ProcessSampler.descriptors(of: getpid()) ?? -1)
                    report.gatewayDescriptors.append(gateway.processIdentifier.flatMap { ProcessSampler.descriptors(of: $0) } ?? -1)
                }
                if cycle % 200 == 0 { say("\(cycle) cycles") }
            }
        }
        await proxy.stop()
        report.connects = connects.withLockedValue { $0 }
        report.seconds = (ContinuousClock.now - started).totalSeconds
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try encoder.encode(report).write(to: URL(fileURLWithPath: "\(configuration.directory)/restarts.json"))
        say(
            "\(report.connects) connections in \(String(format: "%.1f", report.seconds)) s; descriptors: this process \(report.clientDescriptors), the gateway \(report.gatewayDescriptors) (after \(configuration.warmUp) cycles, at the end)"
        )
        return report
    }

    struct Failure: Error, CustomStringConvertible {
        var description: String
    }
}
