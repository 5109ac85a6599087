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
    /// Reconnection after failures.
    public var reconnect: Reconnect
    /// Push delivery to subscribers.
    public var pushes: Pushes
    /// Reliable messaging; `nil` (the default) does not offer it to the gateway.
    public var reliability: Reliability?

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
    }

    /// How the client proves its identity in HELLO.
    public enum Authentication: Sendable {
        /// No credential.
        case none
        /// A fixed token.
        case token(ByteBuffer)
        /// A token fetched before each connection attempt, so it can be refreshed.
        case provider(@Sendable () async throws -> ByteBuffer)
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

        public init(
            connectTimeout: Duration = .seconds(5),
            handshakeTimeout: Duration = .seconds(5),
            maxBodySize: Int = 1 << 20,
            checksums: Bool = true
        ) throws(ConfigurationError) {
            self.connectTimeout = connectTimeout
            self.handshakeTimeout = handshakeTimeout
            self.maxBodySize = maxBodySize
            self.checksums = checksums
            try self.validate()
        }

        public static var defaults: Connection { try! Connection() }

        public func validate() throws(ConfigurationError) {
            guard self.connectTimeout > .zero else { throw ConfigurationError("connection.connectTimeout must be positive") }
            guard self.handshakeTimeout > .zero else { throw ConfigurationError("connection.handshakeTimeout must be positive") }
            guard (Handshake.minimumBodyLimit...FrameHeader.absoluteMaximumBodySize).contains(self.maxBodySize) else {
                throw ConfigurationError(
                    "connection.maxBodySize must be from \(Handshake.minimumBodyLimit) to \(FrameHeader.absoluteMaximumBodySize)"
                )
            }
        }
    }

    /// Liveness checking (PROTOCOL.md, "Liveness").
    public struct Heartbeat: Sendable, Hashable {
        /// How often to ping an idle link; `nil` uses the gateway's interval from WELCOME.
        /// Never more than half the gateway's idle timeout.
        public var interval: Duration?
        /// How long to wait for any frame after a PING before the link is declared dead.
        public var timeout: Duration

        public init(interval: Duration? = nil, timeout: Duration = .seconds(5)) throws(ConfigurationError) {
            self.interval = interval
            self.timeout = timeout
            try self.validate()
        }

        public static var defaults: Heartbeat { try! Heartbeat() }

        public func validate() throws(ConfigurationError) {
            if let interval = self.interval, interval <= .zero {
                throw ConfigurationError("heartbeat.interval must be positive (or nil for the gateway's)")
            }
            guard self.timeout > .zero else { throw ConfigurationError("heartbeat.timeout must be positive") }
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
}
