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

    @Flag(
        name: .customLong("channel-presence"),
        inversion: .prefixedNo,
        help: "Keep channels' presence: clients see who is subscribed (client.presence, tether presence)."
    )
    var presence = true

    /// Where channels keep their history.
    enum Storage: String, ExpressibleByArgument, CaseIterable {
        case memory, store
    }

    @Option(
        name: .customLong("channel-storage"),
        help: """
            Where channels keep their history: store (the --store file or --postgres: it survives a restart, and \
            every node of a cluster shares it; the default) or memory (the default with --store :memory:).
            """
    )
    var storage: Storage?

    /// - Parameter storeKeepsChannels: Whether the gateway's store keeps channels' history
    ///   (a SQLite file).
    func apply(to configuration: inout GatewayConfiguration, storeKeepsChannels: Bool) throws {
        guard self.historyCount >= 0 else { throw ValidationError("--channel-history must be 0 or more, got \(self.historyCount)") }
        let age = try duration(seconds: self.historySeconds, option: "channel-history-age")
        let retention = self.historyCount == 0 ? nil : try ChannelRetention(maxCount: self.historyCount, maxAge: age)
        var channels = configuration.channels ?? .defaults
        let storage = self.storage ?? (storeKeepsChannels ? .store : .memory)
        if storage == .store, !storeKeepsChannels {
            throw ValidationError(
                "--channel-storage store needs a --store file or --postgres: the in-memory store does not keep channels' history"
            )
        }
        channels.rules = [
            .init(
                pattern: .all,
                history: retention,
                storage: storage == .store ? .store : .memory,
                presence: self.presence,
                clientsMayPublish: self.clientsPublish
            )
        ]
        configuration.channels = channels
    }
}
