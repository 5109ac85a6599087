public import Foundation
import Logging
import PostgresNIO
import TetherProcess

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A private PostgreSQL server in a directory of its own: what `tether postgres start` runs for
/// a newcomer's cluster, and what the tests start and stop.
///
/// It runs the installed PostgreSQL's `initdb` and `pg_ctl` (Debian's
/// `/usr/lib/postgresql/<version>/bin`, or those on `PATH`). PostgreSQL refuses to run as
/// root: as root, the server runs as the `postgres` user (Debian's package creates it) through
/// `runuser`, and the directory is given to that user. It listens on loopback only, with one
/// role, `tether`, trusted without a password: a server for development and tests, not for
/// production.
///
/// ```swift
/// let server = try LocalPostgres(directory: URL(fileURLWithPath: "/tmp/tether-pg"), port: 5433)
/// try server.start()          // initdb on first use, then pg_ctl start
/// print(server.url)           // postgres://tether@127.0.0.1:5433/tether
/// try server.stop()
/// ```
public struct LocalPostgres: Sendable {
    /// A failure to find, prepare, start or stop the server.
    public struct Error: Swift.Error, CustomStringConvertible {
        public var message: String
        public var description: String { self.message }
    }

    /// Where the administrative queries log.
    private static let logger = Logger(label: "tether.postgres.local")

    /// Where the server keeps its data, socket and log.
    public let directory: URL
    /// The loopback port it listens on.
    public let port: Int
    /// Where PostgreSQL's programs are.
    public let binaries: URL
    /// The user the server runs as when this process is root (`nil`: the current user).
    public let runAs: String?
    /// The loopback addresses it listens on (`127.0.0.1` by default; the nemesis gives each
    /// node an address of its own, so that it can cut one node off).
    public var listenAddresses = ["127.0.0.1"]

    /// The URL that connects to it (role and database `tether`, no password).
    public var url: String { "postgres://tether@127.0.0.1:\(self.port)/tether" }

    /// The server's log file.
    public var logFile: URL { self.directory.appendingPathComponent("server.log") }

    private var dataDirectory: URL { self.directory.appendingPathComponent("data") }

    /// Finds PostgreSQL's programs; does not touch the directory yet.
    /// - Throws: ``Error`` if PostgreSQL is not installed, or this process is root and there is
    ///   no `postgres` user to run it as.
    public init(directory: URL, port: Int) throws(Error) {
        self.directory = directory
        self.port = port
        guard let binaries = Self.findBinaries() else {
            throw Error(
                message: "PostgreSQL's server programs (initdb, pg_ctl) are not installed; on Debian or Ubuntu: "
                    + "apt-get install postgresql (or every test tool with scripts/install-test-tools)"
            )
        }
        self.binaries = binaries
        if geteuid() == 0 {
            guard getpwnam("postgres") != nil else {
                throw Error(message: "PostgreSQL refuses to run as root, and there is no 'postgres' user to run it as (useradd postgres)")
            }
            self.runAs = "postgres"
        } else {
            self.runAs = nil
        }
    }

    /// Whether PostgreSQL's server programs are installed here.
    public static var isInstalled: Bool { Self.findBinaries() != nil }

    /// Creates the cluster on first use (`initdb`), then starts the server and waits until it
    /// takes connections. A server already running in the directory is left running.
    /// - Parameter fsync: Whether commits are flushed to disk; tests turn it off for speed
    ///   (a crash of the machine, not of a process, may then lose commits).
    public func start(fsync: Bool = true) throws(Error) {
        try self.prepareDirectory()
        if !FileManager.default.fileExists(atPath: self.dataDirectory.appendingPathComponent("PG_VERSION").path) {
            try self.run(
                "initdb",
                ["-D", self.dataDirectory.path, "-U", "tether", "--auth=trust", "-E", "UTF8", "--locale=C", "--no-sync"],
                what: "initdb"
            )
            // The role's own database, so that the URL needs nothing created by hand.
            let conf = self.dataDirectory.appendingPathComponent("postgresql.conf")
            let extra = "\n# tether: a private server on loopback\nmax_connections = 200\n"
            if let handle = try? FileHandle(forWritingTo: conf) {
                handle.seekToEndOfFile()
                handle.write(Data(extra.utf8))
                try? handle.close()
            }
        }
        if self.isRunning { return }
        let options =
            "-p \(self.port) -k \(self.directory.path) -c listen_addresses=\(self.listenAddresses.joined(separator: ",")) -c fsync=\(fsync ? "on" : "off")"
        try self.run(
            "pg_ctl",
            ["-D", self.dataDirectory.path, "-l", self.logFile.path, "-o", options, "-w", "-t", "60", "start"],
            what: "pg_ctl start"
        )
        try self.createDatabaseIfNeeded()
    }

