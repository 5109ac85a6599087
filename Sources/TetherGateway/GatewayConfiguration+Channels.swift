public import TetherCore

extension GatewayConfiguration {
    /// Channels (PROTOCOL.md, section 12): what a channel keeps of its history, and the limits
    /// of subscriptions. Offered to clients as the `channels` feature.
    ///
    /// ```swift
    /// var configuration = GatewayConfiguration.defaults
    /// configuration.channels = try .init(rules: [
    ///     .init(pattern: ChannelPattern("room.*"), history: ChannelRetention(maxCount: 1_000, maxAge: .seconds(600))),
    ///     .init(pattern: .all, history: nil),  // other channels: live publications only
    /// ])
    /// ```
    public struct Channels: Sendable, Hashable {
        /// What a channel keeps, by the first rule whose pattern matches its name. A channel that
        /// no rule matches has no history: its subscribers get what is published while they
        /// are subscribed, and a resubscription is told that nothing could be recovered.
        public var rules: [Rule]
        /// The channels one connection may be subscribed to at once; past it a SUBSCRIBE is
        /// refused with `resource exhausted`.
        public var maxSubscriptionsPerConnection: Int
        /// The channels the gateway keeps at once (each with its subscribers and its history);
        /// past it a subscription to a new channel is refused with `resource exhausted`, and a
        /// publication to a new channel with no subscriber is not kept.
        public var maxChannels: Int
        /// The body bytes the in-memory histories of every channel keep together. Past it, the
        /// channel being published to drops its oldest publications (its subscribers coming
        /// back get a gap). Apart from ``Limits-swift.struct/memoryBudget``, which bounds what
        /// connections hold.
        public var maxHistoryBytes: Int
        /// The publications a recovery sends at once (and the members a subscription's presence
        /// sends at once); the next ones follow as the connection drains, so that a long
        /// recovery is never in memory all at once.
        public var recoveryPageSize: Int

        /// - Throws: ``ConfigurationError`` for a limit below 1.
        public init(
            rules: [Rule],
            maxSubscriptionsPerConnection: Int = 128,
            maxChannels: Int = 100_000,
            maxHistoryBytes: Int = 64 << 20,
            recoveryPageSize: Int = 256
        ) throws(ConfigurationError) {
            for (name, value) in [
                ("maxSubscriptionsPerConnection", maxSubscriptionsPerConnection), ("maxChannels", maxChannels),
                ("maxHistoryBytes", maxHistoryBytes), ("recoveryPageSize", recoveryPageSize),
            ] where value < 1 {
                throw ConfigurationError("channels.\(name) must be at least 1, got \(value)")
            }
            self.rules = rules
            self.maxSubscriptionsPerConnection = maxSubscriptionsPerConnection
            self.maxChannels = maxChannels
            self.maxHistoryBytes = maxHistoryBytes
            self.recoveryPageSize = recoveryPageSize
        }

        /// Every channel keeps its last 1,000 publications for 5 minutes; 64 MiB of history
        /// in all.
        public static var defaults: Channels {
            try! Channels(rules: [Rule(pattern: .all, history: try! ChannelRetention(maxCount: 1_000, maxAge: .seconds(300)))])
        }

        /// What the channels whose names match ``pattern`` keep.
        public struct Rule: Sendable, Hashable {
            /// The channels it applies to.
            public var pattern: ChannelPattern
            /// Their history; `nil`: none (live publications only).
            public var history: ChannelRetention?
            /// Where their history is kept.
            public var storage: Storage
            /// Whether they keep presence: a client that may (``Access/presence(channel:)``)
            /// asks who is subscribed (`client.presence(of:)`), each member with its
            /// ``ClientIdentity/info``, and a subscriber may follow who joins and leaves
            /// (`client.subscribe(_:presence:)`). In a cluster that shares presence
            /// (``GatewayCluster/sharesChannelPresence``) a client on any node is in.
            public var presence: Bool
            /// Whether clients may publish to them (`client.publish`), as far as their
            /// credentials and the ``Gateway/authorize(_:)`` hook allow
            /// (``Access/publish(channel:)``); otherwise only the gateway and its handlers do.
            public var clientsMayPublish: Bool

            public init(
                pattern: ChannelPattern,
                history: ChannelRetention?,
                storage: Storage = .memory,
                presence: Bool = false,
                clientsMayPublish: Bool = false
            ) {
                self.pattern = pattern
                self.history = history
                self.storage = storage
                self.presence = presence
                self.clientsMayPublish = clientsMayPublish
            }
        }

        /// Where a channel's history is kept.
        public enum Storage: Sendable, Hashable {
            /// In the gateway's memory: fast, bounded by
            /// ``GatewayConfiguration/Channels-swift.struct/maxHistoryBytes``, lost when the
            /// gateway stops. For channels that want a short window.
            case memory
            /// In the gateway's store (a ``ChannelHistoryStore``, as ``SQLiteMessageStore``):
            /// each publication is appended before it is sent, and a subscriber that comes back
            /// after the gateway restarted still recovers it. The gateway must be given such a
            /// store.
            case store
        }

        /// Whether some rule keeps its channels' history in the store.
        var usesStore: Bool { self.rules.contains { $0.history != nil && $0.storage == .store } }

        /// The longest a rule keeping history in the store keeps a publication: what the
        /// store's trimming keeps.
        var longestStoredAge: Duration? {
            self.rules.filter { $0.storage == .store }.compactMap(\.history?.maxAge).max()
        }

        /// The rule for `channel`: its first matching one.
        func rule(for channel: String) -> Rule? {
            self.rules.first { $0.pattern.matches(channel) }
        }

        /// Whether clients may publish to `channel`: its first matching rule's.
        func clientsMayPublish(to channel: String) -> Bool {
            self.rule(for: channel)?.clientsMayPublish ?? false
        }

        /// The history a channel keeps in memory: its first matching rule's.
        func history(of channel: String) -> ChannelRetention? {
            guard let rule = self.rule(for: channel), rule.storage == .memory else { return nil }
            return rule.history
        }

        /// The history a channel keeps in the store: its first matching rule's.
        func storedHistory(of channel: String) -> ChannelRetention? {
            guard let rule = self.rule(for: channel), rule.storage == .store else { return nil }
            return rule.history
        }
    }
}
