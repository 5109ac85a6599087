public import NIOCore
public import TetherCore

/// Everything a ``TetherClient`` needs to know, as nested value types with defaults.
///
/// ```swift
/// var configuration = ClientConfiguration(
///     endpoints: [Endpoint(host: "gw1.example.com", port: 7700), Endpoint(host: "gw2.example.com", port: 7700)],
///     clientID: "user-42"
/// )
/// configuration.requests.defaultTimeout = .seconds(5)
/// configuration.heartbeat.timeout = .seconds(3)
/// ```
public struct ClientConfiguration: Sendable {
    /// The gateways to connect to, tried in turn on failure; at least one.
    public var endpoints: [Endpoint]
    /// The client's stable identity (user or device id), sent in HELLO.
    public var clientID: String
    /// The credential sent in HELLO.
    public var authentication: Authentication
    /// Describes the client software in the gateway's logs.
    public var userAgent: String
    /// Request defaults.
    public var requests: Requests
    /// Connection establishment and limits.
    public var connection: Connection
    /// Liveness checking.
    public var heartbeat: Heartbeat
    /// Reports network changes: reconnect at once when a network comes back or changes, wait
    /// while there is none. `nil`: no monitor; the heartbeat and backoff do all the work.
    public var pathMonitor: (any NetworkPathMonitor)?
    /// Reconnection after failures.
    public var reconnect: Reconnect
    /// Push delivery to subscribers.
    public var pushes: Pushes
    /// Reliable messaging; `nil` (the default) does not offer it to the gateway.
    public var reliability: Reliability?
    /// Channel subscriptions: where they keep their positions across launches of the app.
    public var channels: Channels
    /// When ``ConnectionEvent/alert(_:)`` is raised.
    public var alerts: Alerts

    /// Creates a configuration with defaults for everything but the endpoints and identity.
    public init(endpoints: [Endpoint], clientID: String) {
        self.endpoints = endpoints
        self.clientID = clientID
        self.authentication = .none
        self.userAgent = "tether-swift/0.1"
        self.requests = .defaults
        self.connection = .defaults
        self.heartbeat = .defaults
        self.reconnect = .defaults
        self.pushes = .defaults
        self.channels = .defaults
        self.alerts = .defaults
    }

    /// Creates a configuration from endpoints written as `host:port` or `tether://host:port`.
    ///
    /// ```swift
    /// let configuration = try ClientConfiguration(endpoints: ["gw1.example.com:7700", "tether://gw2.example.com:7700"], clientID: "alice")
    /// ```
    /// - Throws: ``ConfigurationError`` naming the endpoint that does not parse.
    @_disfavoredOverload  // an empty array literal means `[Endpoint]`
    public init(endpoints: [String], clientID: String) throws(ConfigurationError) {
        var parsed: [Endpoint] = []
        for text in endpoints {
            do {
                parsed.append(try Endpoint(parsing: text))
            } catch {
                throw ConfigurationError("\(error)")
            }
        }
        self.init(endpoints: parsed, clientID: clientID)
    }

    /// Checks every value.
    /// - Throws: ``ConfigurationError`` naming the first invalid value.
    public func validate() throws(ConfigurationError) {
        guard !self.endpoints.isEmpty else { throw ConfigurationError("endpoints must not be empty") }
        for endpoint in self.endpoints where !endpoint.isValid {
            throw ConfigurationError("endpoint \(endpoint) needs a host and a port from 1 to 65535")
        }
        guard self.clientID.utf8.count <= Int(UInt16.max) else { throw ConfigurationError("clientID is longer than 65535 bytes") }
        try self.requests.validate()
        try self.connection.validate()
        try self.heartbeat.validate()
        try self.reconnect.validate()
        try self.pushes.validate()
        try self.reliability?.validate()
        try self.channels.validate()
        try self.alerts.validate()
    }

