import Foundation
import TetherNIO
import TetherProcess

/// A `tether lab worker` process the nemesis can kill, pause and start again.
final class WorkerProcess: Sendable {
    let name: String
    let arguments: [String]
    let logFile: String
    private let process = TetherLock<SpawnedProgram?>(nil)

    init(name: String, arguments: [String], logFile: String) {
        self.name = name
        self.arguments = arguments
        self.logFile = logFile
    }

    var isRunning: Bool { self.process.withLockedValue { $0 }?.isRunning ?? false }

    func start() throws {
        let process = try SpawnedProgram(self.arguments, output: .file(self.logFile, append: true))
        self.process.withLockedValue { $0 = process }
    }

    func signal(_ signal: Int32) {
        self.process.withLockedValue { $0 }?.send(signal)
    }

    /// SIGKILL, and waits for the process to exit.
    func kill() {
        guard let process = self.process.withLockedValue({ $0 }) else { return }
        process.send(SIGKILL)
        _ = process.waitUntilExit()
        self.process.withLockedValue { $0 = nil }
    }
}
