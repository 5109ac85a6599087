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

    @Option(name: .customLong("api-host"), help: "With --api-port: the API's address (loopback by default: keep it private).")
    var apiHost = "127.0.0.1"

    @Option(name: .customLong("api-key-file"), help: "With --api-port: a file of API keys, one per line (16 to 512 bytes each).")
    var apiKeyFile: String?

    @Option(
        help: """
            The backend's base URL (http://host:port): the events below are POSTed to URL/tether/connect, \
            URL/tether/request/METHOD and URL/tether/message/TOPIC.
            """
    )
    var backend: String?

    @Flag(name: .customLong("backend-connect"), help: "With --backend: every client's credentials are checked by the backend.")
    var connect = false

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

    @Option(name: .customLong("backend-timeout"), help: "With --backend: how long a connect or message call may take, in seconds.")
    var timeoutSeconds = 5.0

    @Option(name: .customLong("backend-max-calls"), help: "With --backend: the most calls to the backend under way at once.")
    var maxCalls = 256

    /// Whether anything of a backend is configured (the demo handlers are installed otherwise).
    var configured: Bool { self.apiPort != nil || self.backend != nil }

    /// The event proxy, if `--backend` is given.
    /// - Parameter authorization: Sent with every call (`TETHER_BACKEND_AUTHORIZATION`).
    func proxy(logger: Logger) throws -> HTTPBackend? {
        guard let backend else {
            if self.connect || !self.requests.isEmpty || !self.messages.isEmpty {
                throw ValidationError("--backend-connect, --backend-request and --backend-message need --backend URL")
            }
            return nil
        }
        let configuration: BackendConfiguration
        do {
            configuration = try BackendConfiguration(
                url: backend,
                connect: self.connect,
                requests: self.requests,
                messages: self.messages,
                timeout: try duration(seconds: self.timeoutSeconds, option: "backend-timeout"),
                maxConcurrentCalls: self.maxCalls,
                authorization: ProcessInfo.processInfo.environment["TETHER_BACKEND_AUTHORIZATION"]
            )
        } catch let error as GatewayError {
            throw ValidationError("--backend: \(error.message)")
        }
        logger.info(
            "the backend answers",
            metadata: [
                "url": "\(configuration.url)", "connect": "\(configuration.connect)", "requests": "\(configuration.requests)",
                "messages": "\(configuration.messages)",
            ]
        )
        return HTTPBackend(configuration: configuration, logger: Logger(label: "tether.backend"))
    }

    /// The server API's configuration for node `index` (port + index), if `--api-port` is given.
    func api(node index: Int = 0) throws -> ServerAPIConfiguration? {
        guard let apiPort else {
            if self.apiKeyFile != nil { throw ValidationError("--api-key-file needs --api-port") }
            return nil
        }
        var keys: [String] = []
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
            throw ValidationError("--api-port needs API keys: set TETHER_API_KEYS (comma-separated) or --api-key-file")
        }
        do {
            return try ServerAPIConfiguration(host: self.apiHost, port: apiPort == 0 ? 0 : apiPort + index, keys: keys)
        } catch {
            throw ValidationError("--api-port: \(error.message)")
        }
    }
}