    /// How the client proves its identity in HELLO.
    public enum Authentication: Sendable {
        /// No credential.
        case none
        /// A fixed token.
        case token(ByteBuffer)
        /// A token fetched before each connection attempt, so it can be refreshed.
        case provider(@Sendable () async throws -> ByteBuffer)
        /// Tokens that expire (JWTs): one is fetched before each connection attempt and, while
        /// connected, a fresh one when 80 % of the current one's validity has passed, which is
        /// sent to the gateway on the open connection: the connection is not interrupted
        /// (PROTOCOL.md, section 5.1). Times are measured on the client's clock.
        ///
        /// ```swift
        /// configuration.authentication = .expiring {
        ///     let jwt = try await authService.freshToken()
        ///     return Credential(token: jwt.string, validFor: .seconds(jwt.expiresIn))
        /// }
        /// ```
        case expiring(@Sendable () async throws -> Credential)
    }

    /// A token and how long it stays valid.
    public struct Credential: Sendable {
        /// What the client sends (HELLO's auth token, or the body of a refresh).
        public var token: ByteBuffer
        /// How long after it was fetched the token stops being valid.
        public var validFor: Duration

        public init(token: ByteBuffer, validFor: Duration) {
            self.token = token
            self.validFor = validFor
        }

        public init(token: String, validFor: Duration) {
            self.init(token: ByteBuffer(string: token), validFor: validFor)
        }
    }

    /// Request defaults.
    public struct Requests: Sendable, Hashable {
        /// The timeout of a request that does not pass one: from the call until the response,
        /// including any wait for a connection.
        public var defaultTimeout: Duration

        public init(defaultTimeout: Duration = .seconds(10)) throws(ConfigurationError) {
            self.defaultTimeout = defaultTimeout
            try self.validate()
        }

        public static var defaults: Requests { try! Requests() }

        public func validate() throws(ConfigurationError) {
            guard self.defaultTimeout > .zero else { throw ConfigurationError("requests.defaultTimeout must be positive") }
        }
    }

    /// Connection establishment and limits.
    public struct Connection: Sendable, Hashable {
        /// The longest a transport connection may take to open.
        public var connectTimeout: Duration
        /// The longest the gateway may take to answer HELLO.
        public var handshakeTimeout: Duration
        /// The largest frame body the client accepts.
        public var maxBodySize: Int
        /// Whether to offer CRC-32C checksums on every frame.
        public var checksums: Bool
        /// Payload compression offered to the gateway (``Features/compression``): what the
        /// client sends is compressed by these settings once the gateway accepted it; `nil`
        /// does not offer it.
        public var compression: Compression?
        /// Connection racing ("happy eyeballs"): while an attempt has no answer yet, another
        /// connection starts this long after the previous one (to the next endpoint, or to the
        /// same one again, which beats the kernel's 1 s, 2 s, 4 s … SYN retransmissions on a lossy
        /// link); the first to complete the handshake is kept and the others are closed.
        /// `nil` opens one connection at a time.
        public var raceDelay: Duration?
        /// The most connections one attempt has open at once.
        public var maximumRacers: Int
        /// An endpoint that refused a connection or failed its handshake is tried after the others
        /// for this long.
        public var failedEndpointPenalty: Duration
        /// When a connection that is up counts as failing, as a refused one does: it is closed
        /// (``DisconnectReason/linkFailing(timedOut:of:)``), its endpoint penalised, and the
        /// others tried first. `nil`: a connection is given up only when it closes or its
        /// heartbeat times out. With a single endpoint it does nothing: there is nowhere else
        /// to go.
        public var failingLink: FailingLink?
        /// Moving back up: while connected to an endpoint that is not the first of
        /// ``ClientConfiguration/endpoints`` (a fallback, such as the HTTP stream when TCP is
        /// blocked), the client probes the endpoints before it this often, as engine.io's upgrade
        /// does. The probe opens a transport connection (TCP, TLS, the WebSocket upgrade, the
        /// HTTP stream's first line) and closes it; when one answers, the client drains the
        /// current connection (``DisconnectReason/movingUp(to:)``) and connects there. Reliable
        /// messages resume on the new connection, none lost or doubled. `nil` stays on the
        /// fallback until it closes.
        public var moveUpInterval: Duration?

