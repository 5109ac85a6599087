import ArgumentParser
import Foundation
import Logging
import TetherBackendProxy
import TetherGateway
import TetherServerAPI

/// `tether serve`'s options for a backend in any language: the server API it calls, and the
/// events the gateway hands it.
struct BackendOptions: ParsableArguments {
    @Option(
        name: .customLong("api-port"),
        help: """
            Serve the server API (JSON over HTTP, Sources/TetherServerAPI/openapi.yaml) on this port. Its keys come from \
            TETHER_API_KEYS (comma-separated) or --api-key-file.
            """
    )
    var apiPort: Int?

    @Option(
        name: .customLong("api-grpc-port"),
        help: "With --api-port: serve the server API as gRPC (Protos/tether/v1/server_api.proto) on this port too, with the same keys."
    )
    var apiGRPCPort: Int?

    @Option(name: .customLong("api-host"), help: "With --api-port: the API's address (loopback by default: keep it private).")
    var apiHost: String?

    @Option(name: .customLong("api-key-file"), help: "With --api-port: a file of API keys, one per line (16 to 512 bytes each).")
    var apiKeyFile: String?

    @Option(
        help: """
            The backend's base URL: http://host:port (the events below are POSTed to URL/tether/connect, \
            URL/tether/request/METHOD and URL/tether/message/TOPIC) or grpc://host:port (the backend serves \
            Protos/tether/v1/backend.proto; grpcs:// over TLS).
            """
    )
    var backend: String?

    @Option(
        name: .customLong("backend-ca-file"),
        help: "With --backend grpcs://…: a PEM file of the authorities that sign the backend's certificate (default: the system's)."
    )
    var caFile: String?

    @Flag(name: .customLong("backend-connect"), help: "With --backend: every client's credentials are checked by the backend.")
    var connect = false

    @Flag(
        name: .customLong("backend-disconnect"),
        help: "With --backend: the backend is told when a client's connection closes (a notification, not retried)."
    )
    var disconnect = false

    @Option(
        name: .customLong("backend-channel"),
        help: """
            With --backend: channels whose subscriptions, presence and publications the backend must allow too (a name, or a \
            prefix ending in *; repeat the option).
            """
    )
    var channels: [String] = []

    @Option(
        name: .customLong("backend-request"),
        help: "With --backend: request methods the backend answers (a name, or a prefix ending in *; repeat the option)."
    )
    var requests: [String] = []

    @Option(
        name: .customLong("backend-message"),
        help: "With --backend: reliable-message topics the backend processes, once each (a name or a prefix ending in *; repeat)."
    )
    var messages: [String] = []

    @Option(
        name: .customLong("backend-timeout"),
        help: "With --backend: how long a connect or message call may take, in seconds (default: 5)."
    )
    var timeoutSeconds: Double?

    @Option(name: .customLong("backend-max-calls"), help: "With --backend: the most calls to the backend under way at once (default: 256).")
    var maxCalls: Int?

    @Option(
        name: .customLong("backend-message-batch"),
        help: """
            With --backend: the most reliable messages in one call (default: 1, a call per message). Above 1, the messages \
            waiting at once go together to URL/tether/messages (gRPC Messages), each with its own key and outcome.
            """
    )
    var messageBatch: Int?

