import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import TetherGateway
import TetherPostgres

/// What a benchmark gateway needs to be a node of a cluster.
struct ClusterNodeOptions: Sendable {
    var url: String
    var name: String

    /// Connects to the database, opens the store and makes the node's cluster membership. The
    /// PostgreSQL client runs for the rest of the process (a benchmark peer ends by being killed).
    func join() async throws -> (store: PostgresMessageStore, cluster: PostgresCluster) {
        let client = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: self.url))
        Task { await client.run() }
        let store = try await PostgresMessageStore(client: client, logger: Peer.logger)
        let cluster = try PostgresCluster(store: store, configuration: .init(url: self.url, name: self.name), logger: Peer.logger)
        return (store, cluster)
    }
}

/// `tether-bench cluster`: Tether's gateways as nodes of a PostgreSQL cluster, beside
/// `pgbench`'s own rate on the same server, in one run: a private PostgreSQL is started
/// (fsync on), `pgbench` runs a transaction of the shape of one reliable message, then reliable
/// messages go end to end through one node and through three (alice on the first, bob on the
/// last), then pushes in bursts to a room spread over three nodes.
///
///     tether-bench cluster --output results/cluster
struct ClusterBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cluster",
        abstract: "Reliable messages and room pushes through a cluster on PostgreSQL, beside pgbench."
    )

    @Option(help: "Reliable messages per run.")
    var messages = 50_000

    @Option(help: "Concurrent senders, each its own conversation.")
    var senders = 64

    @Option(help: "Room members for the push run (spread over three nodes).")
    var members = 10_000

    @Option(help: "Pushes to the room.")
    var pushes = 100

    @Option(help: "Transactions each pgbench client runs (-t: -T relies on SIGALRM, which a child of this process may have blocked).")
    var pgbenchTransactions = 400

    @Option(help: "pgbench's concurrent clients.")
    var pgbenchClients = 16

    @Option(help: "Where the results go.")
    var output = "bench-results/cluster"

    struct PgbenchResult: Codable {
        var clients: Int
        var transactionsPerClient: Int
        var transactionsPerSecond: Double
        var script: String
    }

    func run() async throws {
        try FileManager.default.createDirectory(atPath: self.output, withIntermediateDirectories: true)
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-bench-pg-\(UUID().uuidString)")
        let server = try LocalPostgres(directory: directory, port: try LocalPostgres.freePort())
        try server.start(fsync: true)
        defer { server.destroy() }
        emit("PostgreSQL at \(server.url) (fsync on, synchronous_commit on)")

        let pgbench = try await self.pgbench(server)
        try writeJSON(pgbench, to: "\(self.output)/pgbench.json")
        emit(
            "pgbench, one reliable message per transaction (outcome, conversation, stream, delivery, acknowledgement), "
                + "\(pgbench.clients) clients: \(Int(pgbench.transactionsPerSecond)) transactions/s"
        )
        for nodes in [1, 3] {
            let url = try await server.createDatabase("reliable\(nodes)")
            var reliable = try Reliable.parse([
                "--messages", "\(self.messages)", "--senders", "\(self.senders)", "--limits", "off",
                "--postgres", url, "--nodes", "\(nodes)", "--output", self.output,
            ])
            try await reliable.run()
            try FileManager.default.moveItem(atPath: "\(self.output)/reliable.json", toPath: "\(self.output)/reliable-\(nodes)-nodes.json")
            _ = reliable
        }
        let url = try await server.createDatabase("fanout")
        var fanout = try FanOut.parse([
            "--members", "\(self.members)", "--messages", "\(self.pushes)", "--per-request", "10",
            "--postgres", url, "--nodes", "3", "--output", self.output,
        ])
        try await fanout.run()
        _ = fanout
    }

    /// pgbench with a transaction of the shape of one reliable message: the outcome recorded,
    /// the conversation advanced, the recipient's stream advanced, the delivery stored, then
    /// its acknowledgement deleting it.
    private func pgbench(_ server: LocalPostgres) async throws -> PgbenchResult {
        let url = try await server.createDatabase("pgbench")
        let setup = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: url))
        try await withThrowingTaskGroup { group in
            group.addTask { await setup.run() }
            for statement in [
                "CREATE TABLE conv (id integer PRIMARY KEY, last bigint NOT NULL)",
                "INSERT INTO conv SELECT g, 0 FROM generate_series(1, 64) g",
                """
                CREATE TABLE outcomes (client text, epoch bigint, conversation integer, sequence bigint, status integer, \
                message_id bigint, PRIMARY KEY (client, epoch, conversation, sequence))
                """,
                "CREATE TABLE streams (recipient text PRIMARY KEY, next_sequence bigint NOT NULL)",
                "INSERT INTO streams VALUES ('bob', 1)",
                "CREATE TABLE deliveries (recipient text, sequence bigint, topic text, body bytea, PRIMARY KEY (recipient, sequence))",
            ] {
                try await setup.query(PostgresQuery(unsafeSQL: statement))
            }
            group.cancelAll()
        }
        let body = String(repeating: "6d", count: 32)
        let script = """
            \\set c random(1, 64)
            BEGIN;
            UPDATE conv SET last = last + 1 WHERE id = :c RETURNING last \\gset
            INSERT INTO outcomes VALUES ('alice', 1, :c, :last, 0, :last);
            UPDATE streams SET next_sequence = next_sequence + 1 WHERE recipient = 'bob' RETURNING next_sequence \\gset
            INSERT INTO deliveries VALUES ('bob', :next_sequence, 'dm', '\\x\(body)');
            DELETE FROM deliveries WHERE recipient = 'bob' AND sequence = :next_sequence;
            END;

            """
        let scriptPath = FileManager.default.temporaryDirectory.appendingPathComponent("tether-pgbench-\(UUID().uuidString).sql").path
        try script.write(toFile: scriptPath, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: scriptPath) }
        let process = Process()
        process.executableURL = server.binaries.appendingPathComponent("pgbench")
        process.arguments = [
            "-n", "-f", scriptPath, "-c", "\(self.pgbenchClients)", "-j", "2", "-t", "\(self.pgbenchTransactions)",
            "-h", "127.0.0.1", "-p", "\(server.port)", "-U", "tether", "pgbench",
        ]
        let pipe = Pipe()
        process.standardOutput = pipe
        process.standardError = pipe
        try process.run()
        let printed = String(decoding: pipe.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        guard process.terminationStatus == 0,
            let line = printed.split(separator: "\n").first(where: { $0.hasPrefix("tps = ") }),
            let tps = Double(line.dropFirst(6).split(separator: " ")[0])
        else {
            throw BenchError("pgbench failed: \(printed)")
        }
        return PgbenchResult(
            clients: self.pgbenchClients,
            transactionsPerClient: self.pgbenchTransactions,
            transactionsPerSecond: tps,
            script: script
        )
    }
}
