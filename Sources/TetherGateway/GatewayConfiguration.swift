public import TetherCore

/// Everything a ``Gateway`` needs to know, as nested value types with defaults.
///
/// ```swift
/// var configuration = GatewayConfiguration.defaults
/// configuration.listen = .init(host: "0.0.0.0", port: 7700)
/// configuration.timeouts.handler = .seconds(5)
/// ```
public struct GatewayConfiguration: Sendable, Hashable {
    /// Where to accept TCP connections (`tether://`, or `tethers://` with ``Listen/tls``);
    /// `nil` accepts none there.
    public var listen: Listen?
    /// Where to accept WebSocket connections (`ws://`, or `wss://` with
    /// ``WebSocket-swift.struct/tls``); `nil` accepts none. A WebSocket can also share an
    /// application's own HTTP port: see ``Gateway/webSocketUpgrader()``.
    public var webSocket: WebSocket?
    /// The gateway's certificate and key, and whether it asks clients for theirs: needed by
    /// every listener with `tls` on.
    public var tls: TLS?
    /// The name sent in WELCOME, for the clients' logs.
    public var serverName: String
    /// Size and concurrency limits.
    public var limits: Limits
    /// Handshake, handler, heartbeat, idle and shutdown timing.
    public var timeouts: Timeouts
    /// Whether frames carry CRC-32C checksums.
    public var checksums: ChecksumPolicy
    /// What GOAWAY tells clients when the gateway shuts down.
    public var goAway: GoAway
    /// Whether a handler's unexpected error text is sent to the client (off: the client gets
    /// a generic `internal error` and the error is only logged).
    public var exposeHandlerErrors: Bool
    /// Where connections and their request handlers run.
    public var execution: Execution
    /// Lets a gateway with no authenticator listen on an address other than loopback, where
    /// any client may then claim any client id (read another user's room, consume their
    /// reliable deliveries). Off by default: such a gateway refuses to start, with
    /// ``GatewayError/Code/invalidConfiguration``. On, it starts and logs a warning. A gateway
    /// on loopback only (`127.0.0.1`, `::1`, `localhost`) is open without it, for development.
    public var insecureOpen: Bool
    /// The admin listener (`/health`, `/ready`) for operators and orchestrators; `nil` (the
    /// default) has none.
    public var admin: Admin?
    /// Payload compression offered to clients (``Features/compression``): what the gateway
    /// sends is compressed by these settings when the client offered it too; `nil` does not
    /// offer it.
    public var compression: Compression? = .defaults
    /// Channels with history and recovery offered to clients (``Features/channels``); `nil`
    /// does not offer them.
    public var channels: Channels? = .defaults

    /// Listens on 127.0.0.1:7700 with the defaults below.
    public static var defaults: GatewayConfiguration {
        GatewayConfiguration(
            listen: .defaults,
            serverName: "tether-gateway",
            limits: .defaults,
            timeouts: .defaults,
            checksums: .optional,
            goAway: .defaults,
            exposeHandlerErrors: false,
            execution: .eventLoop
        )
    }

    public init(
        listen: Listen?,
        serverName: String,
        limits: Limits,
        timeouts: Timeouts,
        checksums: ChecksumPolicy,
        goAway: GoAway,
        exposeHandlerErrors: Bool,
        execution: Execution = .eventLoop,
        webSocket: WebSocket? = nil,
        tls: TLS? = nil,
        insecureOpen: Bool = false
    ) {
        self.listen = listen
        self.webSocket = webSocket
        self.tls = tls
        self.serverName = serverName
        self.limits = limits
        self.timeouts = timeouts
        self.checksums = checksums
        self.goAway = goAway
        self.exposeHandlerErrors = exposeHandlerErrors
        self.execution = execution
        self.insecureOpen = insecureOpen
    }

    /// The listeners' addresses that are not loopback (`0.0.0.0`, `::`, a host's own address
    /// or name): what an open gateway (no authenticator) must not listen on without
    /// ``insecureOpen``.
    public var nonLoopbackHosts: [String] {
        var hosts: [String] = []
        if let listen = self.listen, !Self.isLoopback(listen.host) { hosts.append(listen.host) }
        if let webSocket = self.webSocket, !Self.isLoopback(webSocket.host) { hosts.append(webSocket.host) }
        return hosts
    }

    /// Whether binding `host` listens on every interface (`0.0.0.0`, `::`): it names no
    /// address another machine could reach this one at.
    package static func isWildcard(_ host: String) -> Bool {
        ["", "0.0.0.0", "::", "[::]", "*"].contains(host)
    }

