import ArgumentParser
import Foundation
import Logging
import NIOCore
import Tether

struct Call: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Send one request and print the response body.",
        discussion: "Example: tether call echo hello"
    )

    @Argument(help: "The method to call, e.g. echo or time.now.")
    var method: String

    @Argument(help: "The request body (UTF-8 text).")
    var body = ""

    @OptionGroup var gateway: GatewayOptions

    @Option(name: .customLong("timeout"), help: "Seconds to wait for the response, including connecting.")
    var timeoutSeconds: Double = 5

    @Option(help: "The client id to present.")
    var clientID = "tether-call"

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try self.logging.bootstrap(default: .critical)
        let timeout = try duration(seconds: self.timeoutSeconds, option: "timeout")
        var configuration = self.gateway.configuration(clientID: self.clientID)
        // A one-shot call should report an unreachable gateway rather than retry until the deadline.
        configuration.reconnect.backoff.maxAttempts = 2
        let client = try TetherClient(configuration: configuration)

        let result = await withTaskGroup(of: Result<ByteBuffer, TetherError>?.self) { group in
            group.addTask {
                try? await client.run()
                return nil
            }
            group.addTask {
                defer { client.shutdown() }
                do throws(TetherError) {
                    return .success(try await client.request(self.method, body: ByteBuffer(string: self.body), timeout: timeout))
                } catch {
                    return .failure(error)
                }
            }
            var outcome: Result<ByteBuffer, TetherError>?
            for await result in group where result != nil { outcome = result }
            return outcome!
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

func printError(_ message: String) {
    FileHandle.standardError.write(Data((message + "\n").utf8))
}