        /// A connection is failing once at least ``failureRate`` of at least
        /// ``minimumRequests`` requests sent on it within ``window`` went unanswered before
        /// their deadline (seed 004: 10 % of 40). Any answer counts as carried, whatever its
        /// status; a request still queued at its deadline counts for nothing.
        public struct FailingLink: Sendable, Hashable {
            public var failureRate: Double
            public var minimumRequests: Int
            public var window: Duration

            public init(failureRate: Double = 0.1, minimumRequests: Int = 40, window: Duration = .seconds(60)) throws(ConfigurationError) {
                self.failureRate = failureRate
                self.minimumRequests = minimumRequests
                self.window = window
                try self.validate()
            }

            public static var defaults: FailingLink { try! FailingLink() }

            public func validate() throws(ConfigurationError) {
                _ = try self.policy
            }

            var policy: LinkHealth.Policy {
                get throws(ConfigurationError) {
                    do {
                        return try LinkHealth.Policy(
                            failureRate: self.failureRate,
                            minimumRequests: self.minimumRequests,
                            window: self.window
                        )
                    } catch {
                        throw ConfigurationError("connection.failingLink: \(error.message)")
                    }
                }
            }
        }

        public init(
            connectTimeout: Duration = .seconds(5),
            handshakeTimeout: Duration = .seconds(5),
            maxBodySize: Int = 1 << 20,
            checksums: Bool = true,
            compression: Compression? = .defaults,
            raceDelay: Duration? = .milliseconds(250),
            maximumRacers: Int = 3,
            failedEndpointPenalty: Duration = .seconds(30),
            failingLink: FailingLink? = .defaults,
            moveUpInterval: Duration? = .seconds(10)
        ) throws(ConfigurationError) {
            self.connectTimeout = connectTimeout
            self.handshakeTimeout = handshakeTimeout
            self.maxBodySize = maxBodySize
            self.checksums = checksums
            self.compression = compression
            self.raceDelay = raceDelay
            self.maximumRacers = maximumRacers
            self.failedEndpointPenalty = failedEndpointPenalty
            self.failingLink = failingLink
            self.moveUpInterval = moveUpInterval
            try self.validate()
        }

        public static var defaults: Connection { try! Connection() }

        public func validate() throws(ConfigurationError) {
            guard self.connectTimeout > .zero else { throw ConfigurationError("connection.connectTimeout must be positive") }
            guard self.handshakeTimeout > .zero else { throw ConfigurationError("connection.handshakeTimeout must be positive") }
            if let raceDelay = self.raceDelay, raceDelay <= .zero {
                throw ConfigurationError("connection.raceDelay must be positive (or nil to open one connection at a time)")
            }
            guard self.maximumRacers >= 1 else { throw ConfigurationError("connection.maximumRacers must be at least 1") }
            if let moveUpInterval = self.moveUpInterval, moveUpInterval <= .zero {
                throw ConfigurationError("connection.moveUpInterval must be positive (or nil not to move up)")
            }
            guard self.failedEndpointPenalty >= .zero else {
                throw ConfigurationError("connection.failedEndpointPenalty must not be negative")
            }
            try self.failingLink?.validate()
            try self.compression?.validate()
            guard (Handshake.minimumBodyLimit...FrameHeader.absoluteMaximumBodySize).contains(self.maxBodySize) else {
                throw ConfigurationError(
                    "connection.maxBodySize must be from \(Handshake.minimumBodyLimit) to \(FrameHeader.absoluteMaximumBodySize)"
                )
            }
        }
    }

