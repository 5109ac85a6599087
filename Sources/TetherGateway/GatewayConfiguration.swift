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

    /// Size and concurrency limits.
    public struct Limits: Sendable, Hashable {
        /// The largest frame body accepted from a client (after the handshake).
        public var maxBodySize: Int
        /// Handlers run at once per connection; further requests wait (the gateway stops
        /// reading from that connection until a handler finishes).
        public var maxConcurrentRequestsPerConnection: Int

        /// When a push finds more than this many bytes already waiting to be sent to a
        /// connection, the client is not reading fast enough (a "slow consumer"): the gateway
        /// closes that connection rather than buffer without bound. The count is checked once
        /// the connection stops being writable (its buffer passed the 64 KiB high-water mark),
        /// so a limit below 64 KiB acts as 64 KiB.
        public var maxBufferedOutboundBytes: Int
        /// How many reliable deliveries a connection may have sent and not yet acknowledged.
        public var deliveryWindow: Int
        /// What a connection may hold in the gateway's memory of what it sent: the frame being
        /// read (up to ``maxBodySize``) plus the bodies of its reliable messages waiting to be
        /// processed. At the limit the gateway stops reading the connection until processing
        /// makes room (TCP then slows the client); nothing is refused. At least twice
        /// ``maxBodySize``.
        public var maxBufferedInboundBytes: Int
        /// The longest client id accepted in HELLO, in UTF-8 bytes; a longer one is refused with
        /// ERROR `invalid request`.
        public var maxClientIDLength: Int
        /// Connections held at once. The gateway also stays below its process's descriptor
        /// limit (keeping 64 in reserve), whichever is lower. A connection over a limit gets
        /// ERROR `resource exhausted` saying which, and is closed.
        public var maxConnections: Int
        /// Connections held at once from one source address. Mobile carriers put many users
        /// behind one address: keep it generous.
        public var maxConnectionsPerAddress: Int
        /// Connections held at once whose handshake (authentication included) has not completed.
        public var maxUnauthenticatedConnections: Int
        /// New connections accepted per second (each runs a handshake), in a burst up to as many.
        public var handshakesPerSecond: Int
        /// New connections accepted per second from one source address.
        public var handshakesPerSecondPerAddress: Int
        /// Requests one connection may make per second (in a burst up to as many). Beyond, the
        /// connection is paced: requests wait, in order, until the rate allows them (their
        /// deadlines running), and past 16 waiting the gateway stops reading it; none is
        /// refused. `Int.max`: no limit.
        public var requestsPerSecondPerConnection: Int
        /// Reliable messages one connection may send per second (in a burst up to as many).
        /// Beyond, the connection is paced: messages wait, in order, until the rate allows them,
        /// and past 4,096 waiting (or ``maxBufferedInboundBytes``) the gateway stops reading it;
        /// none is refused or needs sending again. `Int.max`: no limit.
        public var messagesPerSecondPerConnection: Int
        /// Payload bytes one connection's compression may inflate and deflate per second (in a
        /// burst up to as many): what a compressed request and its compressed reply cost in
        /// zlib. Beyond, the connection is paced: the gateway stops reading it until the rate
        /// allows; nothing is refused. `Int.max`: no limit.
        public var compressionBytesPerSecondPerConnection: Int
        /// Rooms one connection may be in; a join beyond fails (``RequestContext/join(_:)``
        /// returns `false`).
        public var maxRoomsPerConnection: Int
        /// Connections one room may hold; a join beyond fails.
        public var maxMembersPerRoom: Int
        /// Reliable deliveries a recipient may have waiting in the store (not yet
        /// acknowledged). A message whose handler delivers beyond it is refused for good with
        /// `resource exhausted` (its MESSAGE_ACK says so; its deliveries are not stored), and
        /// ``Gateway/deliver(to:topic:body:)`` throws.
        public var maxDeliveriesPerRecipient: Int
        /// The body bytes of the deliveries a recipient may have waiting in the store (as stored:
        /// compressed where the payload was worth it).
        public var maxDeliveryBytesPerRecipient: Int
        /// Deliveries the whole store may have waiting, every recipient together. A message
        /// whose handler delivers beyond it is refused for good with `resource exhausted`, as
        /// over a recipient's quota. The store's count is read about once a second
        /// (``MessageStore/totalUsage()``); a store that cannot tell is not held to it.
        public var maxStoredDeliveries: Int
        /// The body bytes (as stored) the whole store may have waiting.
        public var maxStoredDeliveryBytes: Int
        /// Deliveries one sender's messages may store per minute (refilled continuously; all
        /// its outboxes together). Beyond, its message is refused for good with `resource
        /// exhausted`: a client cannot fill the store by writing to many recipients.
        public var maxDeliveriesPerSenderPerMinute: Int
        /// The body bytes one sender's messages may store per minute.
        public var maxDeliveryBytesPerSenderPerMinute: Int
        /// The bytes all connections together may make the gateway hold: frames and WebSocket
        /// messages read in part, POST bodies arriving, reliable messages waiting to be
        /// processed, what a client does not read. At the limit, a connection holding bytes
        /// stops reading (TCP then slows its client), new connections are refused (ERROR
        /// `resource exhausted`, HTTP `503`), and `/ready` answers `503`; a body paused for
        /// longer than ``GatewayConfiguration/Timeouts-swift.struct/body`` is refused. At least
        /// twice ``maxBufferedInboundBytes``.
        public var memoryBudget: Int

        public init(
            maxBodySize: Int = 1 << 20,
            maxConcurrentRequestsPerConnection: Int = 512,
            maxBufferedOutboundBytes: Int = 4 << 20,
            deliveryWindow: Int = 256,
            maxBufferedInboundBytes: Int = 4 << 20,
            maxClientIDLength: Int = 256,
            maxConnections: Int = 100_000,
            maxConnectionsPerAddress: Int = 2_000,
            maxUnauthenticatedConnections: Int = 10_000,
            handshakesPerSecond: Int = 10_000,
            handshakesPerSecondPerAddress: Int = 500,
            requestsPerSecondPerConnection: Int = 20_000,
            messagesPerSecondPerConnection: Int = 5_000,
            compressionBytesPerSecondPerConnection: Int = 8 << 20,
            maxRoomsPerConnection: Int = 1_000,
            maxMembersPerRoom: Int = 100_000,
            maxDeliveriesPerRecipient: Int = 10_000,
            maxDeliveryBytesPerRecipient: Int = 64 << 20,
            maxStoredDeliveries: Int = 10_000_000,
            maxStoredDeliveryBytes: Int = 8 << 30,
            maxDeliveriesPerSenderPerMinute: Int = 100_000,
            maxDeliveryBytesPerSenderPerMinute: Int = 256 << 20,
            memoryBudget: Int = 512 << 20
        ) {
            self.maxBodySize = maxBodySize
            self.maxConcurrentRequestsPerConnection = maxConcurrentRequestsPerConnection
            self.maxBufferedOutboundBytes = maxBufferedOutboundBytes
            self.deliveryWindow = deliveryWindow
            self.maxBufferedInboundBytes = maxBufferedInboundBytes
            self.maxClientIDLength = maxClientIDLength
            self.maxConnections = maxConnections
            self.maxConnectionsPerAddress = maxConnectionsPerAddress
            self.maxUnauthenticatedConnections = maxUnauthenticatedConnections
            self.handshakesPerSecond = handshakesPerSecond
            self.handshakesPerSecondPerAddress = handshakesPerSecondPerAddress
            self.requestsPerSecondPerConnection = requestsPerSecondPerConnection
            self.messagesPerSecondPerConnection = messagesPerSecondPerConnection
            self.compressionBytesPerSecondPerConnection = compressionBytesPerSecondPerConnection
            self.maxRoomsPerConnection = maxRoomsPerConnection
            self.maxMembersPerRoom = maxMembersPerRoom
            self.maxDeliveriesPerRecipient = maxDeliveriesPerRecipient
            self.maxDeliveryBytesPerRecipient = maxDeliveryBytesPerRecipient
            self.maxStoredDeliveries = maxStoredDeliveries
            self.maxStoredDeliveryBytes = maxStoredDeliveryBytes
            self.maxDeliveriesPerSenderPerMinute = maxDeliveriesPerSenderPerMinute
            self.maxDeliveryBytesPerSenderPerMinute = maxDeliveryBytesPerSenderPerMinute
            self.memoryBudget = memoryBudget
        }

        public static var defaults: Limits { Limits() }

        public func validate() throws(ConfigurationError) {
            guard (Handshake.minimumBodyLimit...FrameHeader.absoluteMaximumBodySize).contains(self.maxBodySize) else {
                throw ConfigurationError(
                    "limits.maxBodySize must be from \(Handshake.minimumBodyLimit) to \(FrameHeader.absoluteMaximumBodySize)"
                )
            }
            guard self.maxConcurrentRequestsPerConnection >= 1 else {
                throw ConfigurationError("limits.maxConcurrentRequestsPerConnection must be at least 1")
            }
            guard self.maxBufferedOutboundBytes >= self.maxBodySize else {
                throw ConfigurationError("limits.maxBufferedOutboundBytes must be at least limits.maxBodySize")
            }
            guard self.deliveryWindow >= 1 else { throw ConfigurationError("limits.deliveryWindow must be at least 1") }
            guard self.maxBufferedInboundBytes >= 2 * self.maxBodySize else {
                throw ConfigurationError("limits.maxBufferedInboundBytes must be at least twice limits.maxBodySize")
            }
            guard self.memoryBudget >= 2 * self.maxBufferedInboundBytes else {
                throw ConfigurationError("limits.memoryBudget must be at least twice limits.maxBufferedInboundBytes")
            }
            guard (1...Int(UInt16.max)).contains(self.maxClientIDLength) else {
                throw ConfigurationError("limits.maxClientIDLength must be from 1 to 65535")
            }
            for (name, value) in [
                ("maxConnections", self.maxConnections), ("maxConnectionsPerAddress", self.maxConnectionsPerAddress),
                ("maxUnauthenticatedConnections", self.maxUnauthenticatedConnections),
                ("handshakesPerSecond", self.handshakesPerSecond), ("handshakesPerSecondPerAddress", self.handshakesPerSecondPerAddress),
                ("requestsPerSecondPerConnection", self.requestsPerSecondPerConnection),
                ("messagesPerSecondPerConnection", self.messagesPerSecondPerConnection),
                ("compressionBytesPerSecondPerConnection", self.compressionBytesPerSecondPerConnection),
                ("maxRoomsPerConnection", self.maxRoomsPerConnection), ("maxMembersPerRoom", self.maxMembersPerRoom),
                ("maxDeliveriesPerRecipient", self.maxDeliveriesPerRecipient),
                ("maxDeliveryBytesPerRecipient", self.maxDeliveryBytesPerRecipient),
                ("maxStoredDeliveries", self.maxStoredDeliveries), ("maxStoredDeliveryBytes", self.maxStoredDeliveryBytes),
                ("maxDeliveriesPerSenderPerMinute", self.maxDeliveriesPerSenderPerMinute),
                ("maxDeliveryBytesPerSenderPerMinute", self.maxDeliveryBytesPerSenderPerMinute),
            ] where value < 1 {
                throw ConfigurationError("limits.\(name) must be at least 1")
            }
        }
    }

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
        if deliveryEpoch != nil { features.formUnion([.reliableDelivery, .messageAnswers]) }
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
