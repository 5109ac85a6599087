import ArgumentParser
import Foundation
import NIOCore
import Tether

struct History: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print a page of a channel's history, oldest first.",
        discussion: """
            Examples:
              tether history chat.lobby                  the latest 20
              tether history chat.lobby --after 1f3a:40  what followed offset 40 of epoch 1f3a (hex)
            """
    )

    @Argument(help: "The channel, e.g. chat.lobby (tether chat's room lobby).")
    var channel: String

    @Option(help: "EPOCH:OFFSET (the epoch in hex, as printed): the publications after this position.")
    var after: String?

    @Option(help: "The most publications to print (1 to 1000).")
    var limit = 20

    @OptionGroup var gateway: GatewayOptions

    @Option(name: .customLong("timeout"), help: "Seconds to wait for the answer, including connecting.")
    var timeoutSeconds: Double = 5

    @Option(help: "The client id to present.")
    var clientID = "tether-history"

    @OptionGroup var logging: LoggingOptions

    /// `--after`'s position.
    private var position: ChannelPosition? {
        get throws {
            guard let after else { return nil }
            let parts = after.split(separator: ":")
            guard parts.count == 2, let epoch = UInt64(parts[0], radix: 16), let offset = UInt64(parts[1]) else {
                throw ValidationError("--after must be EPOCH:OFFSET with the epoch in hex, e.g. 1f3a:40; got \(after)")
            }
            return ChannelPosition(epoch: epoch, offset: offset)
        }
    }

    func run() async throws {
        try self.logging.bootstrap(default: .critical)
        let timeout = try duration(seconds: self.timeoutSeconds, option: "timeout")
        let position = try self.position
        var configuration = try self.gateway.configuration(clientID: self.clientID)
        configuration.reconnect.backoff.maxAttempts = 2
        let client = try TetherClient(configuration: configuration, transport: try self.gateway.transport())
        let (channel, limit) = (self.channel, self.limit)
        let result = await runOnce(client) { client throws(TetherError) in
            try await client.history(of: channel, after: position, limit: limit, timeout: timeout)
        }
        switch result {
        case .success(let page):
            print("# \(page.channel): epoch \(String(page.epoch, radix: 16)), last offset \(page.top)")
            if let gap = page.gap { print("# gap: \(gap)") }
            for publication in page.publications {
                let publisher = publication.publisher.isEmpty ? "-" : publication.publisher
                print(
                    "\(publication.position.offset)\t\(publisher)\t\(String(decoding: publication.body.readableBytesView, as: UTF8.self))"
                )
            }
            if page.more, let last = page.publications.last {
                print("# more: tether history \(page.channel) --after \(String(page.epoch, radix: 16)):\(last.position.offset)")
            }
        case .failure(let error):
            printError("error: \(error)")
            throw ExitCode.failure
        }
    }
}
