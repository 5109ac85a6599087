import Foundation
public import TetherGateway

/// Which events go to the backend, where, and how hard the gateway leans on it.
///
/// ```swift
/// let backend = try BackendConfiguration(
///     url: "http://127.0.0.1:5000",
///     connect: true,
///     requests: ["order.*"],
///     messages: ["orders.*"]
/// )
/// ```
public struct BackendConfiguration: Sendable {
    /// The backend's base URL: `http://` or `https://` (events go to `URL/tether/…`), or
    /// `grpc://HOST:PORT` (the backend serves `Protos/tether/v1/backend.proto` over plaintext
    /// HTTP/2) or `grpcs://HOST:PORT` (the same over TLS, the backend's certificate checked for
    /// HOST).
    public var url: String
    /// A PEM file of the certificate authorities a `grpcs://` backend's certificate is checked
    /// against; `nil`: the system's. (For `https://`, the HTTP client's configuration decides.)
    public var caFile: String?
    /// Whether every HELLO's credentials go to the backend (`POST /tether/connect`), which
    /// says who the client is.
    public var connect: Bool
    /// Whether the backend is told when a client's connection closes (`POST /tether/disconnect`,
    /// gRPC `Disconnect`): a notification, sent once, not retried.
    public var disconnect: Bool
    /// The channels (names, or prefixes ending in `*`) a client subscribes to, reads the
    /// history or presence of, or publishes to only if the backend allows it
    /// (`POST /tether/authorize`, gRPC `Authorize`), after the gateway's own rules did.
    public var channels: [ChannelPattern]
    /// The request methods answered by the backend (`POST /tether/request/METHOD`): names, or
    /// prefixes ending in `*` (`*` alone: every method the gateway has no handler for).
    public var requests: [String]
    /// The reliable-message topics processed by the backend (`POST /tether/message/TOPIC`),
    /// as ``requests``.
    public var messages: [String]
    /// The most reliable messages in one call to the backend. 1: one call per message
    /// (`POST /tether/message/TOPIC`, gRPC `Message`); above 1, the messages waiting at once go
    /// together (`POST /tether/messages`, gRPC `Messages`), each with its idempotency key and
    /// its own outcome, at most two such calls under way: for a backend that handles the
    /// batch event.
    public var messageBatch: Int
    /// How long a connect or a message call may take; a request's own deadline bounds its call.
    public var timeout: Duration
    /// The most calls under way at once on this node; more wait for a slot (their clients are
    /// paced by the requests and messages they have waiting, not refused).
    public var maxConcurrentCalls: Int
    /// The largest answer the gateway reads from the backend, in bytes.
    public var maxResponseBytes: Int
    /// An `Authorization` header sent with every call, so that the backend can tell the
    /// gateway's calls from others (`Bearer SECRET`).
    public var authorization: String?
    /// When the gateway stops calling a backend that fails.
    public var breaker: Breaker

    /// The circuit breaker's thresholds.
    public struct Breaker: Sendable, Hashable {
        /// Failures in a row (no answer, a timeout, a 5xx) that open the breaker: calls are then
        /// answered `unavailable` at once.
        public var failures: Int
        /// How long it stays open before one call probes the backend again.
        public var openFor: Duration

        public static let defaults = Breaker(failures: 5, openFor: .seconds(5))

