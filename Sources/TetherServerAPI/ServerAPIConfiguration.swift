public import TetherGateway

/// Where the server API listens, who may call it, and how much it takes.
///
/// ```swift
/// let api = try ServerAPIConfiguration(port: 8090, keys: [ProcessInfo.processInfo.environment["TETHER_API_KEY"]!])
/// ```
public struct ServerAPIConfiguration: Sendable {
    /// The address to listen on; loopback by default: put the API on a private network.
    public var host: String
    /// The port of the JSON API; 0 picks a free one (see ``ServerAPIService/listeningPort()``).
    public var port: Int
    /// The port of the gRPC API (`Protos/tether/v1/server_api.proto`), on the same host; `nil`:
    /// none. 0 picks a free one (see ``ServerAPIService/grpcListeningPort()``).
    public var grpcPort: Int?
    /// The API keys a call may carry (`Authorization: Bearer KEY`); several at once to rotate
    /// them. Each is 16 to 512 bytes.
    public var keys: [String]
    /// The largest request body, in bytes (4 MiB by default); a larger one is refused with 413
    /// (gRPC: RESOURCE_EXHAUSTED).
    public var maxBodyBytes: Int
    /// The most connections each of the API's listeners (JSON, gRPC) keeps open at once; more
    /// wait in the listen backlog, and are taken as connections close. (The JSON listener,
    /// Hummingbird's, may take up to 3 more that arrive in the same instant as the last one.)
    public var maxConnections: Int
    /// How long a connection may stay silent (between calls, or in the middle of a body)
    /// before it is closed.
    public var idleTimeout: Duration

    /// The shortest API key accepted: a key is a password that can be tried over the network.
    public static let minKeyLength = 16

    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidConfiguration`` for no
    ///   key, a key shorter than 16 or longer than 512 bytes, a port outside 0...65535, or a
    ///   limit that is not positive.
    public init(
        host: String = "127.0.0.1",
        port: Int = 8090,
        grpcPort: Int? = nil,
        keys: [String],
        maxBodyBytes: Int = 4 << 20,
        maxConnections: Int = 1_024,
        idleTimeout: Duration = .seconds(60)
    ) throws(GatewayError) {
        guard !keys.isEmpty else {
            throw GatewayError(code: .invalidConfiguration, message: "the server API needs at least one API key")
        }
        for (index, key) in keys.enumerated() where !(Self.minKeyLength...512).contains(key.utf8.count) {
            throw GatewayError(
                code: .invalidConfiguration,
                message: "API key \(index + 1) is \(key.utf8.count) bytes long; a key must be \(Self.minKeyLength) to 512 bytes"
            )
        }
        for (name, value) in [("port", port), ("gRPC port", grpcPort ?? 0)] where !(0...65_535).contains(value) {
            throw GatewayError(code: .invalidConfiguration, message: "the server API's \(name) must be 0 to 65535, got \(value)")
        }
        guard maxBodyBytes > 0, maxConnections > 0, idleTimeout > .zero else {
            throw GatewayError(
                code: .invalidConfiguration,
                message: "the server API's maxBodyBytes, maxConnections and idleTimeout must be positive"
            )
        }
        self.host = host
        self.port = port
        self.grpcPort = grpcPort
        self.keys = keys
        self.maxBodyBytes = maxBodyBytes
        self.maxConnections = maxConnections
        self.idleTimeout = idleTimeout
    }
}
