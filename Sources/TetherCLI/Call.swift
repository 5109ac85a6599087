import ArgumentParser
import Foundation
import Logging
import NIOCore
import Tether

struct Call: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send one request and print the response body.",
        discussion: """
            Examples:
              tether call echo hello
              tether call wss://127.0.0.1:7443/tether echo hello --ca cert.pem
            """
    )

    @Argument(
        help: ArgumentHelp(
            "[gateway URL] method [body]: the gateway (tether://, tethers://, ws://, wss://, http:// or https://; --host and --port otherwise), the method to call (e.g. echo), the request body (UTF-8 text).",
            valueName: "words"
        )
    )
    var words: [String]

    /// The gateway URL, method and body the positional words name.
    private var parsed: (endpoint: String?, method: String, body: String) {
        get throws {
            var words = self.words[...]
            let endpoint = words.first?.contains("://") == true ? words.popFirst() : nil
            guard let method = words.popFirst() else { throw ValidationError("name the method to call, e.g. tether call echo hello") }
            let body = words.popFirst() ?? ""
            guard words.isEmpty else { throw ValidationError("too many arguments: quote a body that has spaces") }
            return (endpoint, method, body)
        }
    }

    @OptionGroup var gateway: GatewayOptions

    @Option(name: .customLong("timeout"), help: "Seconds to wait for the response, including connecting.")
    var timeoutSeconds: Double = 5

    @Option(help: "The client id to present.")
    var clientID = "tether-call"

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try self.logging.bootstrap(default: .critical)
        let timeout = try duration(seconds: self.timeoutSeconds, option: "timeout")
        let (endpoint, method, body) = try self.parsed
        var configuration = try self.gateway.configuration(clientID: self.clientID, first: endpoint)
        // A one-shot call should report an unreachable gateway rather than retry until the deadline.
        configuration.reconnect.backoff.maxAttempts = 2
        let client = try TetherClient(configuration: configuration, transport: try self.gateway.transport())

        let result = await runOnce(client) { client throws(TetherError) in
            try await client.request(method, body: ByteBuffer(string: body), timeout: timeout)
        }
        switch result {
        case .success(let reply):
            print(String(buffer: reply))
        case .failure(let error):
            printError("error: \(error)")
            throw ExitCode.failure
        }
    }
}

/// Runs `client` for one operation: its result, once `operation` ended and the client shut down.
func runOnce<Value: Sendable>(
    _ client: TetherClient,
    _ operation: @escaping @Sendable (TetherClient) async throws(TetherError) -> Value
) async -> Result<Value, TetherError> {
    await withTaskGroup(of: Result<Value, TetherError>?.self) { group in
        group.addTask {
            try? await client.run()
            return nil
        }
        group.addTask {
            defer { client.shutdown() }
            do throws(TetherError) {
                return .success(try await operation(client))
            } catch {
                return .failure(error)
            }
        }
        var outcome: Result<Value, TetherError>?
        for await result in group where result != nil { outcome = result }
        return outcome!
    }
}

func printError(_ message: String) {
    FileHandle.standardError.write(Data((message + "\n").utf8))
}