    /// Creates a database on the running server.
    /// - Parameter name: Letters, digits and underscores.
    /// - Returns: Its URL (without TLS: the server listens on loopback only).
    public func createDatabase(_ name: String) async throws -> String {
        guard !name.isEmpty, name.allSatisfy({ $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_") }) else {
            throw Error(message: "'\(name)' is not a database name this creates (letters, digits and underscores)")
        }
        let admin = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: self.url + "?sslmode=disable"))
        try await withThrowingTaskGroup { group in
            group.addTask { await admin.run() }
            defer { group.cancelAll() }
            try await admin.rows(PostgresQuery(unsafeSQL: "CREATE DATABASE \(name)"), logger: Self.logger)
        }
        return "postgres://tether@127.0.0.1:\(self.port)/\(name)?sslmode=disable"
    }

    /// Ends every client's connection to the server but this call's own
    /// (`pg_terminate_backend`), as an administrator or a failover would.
    /// - Returns: How many connections were ended.
    public func terminateConnections() async throws -> Int {
        let admin = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: self.url + "?sslmode=disable"))
        return try await withThrowingTaskGroup { group in
            group.addTask { await admin.run() }
            defer { group.cancelAll() }
            return try await admin.rows(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'",
                logger: Self.logger
            ).count(where: { try $0.decode(Bool.self) })
        }
    }

    /// Makes every transaction read-only, in every session, open or new, or undoes it:
    /// `ALTER SYSTEM SET default_transaction_read_only`, then a reload — as a server left a
    /// standby by a failover, or put read-only by a guard against a full disk, refuses writes
    /// (`cannot execute INSERT in a read-only transaction`).
    public func setReadOnly(_ readOnly: Bool) async throws {
        let admin = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: self.url + "?sslmode=disable"))
        try await withThrowingTaskGroup { group in
            group.addTask { await admin.run() }
            defer { group.cancelAll() }
            let logger = Self.logger
            try await admin.withConnection { connection in
                // (This session's own transactions must be allowed to write the setting back.)
                try await connection.rows("SET default_transaction_read_only = off", logger: logger)
                let change =
                    readOnly ? "ALTER SYSTEM SET default_transaction_read_only = on" : "ALTER SYSTEM RESET default_transaction_read_only"
                try await connection.rows(PostgresQuery(unsafeSQL: change), logger: logger)
                try await connection.rows("SELECT pg_reload_conf()", logger: logger)
            }
        }
    }

    /// Stops the server (fast shutdown: open connections are closed).
    /// - Parameter immediately: Stops it as a crash would (`pg_ctl -m immediate`): recovery
    ///   runs at the next start.
    public func stop(immediately: Bool = false) throws(Error) {
        guard self.isRunning else { return }
        try self.run(
            "pg_ctl",
            ["-D", self.dataDirectory.path, "-m", immediately ? "immediate" : "fast", "-w", "-t", "60", "stop"],
            what: "pg_ctl stop"
        )
    }

    /// Stops the server if it runs and deletes the directory.
    public func destroy() {
        try? self.stop(immediately: true)
        try? FileManager.default.removeItem(at: self.directory)
    }

    /// Whether a server runs in the directory.
    public var isRunning: Bool {
        FileManager.default.fileExists(atPath: self.dataDirectory.appendingPathComponent("postmaster.pid").path)
            && (try? self.run("pg_ctl", ["-D", self.dataDirectory.path, "status"], what: "pg_ctl status")) != nil
    }

    /// A port nothing listens on now (taken by binding port 0 and letting it go).
    public static func freePort() throws(LocalPostgres.Error) -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        guard fd >= 0 else { throw LocalPostgres.Error(message: "socket() failed") }
        defer { close(fd) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        address.sin_port = 0
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) }
        }
        guard bound == 0 else { throw LocalPostgres.Error(message: "bind() failed") }
        let named = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &length) }
        }
        guard named == 0 else { throw LocalPostgres.Error(message: "getsockname() failed") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    // MARK: Internals

    private func prepareDirectory() throws(Error) {
        do {
            try FileManager.default.createDirectory(at: self.directory, withIntermediateDirectories: true)
        } catch {
            throw Error(message: "cannot create \(self.directory.path): \(error)")
        }
        guard let runAs, let user = getpwnam(runAs) else { return }
        let uid = user.pointee.pw_uid
        let gid = user.pointee.pw_gid
        // The server's user must own its directory, and reach it through the parents.
        _ = chown(self.directory.path, uid, gid)
        _ = chmod(self.directory.path, 0o700)
        var parent = self.directory.deletingLastPathComponent()
        while parent.path != "/" && !parent.path.isEmpty {
            var info = stat()
            if stat(parent.path, &info) == 0, info.st_mode & 0o001 == 0 { _ = chmod(parent.path, info.st_mode & 0o7777 | 0o001) }
            parent = parent.deletingLastPathComponent()
        }
        if FileManager.default.fileExists(atPath: self.dataDirectory.path) {
            _ = chown(self.dataDirectory.path, uid, gid)
        }
    }

    private func createDatabaseIfNeeded() throws(Error) {
        let exists =
            (try? self.run(
                "psql",
                [
                    "-h", "127.0.0.1", "-p", "\(self.port)", "-U", "tether", "-d", "postgres", "-tAc",
                    "SELECT 1 FROM pg_database WHERE datname = 'tether'",
                ],
                what: "psql"
            ))?.contains("1") ?? false
        if !exists {
            try self.run("createdb", ["-h", "127.0.0.1", "-p", "\(self.port)", "-U", "tether", "tether"], what: "createdb")
        }
    }

    /// Runs one of PostgreSQL's programs (as ``runAs`` when set) and returns what it printed.
    @discardableResult
    private func run(_ program: String, _ arguments: [String], what: String) throws(Error) -> String {
        let executable = self.binaries.appendingPathComponent(program).path
        // From `/`: the server's user may not be allowed into the current directory.
        let command = self.runAs.map { [Self.runuser, "-u", $0, "--", executable] + arguments } ?? [executable] + arguments
        let argv = ["/bin/sh", "-c", "cd / && exec \"$@\"", "sh"] + command
        // The output goes to a file, not a pipe: `pg_ctl start` leaves a server behind that
        // would hold a pipe open.
        let completed: SpawnedProgram.Completed
        do {
            completed = try SpawnedProgram.run(argv)
        } catch {
            throw Error(message: error.description)
        }
        let printed = completed.output
        guard completed.termination.succeeded else {
            var message = "\(what) failed (\(completed.termination)): \(printed.trimmingCharacters(in: .whitespacesAndNewlines))"
            if what == "pg_ctl start", let log = try? String(contentsOf: self.logFile, encoding: .utf8) {
                message += "\nserver log:\n" + log.split(separator: "\n").suffix(10).joined(separator: "\n")
            }
            throw Error(message: message)
        }
        return printed
    }

    private static let runuser =
        ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser"].first {
            FileManager.default.isExecutableFile(atPath: $0)
        } ?? "/usr/sbin/runuser"

    /// Debian's newest `/usr/lib/postgresql/<version>/bin`, Homebrew's, or the directory of
    /// `initdb` on `PATH`.
    private static func findBinaries() -> URL? {
        let fileManager = FileManager.default
        let debian = "/usr/lib/postgresql"
        if let versions = try? fileManager.contentsOfDirectory(atPath: debian) {
            for version in versions.sorted(by: { (Int($0) ?? 0) > (Int($1) ?? 0) }) {
                let bin = URL(fileURLWithPath: debian).appendingPathComponent(version).appendingPathComponent("bin")
                if fileManager.isExecutableFile(atPath: bin.appendingPathComponent("pg_ctl").path) { return bin }
            }
        }
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        for directory in path.split(separator: ":").map(String.init) + ["/opt/homebrew/bin", "/usr/local/bin"] {
            let bin = URL(fileURLWithPath: directory)
            if fileManager.isExecutableFile(atPath: bin.appendingPathComponent("initdb").path),
                fileManager.isExecutableFile(atPath: bin.appendingPathComponent("pg_ctl").path)
            {
                return bin
            }
        }
        return nil
    }
}
