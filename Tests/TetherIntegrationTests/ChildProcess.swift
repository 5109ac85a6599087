import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import TetherProcess
import TetherTestSupport

/// A `tether` command run as a real child process, whose standard output is collected in a
/// file (so that nothing is lost when it is killed) and read line by line.
final class ChildProcess: Sendable {
    private let process: SpawnedProgram
    private let outputPath: String
    let arguments: [String]

    /// The `tether` executable built next to this test bundle (`swift build` builds it), or the
    /// one `TETHER_CLI` names.
    static func tetherExecutable(sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        if let path = ProcessInfo.processInfo.environment["TETHER_CLI"] { return path }
        return try Self.builtExecutable("tether", sourceLocation: sourceLocation)
    }

    /// The executable `name` that `swift build` built next to this test bundle.
    static func builtExecutable(_ name: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        let bundle = Bundle.main.executableURL ?? URL(fileURLWithPath: CommandLine.arguments[0])
        let candidate = bundle.deletingLastPathComponent().appendingPathComponent(name).path
        guard FileManager.default.isExecutableFile(atPath: candidate) else {
            Issue.record(
                "the \(name) executable is not at \(candidate): run `swift build --build-tests` first",
                sourceLocation: sourceLocation
            )
            throw CancellationError()
        }
        return candidate
    }

    /// Starts `tether ARGUMENTS`; it is killed when the harness finishes, if still running.
    convenience init(_ arguments: [String], in harness: Harness) throws {
        try self.init(executable: try Self.tetherExecutable(), arguments, in: harness)
    }

    /// Starts `EXECUTABLE ARGUMENTS` (a path); it is killed when the harness finishes, if still running.
    init(executable: String, _ arguments: [String], in harness: Harness) throws {
        self.arguments = arguments
        self.outputPath = FileManager.default.temporaryDirectory.appendingPathComponent("tether-child-\(UUID().uuidString).out").path
        self.process = try SpawnedProgram([executable] + arguments, output: .file(self.outputPath))
        let outputPath = self.outputPath
        harness.onExit {
            self.kill()
            self.process.waitUntilExit()
            try? FileManager.default.removeItem(atPath: outputPath)
        }
    }

    /// Everything it printed so far, by line (a line cut by a kill is left out).
    var lines: [String] {
        guard let data = FileManager.default.contents(atPath: self.outputPath) else { return [] }
        var lines = String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        lines.removeLast()  // empty after a final newline, or an unfinished line
        return lines
    }

    /// The process's id.
    var processIdentifier: Int32 { self.process.processIdentifier }

    /// Whether it still runs.
    var isRunning: Bool { self.process.isRunning }

    /// Its resident memory in bytes (`VmRSS` in `/proc`), or `nil` where there is no `/proc`.
    var residentBytes: Int? {
        guard let status = try? String(contentsOfFile: "/proc/\(self.processIdentifier)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
            let kilobytes = line.split(separator: " ").dropFirst().first.flatMap({ Int($0) })
        else { return nil }
        return kilobytes * 1024
    }

    /// Sends SIGKILL: the process ends at once, without any cleanup.
    func kill() {
        self.process.send(SIGKILL)
    }

    /// Waits until it exits; returns its exit status (or signal number, if killed).
    func exitStatus(timeout: Duration = .seconds(60)) async throws -> Int32 {
        try await eventually("\(self.arguments.first ?? "tether") exits", timeout: timeout) {
            !self.process.isRunning
        }
        return self.process.termination?.status ?? -1
    }
}

/// A TCP port on 127.0.0.1 that nothing listens on right now.
func freePort() async throws -> Int {
    let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
        .bind(host: "127.0.0.1", port: 0)
        .get()
    let port = channel.localAddress!.port!
    try await channel.close()
    return port
}
