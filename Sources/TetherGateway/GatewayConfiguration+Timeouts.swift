extension GatewayConfiguration {
    /// Handshake, handler, heartbeat, idle and shutdown timing.
    public struct Timeouts: Sendable, Hashable {
        /// A client must complete the handshake (HELLO, authentication, WELCOME) within this.
        public var handshake: Duration
        /// The longest a handler may run, whatever timeout the client asked for.
        public var handler: Duration
        /// The heartbeat interval announced to clients in WELCOME.
        public var heartbeatInterval: Duration
        /// A connection silent for this long is closed; must exceed the heartbeat interval.
        public var idle: Duration
        /// After GOAWAY, the longest the gateway waits for requests in flight before closing.
        public var shutdownGracePeriod: Duration
        /// With reliable delivery: how long the gateway keeps the deduplication state of a
        /// client's outbox (one device's numbering) after it was last connected. An outbox
        /// away for longer is forgotten (PROTOCOL.md, section 9.1): choose a retention far
        /// above the time a device may stay offline with messages not yet acknowledged. Whole
        /// seconds, at least one.
        public var outboxRetention: Duration
        /// How long a closing frame (an idle connection's GOAWAY, an ERROR) may take to reach a
        /// client before the connection is closed anyway: a client that stops reading cannot
        /// hold its connection open.
        public var closeTimeout: Duration
        /// How long a connection stays open after its client's credentials expired
        /// (``ClientIdentity/expiresAt``) before the gateway ends it with GOAWAY
        /// `credentials expired`.
        public var credentialGrace: Duration
        /// The longest a body may take to arrive once its first byte did: a frame (or a
        /// WebSocket message) read in part, a POST's body. Past it, the connection is refused
        /// (ERROR `resource exhausted`; `408` for a POST) and closed: a peer that trickles its
        /// bytes cannot hold them for longer. Time paused by a full memory budget counts too.
        public var body: Duration

        public init(
            handshake: Duration = .seconds(10),
            handler: Duration = .seconds(30),
            heartbeatInterval: Duration = .seconds(10),
            idle: Duration = .seconds(30),
            shutdownGracePeriod: Duration = .seconds(10),
            outboxRetention: Duration = .seconds(90 * 24 * 3600),
            credentialGrace: Duration = .seconds(30),
            closeTimeout: Duration = .seconds(2),
            body: Duration = .seconds(30)
        ) {
            self.handshake = handshake
            self.handler = handler
            self.heartbeatInterval = heartbeatInterval
            self.idle = idle
            self.shutdownGracePeriod = shutdownGracePeriod
            self.outboxRetention = outboxRetention
            self.credentialGrace = credentialGrace
            self.closeTimeout = closeTimeout
            self.body = body
        }

        public static var defaults: Timeouts { Timeouts() }

        public func validate() throws(ConfigurationError) {
            for (name, value) in [("handshake", self.handshake), ("handler", self.handler), ("heartbeatInterval", self.heartbeatInterval)]
            where value <= .zero {
                throw ConfigurationError("timeouts.\(name) must be positive")
            }
            guard self.idle > self.heartbeatInterval else {
                throw ConfigurationError("timeouts.idle must exceed timeouts.heartbeatInterval (clients ping once per interval)")
            }
            guard self.shutdownGracePeriod >= .zero else { throw ConfigurationError("timeouts.shutdownGracePeriod must not be negative") }
            guard self.closeTimeout > .zero else { throw ConfigurationError("timeouts.closeTimeout must be positive") }
            guard self.body > .zero else { throw ConfigurationError("timeouts.body must be positive") }
            guard self.credentialGrace >= .zero else { throw ConfigurationError("timeouts.credentialGrace must not be negative") }
            guard self.outboxRetention >= .seconds(1) else {
                throw ConfigurationError("timeouts.outboxRetention must be at least 1 second")
            }
            let limit = Duration.milliseconds(Int64(UInt32.max))
            guard self.heartbeatInterval <= limit, self.idle <= limit else {
                throw ConfigurationError("timeouts must fit in 32-bit milliseconds (about 49 days)")
            }
        }
    }
}
