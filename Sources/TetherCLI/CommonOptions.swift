import ArgumentParser
import Logging
import NIOCore
import Tether
import TetherCore

/// Where a client command connects, and how it trusts the gateway.
struct GatewayOptions: ParsableArguments {
    @Option(help: "The gateway's host (without --endpoint).")
    var host = "127.0.0.1"

    @Option(help: "The gateway's port (without --endpoint).")
    var port = 7700

    @Option(
        name: .customLong("endpoint"),
        help: ArgumentHelp(
            "A gateway URL: tether://host:port, tethers://host:port (TLS), ws://host:port/path or wss://host:port/path (WebSocket), http://host:port/path or https://host:port/path (HTTP stream). Repeat it for failover, best first; transports may be mixed.",
            valueName: "url"
        )
    )
    var endpointURLs: [String] = []

    @Option(help: "The credential sent in HELLO (a JWT for a gateway started with --jwt-key; its subject must be the client id).")
    var token: String?

    @Option(
        name: .customLong("ca"),
        help: ArgumentHelp("A PEM file of certificate authorities to trust besides the system's (tethers://, wss://).", valueName: "file")
    )
    var caFile: String?

    @Option(
        name: .customLong("pin"),
        help: ArgumentHelp(
            "A pin of the gateway's public key, sha256/BASE64; repeat it for rotation. A certificate matching none is refused.",
            valueName: "pin"
        )
    )
    var pins: [String] = []

    @Option(name: .customLong("server-name"), help: "The name to check the gateway's certificate against, instead of the host.")
    var serverName: String?

    @Option(
        name: .customLong("client-cert"),
        help: ArgumentHelp("A PEM certificate chain to present to a gateway that asks for one (mutual TLS).", valueName: "file")
    )
    var clientCertificate: String?

    @Option(name: .customLong("client-key"), help: ArgumentHelp("The private key of --client-cert (PEM).", valueName: "file"))
    var clientKey: String?

    @Option(
        name: .customLong("proxy"),
        help: ArgumentHelp(
            "An HTTP proxy to tunnel through (CONNECT): http://[user:password@]host:port, or 'env' for https_proxy/http_proxy/no_proxy as curl reads them.",
            valueName: "url"
        )
    )
    var proxy: String?

    /// The endpoints: `first` (a URL given as an argument), the --endpoint options, or else --host and --port.
    func endpoints(first: String? = nil) throws -> [Endpoint] {
        let texts = (first.map { [$0] } ?? []) + self.endpointURLs
        guard !texts.isEmpty else { return [Endpoint(host: self.host, port: self.port)] }
        return try texts.map { text in
            do {
                return try Endpoint(parsing: text)
            } catch {
                throw ValidationError("\(error)")
            }
        }
    }

    /// The client configuration for these options.
    func configuration(clientID: String, first: String? = nil) throws -> ClientConfiguration {
        var configuration = ClientConfiguration(endpoints: try self.endpoints(first: first), clientID: clientID)
        if let token = self.token { configuration.authentication = .token(ByteBuffer(string: token)) }
        return configuration
    }

    /// The transport, with the TLS options.
    func transport() throws -> TCPClientTransport {
        var tls = ClientTLSConfiguration.defaults
        if let caFile { tls.additionalTrustRoots = [.file(caFile)] }
        tls.pins = try self.pins.map { try CertificatePin($0) }
        tls.serverName = self.serverName
        switch (self.clientCertificate, self.clientKey) {
        case (let chain?, let key?): tls.clientCertificate = (chain: .file(chain), privateKey: .file(key))
        case (nil, nil): break
        default: throw ValidationError("--client-cert and --client-key go together")
        }
        let proxy: ProxySetting
        do {
            proxy =
                switch self.proxy {
                case nil: .none
                case "env": .environment
                case let url?: .always(try HTTPProxy(url: url))
                }
        } catch {
            throw ValidationError("--proxy: \(error.message)")
        }
        do {
            return try TCPClientTransport(tls: tls, proxy: proxy)
        } catch {
            throw ValidationError(error.message)
        }
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
    // Up to a billion seconds (about 31 years): more would not fit a Duration in nanoseconds.
    guard seconds > 0, seconds <= 1e9 else {
        throw ValidationError("\(option.contains(".") ? "--config: " : "--")\(option) must be a positive number of seconds, at most 1e9")
    }
    return .nanoseconds(Int64(seconds * 1e9))
}
