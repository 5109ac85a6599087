import Foundation
import Logging
import NIOCore
import PostgresNIO
import Testing
import TetherTestSupport

@testable import TetherPostgres

/// The queries of TetherPostgres collect their rows on the connection's event loop
/// (`PostgresRows.swift`). PostgresNIO 1.33.2's async row sequence crashes the process when a
/// connection ends while rows wait for a consumer that has not asked for more. Replayed by hand
/// (a test of this file, since removed, as it takes the test process down): 20,000 rows of 200
/// bytes through `PostgresConnection.query`, one row taken, the backend terminated, a second's
/// pause — "RowStreamStateMachine.swift:94: Fatal error: How can we receive a body part, after a
/// channelReadComplete, but no read has been forwarded yet. Invalid state: waitingForDemand([])".
@Suite("PostgreSQL rows collected on the event loop")
struct PostgresRowsTests {
    let logger = Logger(label: "test")

    @Test("a connection terminated while a query's rows stream fails the query; the process and the pool go on", .requires(.postgresql))
    func terminatedMidQuery() async throws {
        try await TestPostgres.withDatabase { client, _ in
            try await client.withConnection { connection in
                let pid = try await connection.rows("SELECT pg_backend_pid()", logger: self.logger)[0].decode(Int32.self)
                try await withThrowingTaskGroup { group in
                    group.addTask {
                        // 9,999 rows stream, then the backend sleeps before the rest.
                        await #expect(throws: (any Error).self) {
                            try await connection.rows(
                                """
                                SELECT g, repeat('x', 200) FROM generate_series(1, 20000) g
                                WHERE (CASE WHEN g = 10000 THEN pg_sleep(30)::text ELSE '' END) = ''
                                """,
                                logger: self.logger
                            )
                        }
                    }
                    try await eventually("the query is asleep half-way") {
                        let asleep = try? await client.rows(
                            "SELECT count(*) FROM pg_stat_activity WHERE pid = \(pid) AND wait_event = 'PgSleep'",
                            logger: self.logger
                        )[0].decode(Int64.self)
                        return asleep == 1
                    }
                    try await client.rows("SELECT pg_terminate_backend(\(pid))", logger: self.logger)
                    try await group.waitForAll()
                }
            }
            #expect(try await client.rows("SELECT 1", logger: self.logger)[0].decode(Int32.self) == 1)
        }
    }

    /// A statement of every parameter type the group commit binds.
    struct EchoStatement: PreparedStatement {
        static let sql = "SELECT t, n, b, f FROM unnest($1::text[], $2::int8[], $3::bytea[], $4::bool[]) AS e(t, n, b, f)"
        var texts: [String]
        var numbers: [Int64]
        var bytes: [ByteBuffer]
        var flags: [Bool]

        func binds() throws -> [PostgresData] {
            [
                try PostgresData(encoding: self.texts), try PostgresData(encoding: self.numbers),
                try PostgresData(encoding: self.bytes), try PostgresData(encoding: self.flags),
            ]
        }

        func decodeRow(_ row: PostgresRow) throws -> (String, Int64, ByteBuffer, Bool) {
            try row.decodeBinary((String, Int64, ByteBuffer, Bool).self)
        }
    }

    @Test(
        "a prepared statement is prepared once per connection, binds arrays of text, int8, bytea and bool, and decodes its rows",
        .requires(.postgresql)
    )
    func preparedOncePerConnection() async throws {
        try await TestPostgres.withDatabase { client, _ in
            let prepared = PreparedStatements()
            let statement = EchoStatement(
                texts: ["a", "é"],
                numbers: [1, -2],
                bytes: [ByteBuffer(string: "x"), ByteBuffer(bytes: [0, 255])],
                flags: [true, false]
            )
            try await client.withConnection { connection in
                for _ in 1...3 {
                    let rows = try await prepared.rows(statement, on: connection)
                    #expect(rows.map(\.0) == ["a", "é"])
                    #expect(rows.map(\.1) == [1, -2])
                    #expect(rows.map(\.2) == [ByteBuffer(string: "x"), ByteBuffer(bytes: [0, 255])])
                    #expect(rows.map(\.3) == [true, false])
                }
                let count = try await connection.rows("SELECT count(*) FROM pg_prepared_statements", logger: self.logger)
                #expect(try count[0].decode(Int64.self) == 1, "prepared once on this connection")
            }
        }
    }

    struct DivideStatement: PreparedStatement {
        static let sql = "SELECT 1 / $1::int8"
        var divisor: Int64
        func binds() throws -> [PostgresData] { [try PostgresData(encoding: self.divisor)] }
        func decodeRow(_ row: PostgresRow) throws -> Int64 { try row.decodeBinary(Int64.self) }
    }

    @Test("a prepared statement that fails is described by PostgreSQL's message, as every other query is", .requires(.postgresql))
    func preparedFailureDescribed() async throws {
        try await TestPostgres.withDatabase { client, _ in
            let prepared = PreparedStatements()
            try await client.withConnection { connection in
                let quarter = try await prepared.rows(DivideStatement(divisor: 4), on: connection)
                #expect(quarter == [0])
                do {
                    _ = try await prepared.rows(DivideStatement(divisor: 0), on: connection)
                    Issue.record("1 / 0 did not fail")
                } catch {
                    #expect(PostgresMessageStore.describe(error) == "division by zero")
                }
                do {
                    try await connection.rows("SELECT 1 / 0", logger: self.logger)
                    Issue.record("1 / 0 did not fail")
                } catch {
                    #expect(PostgresMessageStore.describe(error) == "division by zero")
                }
            }
        }
    }

    @Test("no query of TetherPostgres goes around PostgresRows.swift (PostgresNIO's async row sequences crash on a connection's end)")
    func noQueryAroundRows() throws {
        let sources = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("Sources/TetherPostgres")
        let files = try FileManager.default.contentsOfDirectory(at: sources, includingPropertiesForKeys: nil)
            .filter { $0.pathExtension == "swift" && $0.lastPathComponent != "PostgresRows.swift" }
        #expect(files.count > 5)
        let around = try Regex(
            #"\b(client|connection|admin|postgres)\s*\.\s*(query|execute|prepare)\s*\(|PostgresRowSequence|\.collect\(\)"#
        )
        for file in files {
            let lines = try String(contentsOf: file, encoding: .utf8).split(separator: "\n", omittingEmptySubsequences: false)
            for (number, line) in lines.enumerated() where line.contains(around) {
                Issue.record("\(file.lastPathComponent):\(number + 1): \(line.trimmingCharacters(in: .whitespaces))")
            }
        }
    }
}