        public init(failures: Int, openFor: Duration) {
            self.failures = failures
            self.openFor = openFor
        }
    }

    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidConfiguration`` for a URL
    ///   that is not `http://`, `https://`, `grpc://HOST:PORT` or `grpcs://HOST:PORT`, a CA file
    ///   that cannot be read or without `grpcs://`, nothing to proxy, an empty or reserved (`$…`)
    ///   pattern, a `*` anywhere but at the end, a limit that is not positive, or a
    ///   `messageBatch` outside 1…1,000.
    public init(
        url: String,
        connect: Bool = false,
        disconnect: Bool = false,
        channels: [String] = [],
        requests: [String] = [],
        messages: [String] = [],
        messageBatch: Int = 1,
        caFile: String? = nil,
        timeout: Duration = .seconds(5),
        maxConcurrentCalls: Int = 256,
        maxResponseBytes: Int = 4 << 20,
        authorization: String? = nil,
        breaker: Breaker = .defaults
    ) throws(GatewayError) {
        var base = url
        while base.hasSuffix("/") { base.removeLast() }
        if base.hasPrefix("grpc://") || base.hasPrefix("grpcs://") {
            guard Self.grpcTarget(of: base) != nil else {
                throw GatewayError(
                    code: .invalidConfiguration,
                    message:
                        "a gRPC backend's URL is grpc://HOST:PORT or grpcs://HOST:PORT (a port 1 to 65535, nothing after it), got '\(url)'"
                )
            }
        } else {
            guard base.hasPrefix("http://") || base.hasPrefix("https://"), base.count > 8 else {
                throw GatewayError(
                    code: .invalidConfiguration,
                    message: "the backend's URL must start with http://, https://, grpc:// or grpcs://, got '\(url)'"
                )
            }
        }
        if let caFile {
            guard base.hasPrefix("grpcs://") else {
                throw GatewayError(code: .invalidConfiguration, message: "a CA file is for a grpcs:// backend, got '\(url)'")
            }
            guard FileManager.default.isReadableFile(atPath: caFile) else {
                throw GatewayError(code: .invalidConfiguration, message: "the backend's CA file \(caFile) cannot be read")
            }
        }
        guard connect || disconnect || !channels.isEmpty || !requests.isEmpty || !messages.isEmpty else {
            throw GatewayError(
                code: .invalidConfiguration,
                message: "the backend proxies nothing: set connect or disconnect, or name channels, request methods or message topics"
            )
        }
        var patterns: [ChannelPattern] = []
        for channel in channels {
            do {
                patterns.append(try ChannelPattern(channel))
            } catch {
                throw GatewayError(code: .invalidConfiguration, message: "'\(channel)' is not a channel pattern: \(error)")
            }
        }
        for pattern in requests + messages {
            let body = pattern.hasSuffix("*") ? pattern.dropLast() : Substring(pattern)
            guard pattern == "*" || !body.isEmpty, !body.contains("*"), !pattern.hasPrefix("$") else {
                throw GatewayError(
                    code: .invalidConfiguration,
                    message: "'\(pattern)' is not a method or topic pattern: a name, or a prefix ending in * (not starting with $)"
                )
            }
        }
        guard (1...1_000).contains(messageBatch) else {
            throw GatewayError(
                code: .invalidConfiguration,
                message: "the backend's messageBatch must be 1 (one call per message) to 1,000, got \(messageBatch)"
            )
        }
        guard timeout > .zero, maxConcurrentCalls > 0, maxResponseBytes > 0, breaker.failures > 0, breaker.openFor > .zero else {
            throw GatewayError(
                code: .invalidConfiguration,
                message: "the backend's timeout, maxConcurrentCalls, maxResponseBytes and breaker must be positive"
            )
        }
        self.url = base
        self.caFile = caFile
        self.connect = connect
        self.disconnect = disconnect
        self.channels = patterns
        self.requests = requests
        self.messages = messages
        self.messageBatch = messageBatch
        self.timeout = timeout
        self.maxConcurrentCalls = maxConcurrentCalls
        self.maxResponseBytes = maxResponseBytes
        self.authorization = authorization
        self.breaker = breaker
    }

    /// The host and port of a `grpc://` or `grpcs://` URL, and whether it is over TLS; `nil`
    /// for an HTTP backend.
    var grpcTarget: (host: String, port: Int, tls: Bool)? { Self.grpcTarget(of: self.url) }

    private static func grpcTarget(of url: String) -> (host: String, port: Int, tls: Bool)? {
        let tls = url.hasPrefix("grpcs://")
        guard tls || url.hasPrefix("grpc://") else { return nil }
        let rest = url.dropFirst(tls ? "grpcs://".count : "grpc://".count)
        guard let colon = rest.lastIndex(of: ":"), let port = Int(rest[rest.index(after: colon)...]), (1...65_535).contains(port) else {
            return nil
        }
        var host = rest[..<colon]
        if host.hasPrefix("["), host.hasSuffix("]") { host = host.dropFirst().dropLast() }
        guard !host.isEmpty, !host.contains("/") else { return nil }
        return (String(host), port, tls)
    }
}
