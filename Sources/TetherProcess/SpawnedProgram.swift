import Foundation
import NIOConcurrencyHelpers

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A program started with `posix_spawn` and waited for with `waitpid` on its own process id.
///
/// The lab, the PostgreSQL helper and the tests start programs (iptables, openssl, pg_ctl,
/// `tether serve`, Python peers) with this instead of Foundation's `Process`: on Linux,
/// `Process.waitUntilExit()` spins the calling thread's run loop until Foundation's SIGCHLD
/// handler marks the process ended, and a CI run hung there for 15 minutes after `openssl`
/// had exited. Here waiting is `waitpid` on the child's own id: it returns when the child
/// ends, whatever else the process does with signals.
///
/// The child starts with the default signal dispositions, an empty signal mask, standard
/// input from `/dev/null` and no descriptor of the parent above 2 (no listening socket of a
/// test leaks into a `tether serve` it starts).
///
/// ```swift
/// let result = try SpawnedProgram.run(["openssl", "version"])
/// print(result.termination, result.output)
/// ```
package final class SpawnedProgram: Sendable {
    /// The child's process id.
    package let processIdentifier: Int32
    /// What was run: the program, then its arguments.
    package let arguments: [String]
    /// How it ended, once reaped. Reaping and signalling happen under this lock, so a signal
    /// never reaches another process that reused the id.
    private let ended = NIOLockedValueBox<Termination?>(nil)

    /// Starts `arguments[0]` (a path, or a name looked up on `PATH`) with the rest as its
    /// arguments.
    ///
    /// - Parameters:
    ///   - arguments: the program and its arguments.
    ///   - output: where its standard output goes.
    ///   - errors: where its standard error goes; `nil`: where its standard output goes.
    /// - Throws: ``SpawnedProgram/Failure`` if it cannot be started (the program is missing,
    ///   the output file cannot be opened).
    package init(_ arguments: [String], output: Output = .inherit, errors: Output? = nil) throws(Failure) {
        guard let program = arguments.first else { throw Failure("no program to run") }
        self.arguments = arguments
        var actions = Self.unset(FileActions.self)
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        Self.redirect(1, to: output, in: &actions)
        if let errors {
            Self.redirect(2, to: errors, in: &actions)
        } else if output != .inherit {
            posix_spawn_file_actions_adddup2(&actions, 1, 2)
        }
        var attributes = Self.unset(Attributes.self)
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var noSignals = sigset_t()
        sigemptyset(&noSignals)
        posix_spawnattr_setsigmask(&attributes, &noSignals)
        var allSignals = sigset_t()
        sigfillset(&allSignals)
        posix_spawnattr_setsigdefault(&attributes, &allSignals)
        var flags = Int32(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF)
        #if canImport(Darwin)
            flags |= Int32(POSIX_SPAWN_CLOEXEC_DEFAULT)
            posix_spawn_file_actions_addinherit_np(&actions, 0)
            posix_spawn_file_actions_addinherit_np(&actions, 1)
            posix_spawn_file_actions_addinherit_np(&actions, 2)
        #else
            if let closeFrom = Self.addCloseFrom { _ = closeFrom(&actions, 3) }
        #endif
        posix_spawnattr_setflags(&attributes, Int16(truncatingIfNeeded: flags))

        let cArguments = arguments.map { strdup($0) } + [nil]
        defer { for argument in cArguments { free(argument) } }
        var pid = pid_t()
        let spawned =
            program.contains("/")
            ? posix_spawn(&pid, program, &actions, &attributes, cArguments, environ)
            : posix_spawnp(&pid, program, &actions, &attributes, cArguments, environ)
        guard spawned == 0 else {
            throw Failure("cannot run \(program): \(String(cString: strerror(spawned)))")
        }
        self.processIdentifier = pid
    }

    #if canImport(Darwin)
        // Darwin's are opaque pointers, imported as optionals.
        private typealias FileActions = posix_spawn_file_actions_t?
        private typealias Attributes = posix_spawnattr_t?
        private static func unset<T: ExpressibleByNilLiteral>(_: T.Type) -> T { nil }
    #else
        private typealias FileActions = posix_spawn_file_actions_t
        private typealias Attributes = posix_spawnattr_t
        private static func unset(_: FileActions.Type) -> FileActions { FileActions() }
        private static func unset(_: Attributes.Type) -> Attributes { Attributes() }
    #endif

    private static func redirect(_ descriptor: Int32, to output: Output, in actions: inout FileActions) {
        switch output {
        case .inherit:
            break
        case .discard:
            posix_spawn_file_actions_addopen(&actions, descriptor, "/dev/null", O_WRONLY, 0)
        case .file(let path, let append):
            posix_spawn_file_actions_addopen(&actions, descriptor, path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0o644)
        }
    }

    #if !canImport(Darwin)
        /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 and later), which its Swift
        /// module does not declare; `nil` where the C library has none.
        private static let addCloseFrom: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32)? = {
            guard let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") else { return nil }
            return unsafeBitCast(symbol, to: (@convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32).self)
        }()
    #endif

    /// How it ended, or `nil` while it runs (reaps it if it has ended).
    package var termination: Termination? {
        self.ended.withLockedValue { ended in
            if ended == nil { ended = self.reap(options: WNOHANG) }
            return ended
        }
    }

    /// Whether it still runs.
    package var isRunning: Bool { self.termination == nil }

    /// Sends `signal` unless it has already been reaped.
    package func send(_ signal: Int32) {
        self.ended.withLockedValue { ended in
            if ended == nil { _ = kill(self.processIdentifier, signal) }
        }
    }

    /// Blocks the calling thread until it ends; for programs that end on their own soon (or
    /// after SIGKILL). An async caller that may wait long uses ``exit(pollingEvery:)``.
    @discardableResult
    package func waitUntilExit() -> Termination {
        while true {
            if let termination = self.termination { return termination }
            // Waits without reaping (WNOWAIT), outside the lock; the next turn reaps under it.
            var info = siginfo_t()
            _ = waitid(P_PID, id_t(self.processIdentifier), &info, WEXITED | WNOWAIT)
        }
    }

    /// Waits until it ends, checking every `interval`, without blocking a thread.
    ///
    /// - Throws: `CancellationError` if the task is cancelled first.
    @discardableResult
    package func exit(pollingEvery interval: Duration = .milliseconds(10)) async throws -> Termination {
        while true {
            if let termination = self.termination { return termination }
            try await Task.sleep(for: interval)
        }
    }

    deinit {
        // Reaps an ended child, so that it does not stay a zombie; a running one is left alone.
        _ = self.termination
    }

    /// `waitpid` on the child's id; `nil` while it runs (with `WNOHANG`).
    private func reap(options: Int32) -> Termination? {
        var status: Int32 = 0
        while true {
            let result = waitpid(self.processIdentifier, &status, options)
            if result == self.processIdentifier { return Termination(waitStatus: status) }
            if result == 0 { return nil }
            if errno == EINTR { continue }
            // ECHILD: something else in this process reaped it; it has ended, how is unknown.
            return .exited(-1)
        }
    }
}

