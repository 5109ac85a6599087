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
        /// Reliable messages each transaction stands for.
        var messagesPerTransaction: Int
        var messagesPerSecond: Double { self.transactionsPerSecond * Double(self.messagesPerTransaction) }
        var script: String
    }

    @Option(help: "Messages per transaction of the group-shaped pgbench (about a group's size in the one-node run).")
    var groupSize = 128

    @Option(help: "The group-shaped pgbench's concurrent clients beside one (the store commits up to 4 groups at once).")
    var groupClients = 4

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
        // One client: the ceiling of one sender's lane, whose groups commit one after another;
        // several: PostgreSQL's ceiling for the shape, with lanes that never wait for each other.
        for clients in Set([1, self.groupClients]).sorted() {
            let grouped = try await self.groupPgbench(server, clients: clients)
            try writeJSON(grouped, to: "\(self.output)/pgbench-group-\(clients).json")
            emit(
                "pgbench, a group of \(grouped.messagesPerTransaction) reliable messages per transaction (64 conversations locked and "
                    + "advanced, outcomes, stream, deliveries, the previous group's acknowledgements), \(grouped.clients) client(s): "
                    + "\(Int(grouped.transactionsPerSecond)) transactions/s = \(Int(grouped.messagesPerSecond)) messages/s"
            )
        }
        for nodes in [1, 3] {
            let url = try await server.createDatabase("reliable\(nodes)")
            let reliable = try Reliable.parse([
                "--messages", "\(self.messages)", "--senders", "\(self.senders)", "--limits", "off",
                "--postgres", url, "--nodes", "\(nodes)", "--output", self.output, "--peers", "tether",
            ])
            try await reliable.run()
            try FileManager.default.moveItem(atPath: "\(self.output)/reliable.json", toPath: "\(self.output)/reliable-\(nodes)-nodes.json")
        }
        let url = try await server.createDatabase("fanout")
        let fanout = try FanOut.parse([
            "--members", "\(self.members)", "--messages", "\(self.pushes)", "--per-request", "10",
            "--postgres", url, "--nodes", "3", "--output", self.output,
        ])
        try await fanout.run()
    }

    /// pgbench with a transaction of the shape of one reliable message: the outcome recorded,
    /// the conversation advanced, the recipient's stream advanced, the delivery stored, then
    /// its acknowledgement deleting it.
    private func pgbench(_ server: LocalPostgres) async throws -> PgbenchResult {
        let body = String(repeating: "6d", count: 32)
        return try await self.runPgbench(
            server,
            database: "pgbench",
            setup: [
                "CREATE TABLE conv (id integer PRIMARY KEY, last bigint NOT NULL)",
                "INSERT INTO conv SELECT g, 0 FROM generate_series(1, 64) g",
                """
                CREATE TABLE outcomes (client text, epoch bigint, conversation integer, sequence bigint, status integer, \
                message_id bigint, PRIMARY KEY (client, epoch, conversation, sequence))
                """,
                "CREATE TABLE streams (recipient text PRIMARY KEY, next_sequence bigint NOT NULL)",
                "INSERT INTO streams VALUES ('bob', 1)",
                "CREATE TABLE deliveries (recipient text, sequence bigint, topic text, body bytea, PRIMARY KEY (recipient, sequence))",
            ],
            script: """
                \\set c random(1, 64)
                BEGIN;
                UPDATE conv SET last = last + 1 WHERE id = :c RETURNING last \\gset
                INSERT INTO outcomes VALUES ('alice', 1, :c, :last, 0, :last);
                UPDATE streams SET next_sequence = next_sequence + 1 WHERE recipient = 'bob' RETURNING next_sequence \\gset
                INSERT INTO deliveries VALUES ('bob', :next_sequence, 'dm', '\\x\(body)');
                DELETE FROM deliveries WHERE recipient = 'bob' AND sequence = :next_sequence;
                END;

                """,
            clients: self.pgbenchClients,
            transactions: self.pgbenchTransactions,
            messagesPerTransaction: 1
        )
    }

    /// pgbench with a transaction of the shape of one group commit of the one-node run: a
    /// sender's 64 conversations locked and advanced, a group of outcomes recorded, the
    /// recipient's stream advanced, the group's deliveries stored, and the previous group's
    /// deliveries deleted as acknowledged. Each client is its own sender and recipient, so the
    /// clients do not wait for each other: PostgreSQL's ceiling for this shape.
    private func groupPgbench(_ server: LocalPostgres, clients: Int) async throws -> PgbenchResult {
        let body = String(repeating: "6d", count: 32)
        let size = self.groupSize
        let perConversation = max(1, size / 64)
        return try await self.runPgbench(
            server,
            database: "pgbench_group_\(clients)",
            setup: [
                "CREATE TABLE conv (client text, conversation text, last bigint NOT NULL, PRIMARY KEY (client, conversation))",
                "INSERT INTO conv SELECT 'alice' || c, 'bob-' || g, 0 FROM generate_series(1, \(clients)) c, generate_series(1, 64) g",
                """
                CREATE TABLE outcomes (client text, epoch bigint, conversation text, sequence bigint, status integer, \
                message_id bigint, PRIMARY KEY (client, epoch, conversation, sequence))
                """,
                "CREATE TABLE streams (recipient text PRIMARY KEY, next_sequence bigint NOT NULL)",
                "INSERT INTO streams SELECT 'bob' || c, 1 FROM generate_series(1, \(clients)) c",
                "CREATE TABLE deliveries (recipient text, sequence bigint, topic text, body bytea, PRIMARY KEY (recipient, sequence))",
            ],
            script: """
                BEGIN;
                SELECT count(*) FROM (SELECT 1 FROM conv WHERE client = 'alice' || :client_id + 1 ORDER BY conversation FOR UPDATE) AS l;
                UPDATE conv SET last = last + \(perConversation) WHERE client = 'alice' || :client_id + 1;
                INSERT INTO outcomes SELECT client, 1, conversation, last - g, 0, last - g
                    FROM conv, generate_series(0, \(perConversation - 1)) g WHERE client = 'alice' || :client_id + 1;
                UPDATE streams SET next_sequence = next_sequence + \(size) WHERE recipient = 'bob' || :client_id + 1 RETURNING next_sequence \\gset
                INSERT INTO deliveries SELECT 'bob' || :client_id + 1, :next_sequence - \(size) + g, 'dm', '\\x\(body)'
                    FROM generate_series(0, \(size - 1)) g;
                DELETE FROM deliveries WHERE recipient = 'bob' || :client_id + 1 AND sequence < :next_sequence - \(size);
                END;

                """,
            clients: clients,
            transactions: self.pgbenchTransactions / 4,
            messagesPerTransaction: perConversation * 64
        )
    }

    /// Runs pgbench on a new database of `server` after `setup`, `clients` clients each running
    /// `transactions` transactions of `script`.
    private func runPgbench(
        _ server: LocalPostgres,
        database: String,
        setup statements: [String],
        script: String,
        clients: Int,
        transactions: Int,
        messagesPerTransaction: Int
    ) async throws -> PgbenchResult {
        let url = try await server.createDatabase(database)
        let setup = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: url))
        try await withThrowingTaskGroup { group in
            group.addTask { await setup.run() }
            for statement in statements {
                try await setup.query(PostgresQuery(unsafeSQL: statement))
            }
            group.cancelAll()
        }
        let scriptPath = FileManager.default.temporaryDirectory.appendingPathComponent("tether-pgbench-\(UUID().uuidString).sql").path
        try script.write(toFile: scriptPath, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: scriptPath) }
        let process = Process()
        process.executableURL = server.binaries.appendingPathComponent("pgbench")
        process.arguments = [
            "-n", "-f", scriptPath, "-c", "\(clients)", "-j", "2", "-t", "\(transactions)",
            "-h", "127.0.0.1", "-p", "\(server.port)", "-U", "tether", database,
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
            clients: clients,
            transactionsPerClient: transactions,
            transactionsPerSecond: tps,
            messagesPerTransaction: messagesPerTransaction,
            script: script
        )
    }
}
