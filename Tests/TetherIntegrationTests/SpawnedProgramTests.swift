import Foundation
import Testing
import TetherProcess

#if canImport(Glibc)
    import Glibc
#endif

@Suite("Programs started with posix_spawn and waited for with waitpid")
struct SpawnedProgramTests {
    @Test("exit status, signal, output and standard error apart, a missing program")
    func outcomes() async throws {
        let completed = try await SpawnedProgram.run(["/bin/sh", "-c", "echo out; echo err >&2; exit 3"])
        #expect(completed.termination == .exited(3))
        #expect(completed.output == "out\nerr\n")
        #expect(!completed.termination.succeeded)
        let blocking = { () throws -> SpawnedProgram.Completed in try SpawnedProgram.run(["true"]) }
        #expect(try blocking().termination.succeeded, "the blocking run; a name is looked up on PATH")

        let sleeper = try SpawnedProgram(["sleep", "30"], output: .discard)
        #expect(sleeper.isRunning)
        sleeper.send(SIGKILL)
        #expect(try await sleeper.exit() == .signalled(SIGKILL))
        #expect(sleeper.termination?.status == SIGKILL, "the signal's number, as Foundation's terminationStatus")
        sleeper.send(SIGKILL)  // reaped: nothing is sent

        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-spawn-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let out = directory.appendingPathComponent("out").path
        let err = directory.appendingPathComponent("err").path
        let apart = try SpawnedProgram(["/bin/sh", "-c", "echo one; echo two >&2"], output: .file(out), errors: .file(err))
        #expect(apart.waitUntilExit().succeeded)
        let again = try SpawnedProgram(["/bin/sh", "-c", "echo three"], output: .file(out, append: true))
        #expect(again.waitUntilExit().succeeded)
        #expect(try String(contentsOfFile: out, encoding: .utf8) == "one\nthree\n")
        #expect(try String(contentsOfFile: err, encoding: .utf8) == "two\n")

        #expect(throws: SpawnedProgram.Failure.self) { try SpawnedProgram(["tether-no-such-program"]) }
        #expect(throws: SpawnedProgram.Failure.self) { try SpawnedProgram([]) }
    }

    @Test("the child gets no descriptor of this process above 2, and its standard input is empty")
    func descriptors() async throws {
        // Not close-on-exec, and far above what `ls` opens for itself.
        let opened = open("/dev/null", O_RDONLY)
        let leaked = fcntl(opened, F_DUPFD, 300)
        close(opened)
        #expect(leaked >= 300)
        defer { close(leaked) }
        let completed = try await SpawnedProgram.run(["/bin/sh", "-c", "ls /proc/self/fd; cat"])
        #expect(completed.termination.succeeded)
        let descriptors = completed.output.split(separator: "\n").compactMap { Int($0) }
        #expect(descriptors.contains(2) && !descriptors.contains(Int(leaked)), "\(descriptors)")
    }

    @Test("50 programs run at once, each waited for; none is lost")
    func many() async throws {
        let statuses = try await withThrowingTaskGroup(of: Int32.self) { group in
            for index in 0..<50 {
                group.addTask { try await SpawnedProgram.run(["/bin/sh", "-c", "exit \(index % 7)"]).termination.status }
            }
            return try await group.reduce(into: [Int32]()) { $0.append($1) }
        }
        #expect(statuses.sorted() == (0..<50).map { Int32($0 % 7) }.sorted())
    }
}
