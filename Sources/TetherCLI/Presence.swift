import ArgumentParser
import Foundation
import Tether

struct Presence: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print who is subscribed to a channel that keeps presence, by client id.",
        discussion: """
            Examples:
              tether presence chat.lobby                 who is in tether chat's room lobby
              tether presence chat.lobby --after bob     the members after bob
            """
    )

    @Argument(help: "The channel, e.g. chat.lobby (tether chat's room lobby).")
    var channel: String

    @Option(help: "A client id: the members after it.")
    var after = ""

    @Option(help: "The most members to print (1 to 1000).")
    var limit = 100

    @OptionGroup var gateway: GatewayOptions

    @Option(name: .customLong("timeout"), help: "Seconds to wait for the answer, including connecting.")
    var timeoutSeconds: Double = 5

    @Option(help: "The client id to present.")
    var clientID = "tether-presence"

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try self.logging.bootstrap(default: .critical)
        let timeout = try duration(seconds: self.timeoutSeconds, option: "timeout")
        var configuration = try self.gateway.configuration(clientID: self.clientID)
        configuration.reconnect.backoff.maxAttempts = 2
        let client = try TetherClient(configuration: configuration, transport: try self.gateway.transport())
        let (channel, after, limit) = (self.channel, self.after, self.limit)
        let result = await runOnce(client) { client throws(TetherError) in
            try await client.presence(of: channel, after: after, limit: limit, timeout: timeout)
        }
        switch result {
        case .success(let page):
            print("# \(page.channel): \(page.total) online")
            for member in page.members {
                print("\(member.clientID)\t\(member.connections)\t\(member.info)")
            }
            if let last = page.members.last, page.members.count < page.total, page.members.count == limit {
                print("# more: tether presence \(page.channel) --after \(last.clientID)")
            }
        case .failure(let error):
            printError("error: \(error)")
            throw ExitCode.failure
        }
    }
}
