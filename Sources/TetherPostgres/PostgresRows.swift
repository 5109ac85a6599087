import Logging
import NIOCore
package import PostgresNIO
import TetherNIO

// Every query of this module collects its rows on the connection's event loop, through these.
//
// PostgresNIO 1.33.2 crashes the process (a precondition in
// `RowStreamStateMachine.channelReadComplete`) when a connection ends while a query's rows are
// waiting for a consumer that has not asked for more: SwiftNIO reads a closed socket to its end
// whether or not a read was asked for, and the row stream cannot take rows it did not ask for.
// Its `AsyncSequence` of rows (`PostgresClient.query`, `PostgresConnection.query` and
// `execute` in async code) asks for more only as its consumer takes rows, so any consumer a
// little behind a connection's end could crash the gateway (the nemesis saw it: a node down 0.1 s
// after PostgreSQL was stopped, while it read a channel's history). Rows collected on the event
// loop are asked for as they arrive, so the stream is never in that state; a connection that
// ends mid-query fails the query. `PostgresRowsTests` replays the crash and checks that no query
// of this module goes around these.

extension PostgresConnection {
    /// Runs `query` and returns all its rows, collected on the connection's event loop.
    ///
    /// - Parameters:
    ///   - query: The statement and its bindings.
    ///   - logger: Where PostgresNIO logs the query.
    /// - Returns: The rows, in the order PostgreSQL sent them.
    @discardableResult
    package func rows(_ query: PostgresQuery, logger: Logger) async throws -> [PostgresRow] {
        try await self.query(query, logger: logger).get().rows
    }
}

extension PostgresClient {
    /// Runs `query` on a pooled connection and returns all its rows, collected on the
    /// connection's event loop.
    ///
    /// ```swift
    /// for row in try await client.rows("SELECT id FROM t WHERE k = \(key)", logger: logger) {
    ///     let id = try row.decode(Int64.self)
    /// }
    /// ```
    ///
    /// - Parameters:
    ///   - query: The statement and its bindings.
    ///   - logger: Where PostgresNIO logs the query.
    /// - Returns: The rows, in the order PostgreSQL sent them.
    @discardableResult
    package func rows(_ query: PostgresQuery, logger: Logger) async throws -> [PostgresRow] {
        try await self.withConnection { connection in try await connection.rows(query, logger: logger) }
    }
}

/// A statement prepared once per connection (parsed and planned once), its rows collected on the
/// connection's event loop.
protocol PreparedStatement: Sendable {
    associatedtype Row
    /// The statement, with `$1`, `$2`, … for ``binds()``.
    static var sql: String { get }
    /// The values of the statement's parameters, in order.
    func binds() throws -> [PostgresData]
    /// One row of the result; decode it with ``PostgresNIO/PostgresRow/decodeBinary(_:)``.
    func decodeRow(_ row: PostgresRow) throws -> Row
}

/// The statements prepared on each connection of a pool, by connection and statement.
final class PreparedStatements: Sendable {
    private struct Key: Hashable {
        var connection: PostgresConnection.ID
        var statement: ObjectIdentifier
    }

    /// How many prepared statements are remembered before all are forgotten; those of open
    /// connections are prepared again on their next use (the connections of a pool come and go,
    /// and a closed one's entries would otherwise stay).
    static let limit = 256

    private let prepared = TetherLock<[Key: PreparedQuery]>([:])

    init() {}

    /// Executes `statement` on `connection`, preparing it there first if it was not yet.
    /// - Returns: The decoded rows.
    func rows<Statement: PreparedStatement>(
        _ statement: Statement,
        on connection: PostgresConnection
    ) async throws -> [Statement.Row] {
        let key = Key(connection: connection.id, statement: ObjectIdentifier(Statement.self))
        let query: PreparedQuery
        if let known = self.prepared.withLockedValue({ $0[key] }) {
            query = known
        } else {
            query = try await connection.prepare(query: Statement.sql).get()
            self.prepared.withLockedValue { prepared in
                if prepared.count >= Self.limit { prepared.removeAll() }
                prepared[key] = query
            }
        }
        return try await query.execute(try statement.binds()).get().map(statement.decodeRow)
    }
}

extension PostgresData {
    /// `value` in PostgreSQL's binary format, as a parameter of a ``PreparedStatement``.
    init<Value: PostgresEncodable>(encoding value: Value) throws {
        var buffer = ByteBuffer()
        try value.encode(into: &buffer, context: .default)
        self.init(type: Value.psqlType, formatCode: Value.psqlFormat, value: buffer)
    }
}

extension Array where Element == PostgresRow {
    /// Every row decoded as `columns`, as `PostgresRow.decode(_:)` decodes one.
    ///
    /// ```swift
    /// for (name, count) in try rows.decode((String, Int64).self) { … }
    /// ```
    package func decode<each Column: PostgresDecodable>(
        _ columns: (repeat each Column).Type,
        file: String = #fileID,
        line: Int = #line
    ) throws -> [(repeat each Column)] {
        try self.map { try $0.decode(columns, file: file, line: line) }
    }
}

extension PostgresRow {
    /// The row's cells decoded as `columns`, read in PostgreSQL's binary format.
    ///
    /// For the rows of a ``PreparedStatement``: PostgresNIO's `PreparedQuery` describes its
    /// columns as text, as PostgreSQL's description of the statement says, but asks for them,
    /// and gets them, in binary; `decode(_:)` would read the bytes of an `int8` as digits.
    func decodeBinary<each Column: PostgresDecodable>(_ columns: (repeat each Column).Type) throws -> (repeat each Column) {
        var cells = self.makeIterator()
        func next<Value: PostgresDecodable>(_ type: Value.Type) throws -> Value {
            guard var cell = cells.next() else {
                throw PostgresStoreError("a row of \(self.count) columns, fewer than the statement's")
            }
            cell.format = .binary
            return try cell.decode(Value.self)
        }
        return (repeat try next((each Column).self))
    }
}
