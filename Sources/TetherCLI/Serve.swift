import ArgumentParser
import Logging
import ServiceLifecycle
import TetherGateway
import TetherJWT

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a gateway with the demo handlers (echo, time.now, chat.join/send/leave, demo.slow, dm).",
        discussion: """
            Reliable messages (topic dm) are kept in an SQLite file, so a restarted gateway loses
            nothing: tether send --to bob hello, then tether receive --as bob.
            """
    )

    @Option(help: "The address to listen on.")
    var host = "127.0.0.1"

    @Option(help: "The port to listen on.")
    var port = 7700

    @Flag(help: "Let several gateway processes listen on the same port (SO_REUSEPORT); the kernel spreads connections across them.")
    var reusePort = false

    @Option(name: .customLong("heartbeat"), help: "The heartbeat interval announced to clients, in seconds.")
    var heartbeatSeconds: Double = 10

    @Option(
        name: .customLong("idle-timeout"),
        help: "Close a connection silent this many seconds; must exceed the heartbeat (default: 3 × the heartbeat)."
    )
    var idleSeconds: Double?

    @Option(
        name: .customLong("handshake-timeout"),
        help: "Close a connection that has not completed its handshake (HELLO, authentication) within this many seconds (default: 10)."
    )
    var handshakeSeconds: Double?

    @Option(help: "The SQLite file of reliable delivery (created if missing), or :memory: to keep it in memory.")
    var store = "tether-gateway.sqlite"

    @Flag(help: "Refuse clients that do not offer CRC-32C checksums.")
    var requireChecksums = false

    @Option(
        name: .customLong("jwt-key"),
        help: """
            Require a JWT from every client, checked with this key: a PEM public key or certificate (RS256, ES256), \
            a JWKS file, or an HS256 secret of at least 32 bytes. Repeat for several keys. Without it the gateway is open.
            """
    )
    var jwtKeys: [String] = []

    @Option(name: .customLong("jwt-issuer"), help: "With --jwt-key: the issuer (iss) tokens must carry.")
    var jwtIssuer: String?

    @Option(name: .customLong("jwt-audience"), help: "With --jwt-key: an audience (aud) tokens must include.")
    var jwtAudience: String?

    @OptionGroup(title: "TLS and WebSocket") var transports: TransportOptions

    @OptionGroup(title: "Limits on what clients may claim") var limits: LimitOptions

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try self.logging.bootstrap(default: .info)
        Self.raiseDescriptorLimit()
        var configuration = GatewayConfiguration.defaults
        configuration.listen = .init(host: self.host, port: self.port, reusePort: self.reusePort)
        try self.transports.apply(to: &configuration)
        configuration.timeouts.heartbeatInterval = try duration(seconds: self.heartbeatSeconds, option: "heartbeat")
        configuration.timeouts.idle =
            try self.idleSeconds.map { try duration(seconds: $0, option: "idle-timeout") } ?? configuration.timeouts.heartbeatInterval * 3
        if let handshakeSeconds { configuration.timeouts.handshake = try duration(seconds: handshakeSeconds, option: "handshake-timeout") }
        try configuration.timeouts.validate()
        configuration.checksums = self.requireChecksums ? .required : .optional
        try self.limits.apply(to: &configuration.limits)
        let logger = Logger(label: "tether.serve")
        let messageStore: any MessageStore
        if self.store == ":memory:" {
            messageStore = InMemoryMessageStore()
        } else {
            do {
                messageStore = try SQLiteMessageStore(path: self.store)
            } catch {
                throw ValidationError("cannot open the store '\(self.store)': \(error)")
            }
        }
        var authenticator: JWTAuthenticator?
        if self.jwtKeys.isEmpty {
            if self.jwtIssuer != nil || self.jwtAudience != nil { throw ValidationError("--jwt-issuer and --jwt-audience need --jwt-key") }
            logger.warning("no --jwt-key: the gateway is open, and any client may claim any client id")
        } else {
            do {
                authenticator = try await JWTAuthenticator(
                    keyFiles: self.jwtKeys,
                    configuration: .init(issuer: self.jwtIssuer, audience: self.jwtAudience)
                )
            } catch {
                throw ValidationError("\(error)")
            }
            logger.info("clients must present a JWT whose subject is their client id", metadata: ["keys": "\(self.jwtKeys.count)"])
        }
        let gateway = try Gateway(
            configuration: configuration,
            messageStore: messageStore,
            authenticator: authenticator,
            logger: Logger(label: "tether.gateway")
        )
        DemoService.install(on: gateway)
        let services = ServiceGroup(
            configuration: .init(services: [gateway], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        )
        try await services.run()
    }

    /// Raises the process's soft limit on open descriptors to its hard limit: each connection
    /// holds one, and the gateway caps its connections below the soft limit.
    static func raiseDescriptorLimit() {
        #if canImport(Darwin)
            let resource = RLIMIT_NOFILE
        #else
            let resource = __rlimit_resource_t(RLIMIT_NOFILE.rawValue)
        #endif
        var limit = rlimit()
        guard getrlimit(resource, &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
        limit.rlim_cur = limit.rlim_max
        _ = setrlimit(resource, &limit)
    }
}
