import Foundation
import Logging
import NIOConcurrencyHelpers
package import PostgresNIO
import TetherGateway
package import TetherPostgres

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// The private PostgreSQL server of this test process: started at first use in a temporary
/// directory, stopped and deleted when the process exits. Each test gets a database of its own.
package enum TestPostgres {
    private static let server = NIOLockedValueBox<Result<LocalPostgres, LocalPostgres.Error>?>(nil)
    private static let databases = NIOLockedValueBox(0)

    /// The running server, started if needed.
    package static func shared() throws -> LocalPostgres {
        try OutsideTool.postgresql.require()
        let result = self.server.withLockedValue { server -> Result<LocalPostgres, LocalPostgres.Error> in
            if let server { return server }
            let started = Result { () throws(LocalPostgres.Error) -> LocalPostgres in
                let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
                    "tether-pg-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
                )
                let postgres = try LocalPostgres(directory: directory, port: try LocalPostgres.freePort())
                try postgres.start(fsync: false)
                return postgres
            }
            server = started
            if case .success = started { atexit { TestPostgres.stopAtExit() } }
            return started
        }
        return try result.get()
    }

    private static func stopAtExit() {
        if case .success(let postgres) = self.server.withLockedValue({ $0 }) { postgres.destroy() }
    }

    /// A new, empty database on the shared server.
    /// - Returns: Its URL.
    package static func makeDatabase() async throws -> String {
        let server = try self.shared()
        let number = self.databases.withLockedValue { count -> Int in
            count += 1
            return count
        }
        return try await server.createDatabase("t\(getpid())_\(number)")
    }

    /// Runs `body` with a client of a new, empty database.
    package static func withDatabase<T: Sendable>(_ body: (PostgresClient, String) async throws -> T) async throws -> T {
        let url = try await self.makeDatabase()
        let client = PostgresClient(configuration: try PostgresMessageStore.clientConfiguration(url: url))
        return try await withThrowingTaskGroup { group in
            group.addTask { await client.run() }
            defer { group.cancelAll() }
            return try await body(client, url)
        }
    }
}