    /// The event proxy, if `--backend` is given (or the configuration file's `backend`); an
    /// option wins over the file.
    func proxy(file: ServeFile?, logger: Logger) throws -> BackendProxy? {
        let fromFile = file?.backend
        guard let backend = self.backend ?? fromFile?.url else {
            if self.connect || !self.requests.isEmpty || !self.messages.isEmpty {
                throw ValidationError("--backend-connect, --backend-request and --backend-message need --backend URL")
            }
            return nil
        }
        let configuration: BackendConfiguration
        do {
            configuration = try BackendConfiguration(
                url: backend,
                connect: self.connect || fromFile?.connect == true,
                disconnect: self.disconnect || fromFile?.disconnect == true,
                channels: self.channels.isEmpty ? fromFile?.channels ?? [] : self.channels,
                requests: self.requests.isEmpty ? fromFile?.requests ?? [] : self.requests,
                messages: self.messages.isEmpty ? fromFile?.messages ?? [] : self.messages,
                messageBatch: self.messageBatch ?? fromFile?.messageBatch ?? 1,
                caFile: self.caFile ?? fromFile?.caFile,
                timeout: try duration(seconds: self.timeoutSeconds ?? fromFile?.timeoutSeconds ?? 5, option: "backend-timeout"),
                maxConcurrentCalls: self.maxCalls ?? fromFile?.maxCalls ?? 256,
                authorization: ProcessInfo.processInfo.environment["TETHER_BACKEND_AUTHORIZATION"] ?? fromFile?.authorization
            )
        } catch let error as GatewayError {
            throw ValidationError("--backend: \(error.message)")
        }
        logger.info(
            "the backend answers",
            metadata: [
                "url": "\(configuration.url)", "connect": "\(configuration.connect)", "requests": "\(configuration.requests)",
                "messages": "\(configuration.messages)", "message_batch": "\(configuration.messageBatch)",
            ]
        )
        return try BackendProxy(configuration: configuration, logger: Logger(label: "tether.backend"))
    }

    /// The server API's configuration, if `--api-port` is given (or the configuration file's
    /// `api.port`); its keys are read once, here.
    func api(file: ServeFile?) throws -> ServerAPIConfiguration? {
        guard let apiPort = self.apiPort ?? file?.api?.port else {
            if self.apiKeyFile != nil { throw ValidationError("--api-key-file needs --api-port") }
            if self.apiGRPCPort != nil { throw ValidationError("--api-grpc-port needs --api-port") }
            if file?.api != nil { throw ValidationError("--config: api needs a port") }
            return nil
        }
        var keys: [String] = file?.api?.keys ?? []
        if let environment = ProcessInfo.processInfo.environment["TETHER_API_KEYS"] {
            keys += environment.split(separator: ",").map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        if let apiKeyFile {
            guard let text = try? String(contentsOfFile: apiKeyFile, encoding: .utf8) else {
                throw ValidationError("--api-key-file: cannot read \(apiKeyFile)")
            }
            keys += text.split(whereSeparator: \.isNewline).map { $0.trimmingCharacters(in: .whitespaces) }.filter { !$0.isEmpty }
        }
        guard !keys.isEmpty else {
            throw ValidationError(
                "--api-port needs API keys: set TETHER_API_KEYS (comma-separated), --api-key-file, or api.keys in --config"
            )
        }
        let idleTimeout =
            try file?.api?.idleTimeoutSeconds.map { try duration(seconds: $0, option: "api.idle_timeout_seconds") }
            ?? .seconds(60)
        do {
            return try ServerAPIConfiguration(
                host: self.apiHost ?? file?.api?.host ?? "127.0.0.1",
                port: apiPort,
                grpcPort: self.apiGRPCPort ?? file?.api?.grpcPort,
                keys: keys,
                maxBodyBytes: file?.api?.maxBodyBytes ?? 4 << 20,
                maxConnections: file?.api?.maxConnections ?? 1_024,
                idleTimeout: idleTimeout
            )
        } catch {
            throw ValidationError("--api-port: \(error.message)")
        }
    }

    /// `api` for node `index` of this process (`--nodes`): its port + `index` (0 stays 0).
    static func api(_ api: ServerAPIConfiguration, node index: Int) throws -> ServerAPIConfiguration {
        var node = api
        if api.port != 0 { node.port += index }
        if let grpcPort = api.grpcPort, grpcPort != 0 { node.grpcPort = grpcPort + index }
        for port in [node.port, node.grpcPort ?? 0] where port > 65_535 {
            throw ValidationError("--api-port: the server API's port must be 0 to 65535, got \(port)")
        }
        return node
    }
}