extension SpawnedProgram {
    /// Where a program's standard output or standard error goes.
    package enum Output: Sendable, Equatable {
        /// This process's own.
        case inherit
        /// `/dev/null`.
        case discard
        /// A file, created if missing, truncated unless `append`.
        case file(String, append: Bool = false)
    }

    /// How a program ended.
    package enum Termination: Sendable, Hashable, CustomStringConvertible {
        /// It exited with this status.
        case exited(Int32)
        /// A signal ended it.
        case signalled(Int32)

        init(waitStatus status: Int32) {
            let signal = status & 0x7f
            self = signal == 0 ? .exited((status >> 8) & 0xff) : .signalled(signal)
        }

        /// The exit status, or the signal's number if a signal ended it (as Foundation's
        /// `Process.terminationStatus`).
        package var status: Int32 {
            switch self {
            case .exited(let status), .signalled(let status): status
            }
        }

        /// Whether it exited with status 0.
        package var succeeded: Bool { self == .exited(0) }

        package var description: String {
            switch self {
            case .exited(let status): "exit status \(status)"
            case .signalled(let signal): "signal \(signal)"
            }
        }
    }

    /// A program that could not be started.
    package struct Failure: Error, CustomStringConvertible {
        package let description: String
        init(_ description: String) { self.description = description }
    }

    /// A program run to completion and what it printed.
    package struct Completed: Sendable {
        /// How it ended.
        package let termination: Termination
        /// Its standard output and standard error, interleaved as written.
        package let output: String
    }

    /// Runs `arguments` to completion, blocking the calling thread; its output goes to a
    /// temporary file (not a pipe: a daemon it leaves behind would hold a pipe open).
    package static func run(_ arguments: [String]) throws(Failure) -> Completed {
        let path = Self.outputPath()
        defer { unlink(path) }
        let program = try SpawnedProgram(arguments, output: .file(path))
        let termination = program.waitUntilExit()
        return Completed(termination: termination, output: Self.read(path))
    }

    /// Runs `arguments` to completion without blocking a thread; its output as the blocking `run`.
    package static func run(_ arguments: [String]) async throws -> Completed {
        let path = Self.outputPath()
        defer { unlink(path) }
        let program = try SpawnedProgram(arguments, output: .file(path))
        let termination: Termination
        do {
            termination = try await program.exit()
        } catch {
            program.send(SIGKILL)
            program.waitUntilExit()
            throw error
        }
        return Completed(termination: termination, output: Self.read(path))
    }

    private static func outputPath() -> String {
        FileManager.default.temporaryDirectory.appendingPathComponent(
            "tether-program-\(getpid())-\(UInt64.random(in: 0...UInt64.max)).out"
        ).path
    }

    private static func read(_ path: String) -> String {
        FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) } ?? ""
    }
}