    /// Whether `host` names only this machine's loopback interface.
    static func isLoopback(_ host: String) -> Bool {
        let bare = host.trimmingCharacters(in: ["[", "]"])
        if bare == "localhost" || bare == "::1" { return true }
        let parts = bare.split(separator: ".", omittingEmptySubsequences: false)
        return parts.count == 4 && parts[0] == "127" && parts.allSatisfy { UInt8($0) != nil }
    }

    /// Where a connection's tasks run: its handshake, its request handlers, its reliable delivery.
    public enum Execution: Sendable, Hashable {
        /// On the connection's event loop (the default). A request goes from the socket to its
        /// handler and back without a thread hop, and the responses of a batch of requests
        /// leave in one write. Handlers must not block: `await` slow work (a database, a file)
        /// instead, which runs elsewhere and resumes on the loop.
        case eventLoop
        /// On Swift's global concurrent executor. A handler that blocks or computes for long
        /// delays only itself, at the cost of two thread hops per request.
        case globalExecutor
    }

    /// Checks every value.
    /// - Throws: ``ConfigurationError`` naming the first invalid value.
    public func validate() throws(ConfigurationError) {
        try self.compression?.validate()
        if let listen = self.listen {
            guard !listen.host.isEmpty, (0...65535).contains(listen.port) else {
                throw ConfigurationError("listen needs a host and a port from 0 to 65535")
            }
            if listen.tls, self.tls == nil {
                throw ConfigurationError("listen.tls is on, but tls (a certificate and key) is not set")
            }
        }
        if let webSocket = self.webSocket {
            try webSocket.validate()
            if webSocket.tls, self.tls == nil {
                throw ConfigurationError("webSocket.tls is on, but tls (a certificate and key) is not set")
            }
            if let listen = self.listen, listen.port != 0, listen.port == webSocket.port, listen.host == webSocket.host {
                throw ConfigurationError("listen and webSocket cannot share \(listen.host):\(listen.port)")
            }
        }
        if let admin = self.admin {
            try admin.validate()
            for (name, host, port) in [
                ("listen", self.listen?.host, self.listen?.port), ("webSocket", self.webSocket?.host, self.webSocket?.port),
            ]
            where admin.port != 0 && port == admin.port && host == admin.host {
                throw ConfigurationError("admin and \(name) cannot share \(admin.host):\(admin.port)")
            }
        }
        guard self.serverName.utf8.count <= Int(UInt16.max) else { throw ConfigurationError("serverName is too long") }
        try self.limits.validate()
        try self.timeouts.validate()
    }

    /// The admin listener: plain HTTP for operators, on loopback unless told otherwise.
    ///
    /// - `GET /health`: `200` while the process serves (JSON: whether it is draining, its
    ///   connections, whether it is open to any client id, its memory budget and use).
    /// - `GET /ready`: `200` while it accepts connections, its message store answers and its
    ///   memory budget has room; `503` with the reasons while it starts, drains (a graceful
    ///   shutdown), cannot reach its store or is at its memory budget. A load balancer or an
    ///   orchestrator stops sending clients on `503`.
    /// - `GET /metrics`: the Prometheus text format.
    ///
    /// It holds at most ``maxConnections`` connections (the others get `503`), and closes one
    /// that sends no complete request for ``idleTimeout``. Beyond loopback it requires a
    /// ``token`` (`Authorization: Bearer …`, `401` without it), or ``insecureOpen``.
    ///
    /// ```swift
    /// configuration.admin = .init(port: 9090)   // curl 127.0.0.1:9090/ready
    /// configuration.admin = .init(host: "0.0.0.0", port: 9090, token: secret)   // curl -H "Authorization: Bearer …"
    /// ```
    public struct Admin: Sendable, Hashable {
        /// The address to bind; loopback by default (what it says is for operators).
        public var host: String
        /// The port; 0 picks a free one (see ``Gateway/adminAddress``).
        public var port: Int
        /// The bearer token every request must carry (`Authorization: Bearer <token>`); `nil`
        /// requires none. At least 16 characters.
        public var token: String?
        /// Lets the admin listener serve beyond loopback without a ``token``. Off by default:
        /// a gateway configured so refuses to start.
        public var insecureOpen: Bool
        /// Connections held at once; one more is answered `503` and closed.
        public var maxConnections: Int
        /// A connection with no complete request for this long is closed (a request's head and
        /// body must arrive within it).
        public var idleTimeout: Duration

