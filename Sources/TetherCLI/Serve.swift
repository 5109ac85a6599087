import ArgumentParser
import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import TetherBackendProxy
import TetherCore
import TetherGateway
import TetherJWT
import TetherPostgres
import TetherServerAPI
import TetherStreamForwarding

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

    @Option(
        name: .customLong("body-timeout"),
        help: "Refuse a frame or a POST body that takes longer than this many seconds to arrive once begun (default: 30)."
    )
    var bodySeconds: Double?

    @Option(help: "The SQLite file of reliable delivery (created if missing), or :memory: to keep it in memory.")
    var store = "tether-gateway.sqlite"

    @Flag(
        help: """
            Flush every commit of the SQLite store to disk (synchronous = FULL): what it acknowledged survives a power loss,             or a disk the kernel stops writing to, too. Without it a commit survives the process being killed, and the last             ones may be lost with the machine.
            """
    )
    var fullSync = false

    @Option(
        help: """
            A PostgreSQL URL (postgres://user[:password]@host[:port]/database): the gateway is a node of a cluster that \
            shares its store, presence, rooms and pushes with every gateway on that database; --store is not used. \
            tether postgres start runs one for development.
            """
    )
    var postgres: String?

    @Option(help: "With --postgres: the node's name (default: the host name and process id; with --nodes, NAME-1, NAME-2, …).")
    var nodeName: String?

    @Option(help: "With --postgres: run this many nodes in this process, on --port, --port + 1, … (each its own gateway).")
    var nodes = 1

    @Option(
        help: """
            With --postgres: where clients reach this node (tether://10.0.0.5:7700); another node's GOAWAY sends its clients \
            here when it shuts down. Default: tether://HOST:PORT unless --host is a wildcard address.
            """
    )
    var advertise: String?

    @Option(
        help: """
            With --postgres: where the other nodes post to this node's HTTP streams (http://10.0.0.5:7443/tether/stream), \
            so that a load balancer needs no sticky sessions. Default: the HTTP listener as bound, named by the host's name \
            if --ws-host is a wildcard address.
            """
    )
    var advertiseStream: String?

    @Option(
        help: """
            Serve GET /health, GET /ready (503 while starting, draining or without its store) and GET /metrics \
            (Prometheus) on this port, for operators and load balancers (with --nodes, PORT, PORT + 1, …).
            """
    )
    var adminPort: Int?

    @Option(help: "With --admin-port: the admin listener's address (loopback by default: keep it private).")
    var adminHost = "127.0.0.1"

    @Option(
        help: """
            With --admin-port: a file holding the token every admin request must carry (Authorization: Bearer TOKEN, \
            at least 16 characters); needed to serve the admin listener beyond loopback.
            """
    )
    var adminTokenFile: String?

    @Flag(help: "With --admin-port: serve the admin listener beyond loopback without a token (anyone there may read its metrics).")
    var adminInsecureOpen = false

    @Flag(
        help: """
            Without --jwt-key, listen beyond loopback anyway (--host 0.0.0.0 …): any client may then claim any \
            client id. Without this flag such a gateway refuses to start.
            """
    )
    var insecureOpen = false

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

    @OptionGroup(title: "Channels") var channels: ChannelOptions

    @OptionGroup(title: "A backend in any language: the server API and the event proxy") var backend: BackendOptions

    @Option(
        name: .customLong("config"),
        help: "A YAML or JSON file of the server API, the backend and channel rules (see ServeFile.swift); options win over it."
    )
    var configFile: String?

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
        if let bodySeconds { configuration.timeouts.body = try duration(seconds: bodySeconds, option: "body-timeout") }
        try configuration.timeouts.validate()
        configuration.checksums = self.requireChecksums ? .required : .optional
        try self.limits.apply(to: &configuration.limits)
        let file = try self.configFile.map(ServeFile.load)
        let storeKeepsChannels = self.postgres != nil || self.store != ":memory:"
        try self.channels.apply(to: &configuration, storeKeepsChannels: storeKeepsChannels)
        if let rules = file?.channels, !rules.isEmpty {
            // The file's rules first; the options' rule takes the channels none of them matches.
            let fileRules: [GatewayConfiguration.Channels.Rule]
            do {
                fileRules = try rules.enumerated().map { try $1.rule(index: $0, storeKeepsChannels: storeKeepsChannels) }
            } catch let error as ValidationError {
                throw ValidationError("--config \(self.configFile ?? ""): \(error.message)")
            }
            let optionRules = configuration.channels?.rules ?? []
            configuration.channels?.rules = fileRules + optionRules
        }
        let logger = Logger(label: "tether.serve")
        var authenticator: (any ClientAuthenticator)?
        let proxy = try self.backend.proxy(file: file, logger: logger)
        let api = try self.backend.api(file: file)
        configuration.insecureOpen = self.insecureOpen
        var adminToken: String?
        if let adminTokenFile {
            guard let text = try? String(contentsOfFile: adminTokenFile, encoding: .utf8) else {
                throw ValidationError("--admin-token-file: cannot read \(adminTokenFile)")
            }
            adminToken = text.trimmingCharacters(in: .whitespacesAndNewlines)
        }
        configuration.admin = self.adminPort.map {
            GatewayConfiguration.Admin(host: self.adminHost, port: $0, token: adminToken, insecureOpen: self.adminInsecureOpen)
        }
        if let admin = configuration.admin {
            do {
                try admin.validate()
            } catch {
                throw ValidationError(error.message)
            }
        }
        if let proxy, proxy.configuration.connect {
            guard self.jwtKeys.isEmpty else { throw ValidationError("--backend-connect and --jwt-key both check credentials: choose one") }
            authenticator = proxy
            logger.info("clients' credentials are checked by the backend")
        } else if self.jwtKeys.isEmpty {
            if self.jwtIssuer != nil || self.jwtAudience != nil { throw ValidationError("--jwt-issuer and --jwt-audience need --jwt-key") }
            if let host = configuration.nonLoopbackHosts.first, !self.insecureOpen {
                throw ValidationError(
                    "the gateway would listen on \(host) with no --jwt-key: any client could claim any client id. "
                        + "Add --jwt-key, listen on loopback (the default --host 127.0.0.1), or add --insecure-open to allow it"
                )
            }
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
        if let postgres {
            try await self.runCluster(
                postgres,
                configuration: configuration,
                authenticator: authenticator,
                proxy: proxy,
                api: api,
                logger: logger
            )
            return
        }
        if self.nodes != 1 || self.nodeName != nil { throw ValidationError("--nodes and --node-name need --postgres") }
        let messageStore: any MessageStore
        if self.store == ":memory:" {
            messageStore = InMemoryMessageStore()
        } else {
            do {
                messageStore = try SQLiteMessageStore(path: self.store, fullSync: self.fullSync)
            } catch {
                throw ValidationError("cannot open the store '\(self.store)': \(error)")
            }
        }
        let gateway = try Gateway(
            configuration: configuration,
            messageStore: messageStore,
            authenticator: authenticator,
            metrics: configuration.admin == nil ? .system : .prometheus(),
            logger: Logger(label: "tether.gateway")
        )
        // The proxy first: the group stops its services in reverse order, the gateway before it.
        let services = (proxy.map { [$0] } ?? []) + (try self.install(on: gateway, proxy: proxy, api: api, node: 0, logger: logger))
        let group = ServiceGroup(
            configuration: .init(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
        )
        try await group.run()
    }

    /// Gives `gateway` its handlers (the backend's, or the demo's when neither a backend nor a
    /// server API is configured) and returns the services to run: the gateway, and its server
    /// API (on `api`'s port + `node`).
    private func install(
        on gateway: Gateway,
        proxy: BackendProxy?,
        api: ServerAPIConfiguration?,
        node: Int,
        logger: Logger
    ) throws -> [any Service] {
        var services: [any Service] = [gateway]
        if let proxy {
            proxy.install(on: gateway)
        } else if api == nil {
            DemoService.install(on: gateway)
        }
        if let api = try api.map({ try BackendOptions.api($0, node: node) }) {
            services.append(ServerAPIService(gateway: gateway, configuration: api, logger: Logger(label: "tether.api")))
            logger.info(
                "server API",
                metadata: [
                    "listen": "\(api.host):\(api.port)", "grpc": "\(api.grpcPort.map { "\(api.host):\($0)" } ?? "-")",
                    "keys": "\(api.keys.count)",
                ]
            )
        }
        return services
    }

    /// Runs `--nodes` gateways, each a node of the cluster on the database at `url`, until
    /// SIGTERM or SIGINT.
    private func runCluster(
        _ url: String,
        configuration: GatewayConfiguration,
        authenticator: (any ClientAuthenticator)?,
        proxy: BackendProxy?,
        api: ServerAPIConfiguration?,
        logger: Logger
    ) async throws {
        guard (1...64).contains(self.nodes) else { throw ValidationError("--nodes must be between 1 and 64") }
        if self.advertise != nil && self.nodes != 1 { throw ValidationError("--advertise names one node: use it without --nodes") }
        if self.advertiseStream != nil && self.nodes != 1 {
            throw ValidationError("--advertise-stream names one node: use it without --nodes")
        }
        if let advertise = self.advertise, (try? Endpoint(parsing: advertise)) == nil {
            throw ValidationError("--advertise: '\(advertise)' is not an endpoint URL (tether://host:port, wss://host:port/path, …)")
        }
        let clientConfiguration: PostgresClient.Configuration
        do {
            clientConfiguration = try PostgresMessageStore.clientConfiguration(url: url)
        } catch {
            throw ValidationError("--postgres: \(error.message)")
        }
        // HTTP-stream POSTs that reach a node which does not hold their session go to the one
        // that does; one pool of connections for every node of this process.
        let forwarder = HTTPStreamForwarder(logger: Logger(label: "tether.cluster.streams"))
        do {
            try await self.runNodes(
                url: url,
                clientConfiguration: clientConfiguration,
                configuration: configuration,
                authenticator: authenticator,
                proxy: proxy,
                api: api,
                forwarder: forwarder,
                logger: logger
            )
        } catch {
            try? await forwarder.shutdown()
            throw error
        }
        try? await forwarder.shutdown()
    }

    /// The nodes of ``runCluster(_:configuration:authenticator:proxy:api:logger:)``, until SIGTERM or SIGINT.
    private func runNodes(
        url: String,
        clientConfiguration: PostgresClient.Configuration,
        configuration: GatewayConfiguration,
        authenticator: (any ClientAuthenticator)?,
        proxy: BackendProxy?,
        api: ServerAPIConfiguration?,
        forwarder: HTTPStreamForwarder,
        logger: Logger
    ) async throws {
        var services: [any Service] = proxy.map { [$0] } ?? []
        try await withThrowingDiscardingTaskGroup { group in
            for index in 0..<self.nodes {
                let name = self.nodes == 1 ? self.nodeName : "\(self.nodeName ?? "node")-\(index + 1)"
                var nodeLogger = Logger(label: "tether.gateway")
                if let name { nodeLogger[metadataKey: "tether.node"] = "\(name)" }
                let client = PostgresClient(configuration: clientConfiguration, backgroundLogger: Logger(label: "tether.postgres"))
                group.addTask { await client.run() }
                let store: PostgresMessageStore
                do {
                    // PostgresClient waits for a connection as long as it takes: a server that
                    // is not there at start is an error, said plainly, not a silent wait.
                    let server = "\(clientConfiguration.host ?? "?"):\(clientConfiguration.port ?? 5432)"
                    store = try await withTimeout(
                        .seconds(15),
                        failure: {
                            ValidationError(
                                "--postgres: no answer from PostgreSQL at \(server) "
                                    + "within 15 s (is it running? tether postgres start runs one for development)"
                            )
                        }
                    ) { try await PostgresMessageStore(client: client, logger: Logger(label: "tether.postgres")) }
                } catch let error as ValidationError {
                    throw error
                } catch {
                    throw ValidationError("--postgres: \((error as? MessageStoreError)?.message ?? "\(error)")")
                }
                var nodeConfiguration = configuration
                nodeConfiguration.listen?.port = configuration.listen.map { $0.port == 0 ? 0 : $0.port + index } ?? 0
                var clusterConfiguration = try PostgresCluster.Configuration(url: url, name: name)
                if let advertise = self.advertise {
                    clusterConfiguration.address = advertise
                } else if let listen = nodeConfiguration.listen, !GatewayConfiguration.isWildcard(listen.host), listen.port != 0 {
                    clusterConfiguration.address =
                        Endpoint(host: listen.host, port: listen.port, transport: listen.tls ? .tls : .tcp).description
                }
                clusterConfiguration.streamURL = self.advertiseStream
                clusterConfiguration.streamForwarder = forwarder
                let cluster: PostgresCluster
                do {
                    cluster = try PostgresCluster(store: store, configuration: clusterConfiguration, logger: nodeLogger)
                } catch {
                    throw ValidationError("--advertise-stream: \((error as? MessageStoreError)?.message ?? "\(error)")")
                }
                if index > 0, let admin = configuration.admin, admin.port != 0 {
                    nodeConfiguration.admin?.port = admin.port + index
                }
                if index > 0, nodeConfiguration.webSocket != nil {
                    nodeConfiguration.webSocket?.port = (configuration.webSocket?.port ?? 0) + index
                }
                let gateway = try Gateway(
                    configuration: nodeConfiguration,
                    messageStore: store,
                    authenticator: authenticator,
                    cluster: cluster,
                    metrics: configuration.admin == nil ? .system : .prometheus(),
                    logger: nodeLogger
                )
                services += try self.install(on: gateway, proxy: proxy, api: api, node: index, logger: logger)
                logger.info(
                    "cluster node",
                    metadata: ["node": "\(name ?? "-")", "listen": "\(nodeConfiguration.listen.map { "\($0.host):\($0.port)" } ?? "-")"]
                )
            }
            let serviceGroup = ServiceGroup(
                configuration: .init(services: services, gracefulShutdownSignals: [.sigterm, .sigint], logger: logger)
            )
            try await serviceGroup.run()
            group.cancelAll()  // the PostgreSQL clients, once every gateway left its cluster
        }
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
