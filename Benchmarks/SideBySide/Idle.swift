import ArgumentParser
import Foundation
import Logging
import Tether

/// Gateway scale: idle connections held with heartbeats, and what each costs the gateway.
struct Idle: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Hold N idle Tether connections (heartbeats on) against one gateway process; report its RSS per connection."
    )

    @Option(parsing: .upToNextOption, help: "Connection counts, one gateway process each.")
    var connections: [Int] = [5_000, 10_000, 19_000]

    @Option(help: "Connections per load-generator process (each process may hold at most 20,000 descriptors).")
    var perProcess = 5_000

    @Option(help: "Seconds to hold the connections (heartbeats run) before reading the gateway's memory.")
    var hold = 25.0

    @Option(help: "Where idle.json goes.")
    var output = "bench-results"

    struct Result: Codable {
        var connections: Int
        var processes: Int
        /// Connected / seconds from the first attempt to the last handshake.
        var handshakesPerSecond: Double
        var gatewayRSSBeforeKiB: Int
        var gatewayRSSAfterKiB: Int
        var kibPerConnection: Double { Double(self.gatewayRSSAfterKiB - self.gatewayRSSBeforeKiB) / Double(self.connections) }
        /// Connections still up at the end, as the generators saw them.
        var stillConnected: Int
    }

    func run() async throws {
        let executable = try ChildProcess.thisExecutable()
        var results: [Result] = []
        for count in self.connections {
            let (server, port) = try ChildProcess.server(.tether, executable: executable)
            defer { server.terminate() }
            try await Task.sleep(for: .seconds(1))
            let before = residentKiB(pid: server.pid) ?? 0
            let processes = (count + self.perProcess - 1) / self.perProcess
            let started = Date()
            var generators: [ChildProcess] = []
            for index in 0..<processes {
                let share = min(self.perProcess, count - index * self.perProcess)
                generators.append(
                    try ChildProcess(executable, ["hold", "--port", "\(port)", "--count", "\(share)", "--seconds", "\(self.hold)"])
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
            let after = residentKiB(pid: server.pid) ?? 0
            var still = 0
            for generator in generators {
                if let line = generator.readLine(), line.hasPrefix("still "), let n = Int(line.dropFirst(6)) { still += n }
                generator.wait()
            }
            let result = Result(
                connections: count,
                processes: processes,
                handshakesPerSecond: Double(count) / ramp,
                gatewayRSSBeforeKiB: before,
                gatewayRSSAfterKiB: after,
                stillConnected: still
            )
            emit(
                "\(count) idle connections (\(processes) generators): \(Int(result.handshakesPerSecond)) handshakes/s while ramping, "
                    + "gateway RSS \(before / 1024) → \(after / 1024) MiB, \(String(format: "%.1f", result.kibPerConnection)) KiB per connection, "
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

    func run() async throws {
        var logger = Logger(label: "tether-bench.hold")
        logger.logLevel = ProcessInfo.processInfo.environment["HOLD_LOG"] != nil ? .info : .critical
        let endpoint = Endpoint(host: "127.0.0.1", port: self.port)
        var clients: [TetherClient] = []
        try await withThrowingDiscardingTaskGroup { group in
            for index in 0..<self.count {
                let client = try TetherClient(configuration: .init(endpoints: [endpoint], clientID: "idle-\(index)"), logger: logger)
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

/// Resident memory of process `pid`, KiB, from /proc (Linux).
func residentKiB(pid: Int32) -> Int? {
    guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return nil }
    for line in status.split(separator: "\n") where line.hasPrefix("VmRSS:") {
        return Int(line.split(separator: " ").dropFirst().first ?? "")
    }
    return nil
}
