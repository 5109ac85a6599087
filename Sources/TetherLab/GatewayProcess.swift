import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import TetherCore

/// A `tether serve` process with an SQLite store, which the lab can kill and start again.
final class GatewayProcess: @unchecked Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    let executable: String
    let port: Int
    let store: String
    let heartbeat: Duration
    /// `nil`: `tether serve`'s default (three heartbeats).
    let idleTimeout: Duration?
    let logFile: String
    private let lock = NIOLock()
    private var process: Process?

    init(executable: String, port: Int, store: String, heartbeat: Duration, idleTimeout: Duration? = nil, logFile: String) {
        self.executable = executable
        self.port = port
        self.store = store
        self.heartbeat = heartbeat
        self.idleTimeout = idleTimeout
        self.logFile = logFile
    }

    /// Starts the gateway and returns once it accepts connections.
    func start() async throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: self.executable)
        process.arguments =
            [
                "serve", "--port", "\(self.port)", "--store", self.store, "--heartbeat", "\(self.heartbeat.totalSeconds)",
                "--log-level", "warning",
            ] + (self.idleTimeout.map { ["--idle-timeout", "\($0.totalSeconds)"] } ?? [])
        if !FileManager.default.fileExists(atPath: self.logFile) {
            FileManager.default.createFile(atPath: self.logFile, contents: nil)
        }
        let log = try FileHandle(forWritingTo: URL(fileURLWithPath: self.logFile))
        log.seekToEndOfFile()
        process.standardOutput = log
        process.standardError = log
        try process.run()
        self.lock.withLock { self.process = process }
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            guard process.isRunning else {
                throw Failure(description: "the gateway exited with \(process.terminationStatus); see \(self.logFile)")
            }
            if await Self.accepts(port: self.port) { return }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw Failure(description: "the gateway did not listen on port \(self.port) within 20 s; see \(self.logFile)")
    }

    /// Kills the gateway with SIGKILL (no goodbye to its clients) and waits for it to exit.
    func kill() {
        guard let process = self.lock.withLock({ self.process }) else { return }
        if process.isRunning {
            Foundation.kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
        }
        self.lock.withLock { self.process = nil }
    }

    private static func accepts(port: Int) async -> Bool {
        do {
            let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.milliseconds(200))
                .connect(host: "127.0.0.1", port: port)
                .get()
            try? await channel.close()
            return true
        } catch {
            return false
        }
    }

    /// A TCP port nothing listens on now.
    static func freePort() async throws -> Int {
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0)
            .get()
        let port = channel.localAddress!.port!
        try await channel.close()
        return port
    }
}
