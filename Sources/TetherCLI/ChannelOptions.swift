import ArgumentParser
import TetherGateway

/// `tether serve`'s options for channels: how much history every channel keeps.
struct ChannelOptions: ParsableArguments {
    @Option(
        name: .customLong("channel-history"),
        help: "The publications each channel keeps for subscribers that come back (0: none, live publications only)."
    )
    var historyCount = 1_000

    @Option(name: .customLong("channel-history-age"), help: "How long a channel keeps a publication, in seconds.")
    var historySeconds = 300.0

    @Flag(name: .customLong("channel-clients-publish"), help: "Let clients publish to channels (client.publish), as themselves.")
    var clientsPublish = false

    func apply(to configuration: inout GatewayConfiguration) throws {
        guard self.historyCount >= 0 else { throw ValidationError("--channel-history must be 0 or more, got \(self.historyCount)") }
        let age = try duration(seconds: self.historySeconds, option: "channel-history-age")
        let retention = self.historyCount == 0 ? nil : try ChannelRetention(maxCount: self.historyCount, maxAge: age)
        var channels = configuration.channels ?? .defaults
        channels.rules = [.init(pattern: .all, history: retention, clientsMayPublish: self.clientsPublish)]
        configuration.channels = channels
    }
}