    /// Liveness checking (PROTOCOL.md, "Liveness").
    public struct Heartbeat: Sendable, Hashable {
        /// How often to ping an idle link in the foreground; `nil` uses the gateway's interval
        /// from WELCOME. Every interval is capped at half the gateway's idle timeout.
        public var interval: Duration?
        /// The interval in ``HeartbeatMode/background``; `nil` pings as rarely as the gateway
        /// allows (half its idle timeout), to save battery.
        public var backgroundInterval: Duration?
        /// The interval in ``HeartbeatMode/lowPower``; `nil` pings as rarely as the gateway allows.
        public var lowPowerInterval: Duration?
        /// The longest wait for any frame after a PING before the link is declared dead, and the
        /// wait used until a round trip has been measured. After that, the wait follows the
        /// measured round trips (smoothed RTT + 4 × its variation), between
        /// ``minimumTimeout`` and this.
        public var timeout: Duration
        /// The shortest wait for an answer to a PING, however fast the link (capped at ``timeout``).
        public var minimumTimeout: Duration
        /// Each interval is shortened by up to this fraction (0 to 0.5), at random, so that
        /// clients do not ping in lockstep.
        public var jitter: Double
        /// A heartbeat timer this late means the app was suspended: instead of declaring the link
        /// dead on stale timers, the client sends a probe that waits ``probeTimeout``. `nil`
        /// turns this off.
        public var suspensionThreshold: Duration?
        /// How long the probe sent after a suspension waits for an answer.
        public var probeTimeout: Duration
        /// While the link is in use (the client sent something after the last frame it
        /// received), this much silence is probed with a PING at once, judged with the adaptive
        /// timeout: a connection stuck in TCP's retransmission backoff on a lossy link is
        /// replaced in seconds. Idle links are not affected. `nil` turns this off.
        public var stallInterval: Duration?
        /// NAT-timeout probing ("smart heartbeat"): learn, per network, the longest interval
        /// the path keeps an idle connection open, and never ping less often than that. It
        /// matters in the background, where the default interval is as long as the gateway
        /// allows and a NAT that forgets idle connections sooner would silently cut the app
        /// off from its pushes. Networks are told apart by ``NetworkPath/identity``, so it
        /// works best with a ``ClientConfiguration/pathMonitor``. `nil` (the default) turns it
        /// off. See ``NATTimeoutProber``.
        public var natProbing: NATTimeoutProber.Configuration?

        public init(
            interval: Duration? = nil,
            backgroundInterval: Duration? = nil,
            lowPowerInterval: Duration? = nil,
            timeout: Duration = .seconds(5),
            minimumTimeout: Duration = .seconds(1),
            jitter: Double = 0.1,
            suspensionThreshold: Duration? = .seconds(2),
            probeTimeout: Duration = .seconds(2),
            stallInterval: Duration? = .seconds(1),
            natProbing: NATTimeoutProber.Configuration? = nil
        ) throws(ConfigurationError) {
            self.interval = interval
            self.backgroundInterval = backgroundInterval
            self.lowPowerInterval = lowPowerInterval
            self.timeout = timeout
            self.minimumTimeout = minimumTimeout
            self.jitter = jitter
            self.suspensionThreshold = suspensionThreshold
            self.probeTimeout = probeTimeout
            self.stallInterval = stallInterval
            self.natProbing = natProbing
            try self.validate()
        }

        public static var defaults: Heartbeat { try! Heartbeat() }