        public init(
            host: String = "127.0.0.1",
            port: Int,
            token: String? = nil,
            insecureOpen: Bool = false,
            maxConnections: Int = 64,
            idleTimeout: Duration = .seconds(10)
        ) {
            self.host = host
            self.port = port
            self.token = token
            self.insecureOpen = insecureOpen
            self.maxConnections = maxConnections
            self.idleTimeout = idleTimeout
        }

        /// Checks every value, and that it does not serve beyond loopback without a token unless
        /// ``insecureOpen``.
        /// - Throws: ``ConfigurationError`` naming the first invalid value.
        public func validate() throws(ConfigurationError) {
            guard !self.host.isEmpty, (0...65535).contains(self.port) else {
                throw ConfigurationError("admin needs a host and a port from 0 to 65535")
            }
            if let token = self.token, token.count < 16 || token.contains(where: { $0.isWhitespace }) {
                throw ConfigurationError("admin.token must be at least 16 characters, without spaces")
            }
            guard self.maxConnections >= 1 else { throw ConfigurationError("admin.maxConnections must be at least 1") }
            guard self.idleTimeout > .zero else { throw ConfigurationError("admin.idleTimeout must be positive") }
            if self.token == nil, !self.insecureOpen, !GatewayConfiguration.isLoopback(self.host) {
                throw ConfigurationError(
                    "the admin listener would serve \(self.host) with no token: anyone there could read the gateway's metrics. "
                        + "Give it a token (tether serve --admin-token-file), keep it on loopback, or allow it with admin.insecureOpen "
                        + "(tether serve --admin-insecure-open)"
                )
            }
        }
    }

    /// A TCP listening address.
    public struct Listen: Sendable, Hashable {
        /// The address to bind, e.g. `127.0.0.1`, `0.0.0.0` or `::`.
        public var host: String
        /// The port; 0 picks a free one (see ``Gateway/listeningAddress``).
        public var port: Int
        /// Whether several gateway processes may listen on the same host and port
        /// (`SO_REUSEPORT`, Linux and BSDs): the kernel spreads new connections across them.
        /// Each process must set it. Pushes and reliable delivery reach only the connections of
        /// the process they are made in.
        public var reusePort: Bool
        /// Whether connections speak TLS (`tethers://`, ALPN `tether/1`) with the certificate
        /// of ``GatewayConfiguration/tls``.
        public var tls: Bool

        public init(host: String = "127.0.0.1", port: Int = 7700, reusePort: Bool = false, tls: Bool = false) {
            self.host = host
            self.port = port
            self.reusePort = reusePort
            self.tls = tls
        }

        public static var defaults: Listen { Listen() }
    }

    /// Whether frames carry CRC-32C checksums.
    public enum ChecksumPolicy: Sendable, Hashable {
        /// Never negotiate checksums (HELLO and WELCOME still carry one).
        case disabled
        /// Use them when the client offers them.
        case optional
        /// Refuse clients that do not offer them.
        case required
    }

    /// What GOAWAY tells clients when the gateway shuts down.
    public struct GoAway: Sendable, Hashable {
        /// How long clients should wait before reconnecting.
        public var retryAfter: Duration
        /// Where clients should reconnect instead, if anywhere in particular.
        public var alternateEndpoint: Endpoint?

        public init(retryAfter: Duration = .milliseconds(500), alternateEndpoint: Endpoint? = nil) {
            self.retryAfter = retryAfter
            self.alternateEndpoint = alternateEndpoint
        }

        public static var defaults: GoAway { GoAway() }
    }

    /// The handshake policy these settings amount to.
    /// - Parameter deliveryEpoch: The message store's epoch, if the gateway has a store (so
    ///   offers reliable delivery).
    func handshakePolicy(deliveryEpoch: UInt64?) -> Handshake.GatewayPolicy {
        var features: Features = self.checksums == .disabled ? [] : .checksum
        if self.compression != nil { features.insert(.compression) }
        features.insert(.traceContext)
        if self.channels != nil { features.insert(.channels) }
        if deliveryEpoch != nil { features.formUnion([.reliableDelivery, .messageAnswers, .sharedDeliveries]) }
        return Handshake.GatewayPolicy(
            features: features,
            requiredFeatures: self.checksums == .required ? .checksum : [],
            heartbeatInterval: self.timeouts.heartbeatInterval,
            idleTimeout: self.timeouts.idle,
            maxBodySize: UInt32(self.limits.maxBodySize),
            maxConcurrentRequests: UInt32(self.limits.maxConcurrentRequestsPerConnection),
            serverName: self.serverName,
            deliveryEpoch: deliveryEpoch,
            maxClientIDLength: self.limits.maxClientIDLength
        )
    }
}
