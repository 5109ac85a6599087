import ArgumentParser
import Logging
import NIOCore
import Tether
import TetherCore

/// Where a client command connects.
struct GatewayOptions: ParsableArguments {
    @Option(help: "The gateway's host.")
    var host = "127.0.0.1"

    @Option(help: "The gateway's port.")
    var port = 7700

    @Option(help: "The credential sent in HELLO (a JWT for a gateway started with --jwt-key; its subject must be the client id).")
    var token: String?

    var endpoint: Endpoint { Endpoint(host: self.host, port: self.port) }

    /// The client configuration for these options.
    func configuration(clientID: String) -> ClientConfiguration {
        var configuration = ClientConfiguration(endpoints: [self.endpoint], clientID: clientID)
        if let token = self.token { configuration.authentication = .token(ByteBuffer(string: token)) }
        return configuration
    }
}

/// How much the command logs (to standard error).
struct LoggingOptions: ParsableArguments {
    @Option(name: .customLong("log-level"), help: "trace, debug, info, notice, warning, error or critical.")
    var level: String?

    func bootstrap(default defaultLevel: Logger.Level) throws {
        guard let level = self.level.map({ Logger.Level(rawValue: $0) }) ?? defaultLevel else {
            throw ValidationError("unknown log level '\(self.level ?? "")'")
        }
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
    }
}

/// Parses a positive number of seconds.
func duration(seconds: Double, option: String) throws -> Duration {
    guard seconds > 0, seconds.isFinite else { throw ValidationError("--\(option) must be a positive number of seconds") }
    return .nanoseconds(Int64(seconds * 1e9))
}
