import ArgumentParser
import Foundation
import TetherPostgres

struct Postgres: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a private PostgreSQL server for a development cluster (tether serve --postgres).",
        discussion: """
            It runs the installed PostgreSQL's initdb and pg_ctl in a directory of its own, listening on \
            127.0.0.1 only, with one role (tether) trusted without a password: for development, not \
            production. As root, the server runs as the postgres user. Then:
              tether serve --postgres postgres://tether@127.0.0.1:5433/tether --nodes 3
            """,
        subcommands: [Start.self, Stop.self, URL.self]
    )

    struct Location: ParsableArguments {
        @Option(help: "Where the server keeps its data, socket and log.")
        var directory = ".tether/postgres"

        @Option(help: "The loopback port it listens on.")
        var port = 5433

        func server() throws -> LocalPostgres {
            let directory = Foundation.URL(
                fileURLWithPath: self.directory,
                relativeTo: Foundation.URL(fileURLWithPath: FileManager.default.currentDirectoryPath)
            )
            .standardizedFileURL
            do {
                return try LocalPostgres(directory: directory, port: self.port)
            } catch {
                throw ValidationError(error.message)
            }
        }
    }

    struct Start: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Create the server on first use, start it, and print its URL.")

        @OptionGroup var location: Location

        func run() throws {
            let server = try self.location.server()
            do {
                try server.start()
            } catch {
                throw ValidationError(error.message)
            }
            print(server.url)
        }
    }

    struct Stop: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Stop the server (its data stays for the next start).")

        @OptionGroup var location: Location

        func run() throws {
            do {
                try self.location.server().stop()
            } catch let error as LocalPostgres.Error {
                throw ValidationError(error.message)
            }
        }
    }

    struct URL: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Print the server's URL.")

        @OptionGroup var location: Location

        func run() throws {
            print(try self.location.server().url)
        }
    }
}