        public func validate() throws(ConfigurationError) {
            for (name, value) in [
                ("interval", self.interval), ("backgroundInterval", self.backgroundInterval), ("lowPowerInterval", self.lowPowerInterval),
            ] {
                if let value, value <= .zero {
                    throw ConfigurationError("heartbeat.\(name) must be positive (or nil for the default)")
                }
            }
            guard self.timeout > .zero else { throw ConfigurationError("heartbeat.timeout must be positive") }
            guard self.minimumTimeout > .zero else { throw ConfigurationError("heartbeat.minimumTimeout must be positive") }
            if let stall = self.stallInterval, stall <= .zero {
                throw ConfigurationError("heartbeat.stallInterval must be positive (or nil to turn it off)")
            }
            guard (0...0.5).contains(self.jitter) else { throw ConfigurationError("heartbeat.jitter must be from 0 to 0.5") }
            if let threshold = self.suspensionThreshold, threshold <= .zero {
                throw ConfigurationError("heartbeat.suspensionThreshold must be positive (or nil to turn detection off)")
            }
            guard self.probeTimeout > .zero else { throw ConfigurationError("heartbeat.probeTimeout must be positive") }
            try self.natProbing?.validate()
        }

        /// These settings, as a connection's machine takes them.
        var policy: HeartbeatPolicy {
            HeartbeatPolicy(
                foreground: self.interval,
                background: self.backgroundInterval,
                lowPower: self.lowPowerInterval,
                jitter: self.jitter,
                timeout: self.timeout,
                minimumTimeout: self.minimumTimeout,
                suspensionThreshold: self.suspensionThreshold,
                probeTimeout: self.probeTimeout,
                stallInterval: self.stallInterval
            )
        }
    }

    /// Reconnection after failures.
    public struct Reconnect: Sendable, Hashable {
        /// Delays between failed attempts, and the attempt limit.
        public var backoff: Backoff
        /// A connection that lasts this long resets the failure count.
        public var stableAfter: Duration

        public init(backoff: Backoff = .defaults, stableAfter: Duration = .seconds(10)) throws(ConfigurationError) {
            self.backoff = backoff
            self.stableAfter = stableAfter
            try self.validate()
        }

        public static var defaults: Reconnect { try! Reconnect() }

        public func validate() throws(ConfigurationError) {
            try self.backoff.validate()
            guard self.stableAfter >= .zero else { throw ConfigurationError("reconnect.stableAfter must not be negative") }
        }
    }

    /// Push delivery to subscribers.
    public struct Pushes: Sendable, Hashable {
        /// How many pushes each subscriber's stream buffers; when a subscriber falls further
        /// behind, its oldest pushes are dropped and counted (see ``TetherClient/droppedPushes``).
        public var bufferSize: Int

        public init(bufferSize: Int = 4096) throws(ConfigurationError) {
            self.bufferSize = bufferSize
            try self.validate()
        }

        public static var defaults: Pushes { try! Pushes() }

        public func validate() throws(ConfigurationError) {
            guard self.bufferSize >= 1 else { throw ConfigurationError("pushes.bufferSize must be at least 1") }
        }
    }

    /// Channel subscriptions (``TetherClient/subscribe(_:from:recover:presence:bufferSize:)``).
    public struct Channels: Sendable {
        /// Where each subscription keeps the position of the last publication the app handled,
        /// so that a subscription made without a position after the app started again (after
        /// a week) recovers from there: ``SQLiteOutboxStore`` keeps them in its file. `nil`
        /// (the default): an app that wants to resume passes the position it kept itself.
        ///
        /// A publication counts as handled once the app asks for the next event; what was
        /// handed out in the last ``saveInterval`` before the app quit may come again after it
        /// starts (at least once). An app that needs each publication once keeps positions
        /// with its own data, in the same transaction, and passes them to `subscribe`.
        public var positions: (any ChannelPositionStore)?
        /// How often a subscription writes its position while publications come (and once
        /// more when it ends).
        public var saveInterval: Duration

        public init(positions: (any ChannelPositionStore)? = nil, saveInterval: Duration = .seconds(1)) throws(ConfigurationError) {
            self.positions = positions
            self.saveInterval = saveInterval
            try self.validate()
        }

        public static var defaults: Channels { try! Channels() }

        public func validate() throws(ConfigurationError) {
            guard self.saveInterval >= .zero else { throw ConfigurationError("channels.saveInterval must not be negative") }
        }
    }
}
