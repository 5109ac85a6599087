public import NIOSSL
public import TetherCore
import TetherNIO
public import TetherNIOTransports

extension GatewayConfiguration {
    /// The gateway's TLS identity and its demands on clients.
    ///
    /// ```swift
    /// configuration.tls = .init(certificateChain: .file("chain.pem"), privateKey: .file("key.pem"))
    /// configuration.listen?.tls = true            // tethers://host:7700
    /// configuration.webSocket = .init(port: 7443, tls: true)  // wss://host:7443/tether
    /// ```
    public struct TLS: Sendable, Hashable {
        /// Whether and how clients present certificates of their own.
        public enum ClientCertificates: Sendable, Hashable {
            /// Clients are not asked for one.
            case none
            /// Clients may present one that chains to these roots; it is checked if presented
            /// and offered to the authenticator (``HandshakeInfo/clientCertificate``).
            case optional(trustRoots: PEMSource)
            /// Clients must present one that chains to these roots (mutual TLS).
            case required(trustRoots: PEMSource)
        }

        /// The gateway's certificate first, then the intermediates.
        public var certificateChain: PEMSource
        /// The private key of the first certificate.
        public var privateKey: PEMSource
        /// Whether clients present certificates.
        public var clientCertificates: ClientCertificates
        /// The oldest TLS version accepted: 1.2 by default (1.3 is chosen when the client offers it).
        public var minimumVersion: TLSVersion

        public init(
            certificateChain: PEMSource,
            privateKey: PEMSource,
            clientCertificates: ClientCertificates = .none,
            minimumVersion: TLSVersion = .tlsv12
        ) {
            self.certificateChain = certificateChain
            self.privateKey = privateKey
            self.clientCertificates = clientCertificates
            self.minimumVersion = minimumVersion
        }

        /// NIOSSL's server configuration, offering `alpn`.
        /// - Throws: ``ConfigurationError`` if a certificate or key cannot be read.
        func nioSSLConfiguration(alpn: [String]) throws(ConfigurationError) -> NIOSSL.TLSConfiguration {
            let chain = try self.certificateChain.certificates(what: "tls.certificateChain")
            let key = try self.privateKey.privateKey(what: "tls.privateKey")
            var configuration = NIOSSL.TLSConfiguration.makeServerConfiguration(
                certificateChain: chain.map { .certificate($0) },
                privateKey: .privateKey(key)
            )
            configuration.minimumTLSVersion = self.minimumVersion
            configuration.applicationProtocols = alpn
            configuration.shutdownTimeout = TLSShutdown.timeout
            switch self.clientCertificates {
            case .none:
                configuration.certificateVerification = .none
            case .optional(let roots):
                configuration.certificateVerification = .optionalVerification
                configuration.trustRoots = .certificates(try roots.certificates(what: "tls.clientCertificates"))
            case .required(let roots):
                configuration.certificateVerification = .noHostnameVerification
                configuration.trustRoots = .certificates(try roots.certificates(what: "tls.clientCertificates"))
            }
            return configuration
        }
    }

    /// The gateway's HTTP listener: WebSocket (RFC 6455) and the HTTP stream.
    ///
    /// WebSocket: an HTTP/1.1 upgrade on ``path`` with subprotocol `tether.v1`, then one Tether
    /// frame per binary message. The HTTP stream (``stream``, on by default): frames down a
    /// long streaming response to `GET /tether/stream`, up in `POST` bodies (PROTOCOL.md,
    /// section 11.5), for networks that let nothing but plain HTTP requests through.
    ///
    /// A request for another path gets `404`, one that is not a WebSocket upgrade `426`, one
    /// without the `tether.v1` subprotocol `400`, one from an origin not allowed `403`; each
    /// with a sentence saying why, and the connection closes.
    public struct WebSocket: Sendable, Hashable {
        /// The address to bind, e.g. `127.0.0.1` or `0.0.0.0`.
        public var host: String
        /// The port; 0 picks a free one (see ``Gateway/webSocketAddress``).
        public var port: Int
        /// The path upgrades are accepted on.
        public var path: String
        /// Whether connections speak TLS (`wss://`) with the certificate of ``GatewayConfiguration/tls``.
        public var tls: Bool
        /// The `Origin` headers accepted; `nil` accepts any, and requests without one (native
        /// apps send none). Browsers always send one: list the sites allowed to connect.
        public var allowedOrigins: Set<String>?
        /// The HTTP stream on the same listener; `nil` turns it off (its path then gets `404`).
        public var stream: HTTPStream?

        public init(
            host: String = "127.0.0.1",
            port: Int = 7443,
            path: String = Endpoint.defaultWebSocketPath,
            tls: Bool = false,
            allowedOrigins: Set<String>? = nil,
            stream: HTTPStream? = .defaults
        ) {
            self.host = host
            self.port = port
            self.path = path
            self.tls = tls
            self.allowedOrigins = allowedOrigins
            self.stream = stream
        }

        func validate() throws(ConfigurationError) {
            guard !self.host.isEmpty, (0...65535).contains(self.port) else {
                throw ConfigurationError("webSocket needs a host and a port from 0 to 65535")
            }
            guard Self.isValidPath(self.path) else {
                throw ConfigurationError("webSocket.path must start with '/' and have no query or spaces, got '\(self.path)'")
            }
            if let stream = self.stream {
                guard Self.isValidPath(stream.path) else {
                    throw ConfigurationError("webSocket.stream.path must start with '/' and have no query or spaces, got '\(stream.path)'")
                }
                guard stream.path != self.path else {
                    throw ConfigurationError("webSocket.stream.path and webSocket.path cannot both be '\(self.path)'")
                }
                try stream.validate()
            }
        }

        private static func isValidPath(_ path: String) -> Bool {
            path.hasPrefix("/") && !path.contains("?") && !path.contains(" ")
        }
    }

    /// The HTTP stream (PROTOCOL.md, section 11.5): a client opens `GET` ``path`` and reads
    /// Tether frames from the response for as long as the connection lives; it sends its own
    /// frames in `POST` ``path`` bodies that name the stream's session token.
    ///
    /// ```swift
    /// configuration.webSocket = .init(port: 443, tls: true)   // https://host/tether/stream too
    /// configuration.webSocket?.stream?.maxPostBodySize = 4 << 20
    /// ```
    public struct HTTPStream: Sendable, Hashable {
        /// The path of the stream and its POSTs.
        public var path: String
        /// The largest POST body accepted; a larger one gets `413` and the connection closes.
        /// At least 256 KiB (what a Tether client sends at most in one POST).
        public var maxPostBodySize: Int
        /// A connection carrying POSTs that has none for this long is closed (and an HTTP/2
        /// connection this long after its last stream ended); `nil`: twice
        /// ``GatewayConfiguration/Timeouts-swift.struct/idle``. A live client POSTs a heartbeat
        /// more often than the idle timeout, so its POST connection is never closed under a
        /// POST it is sending (the race every HTTP/1.1 keep-alive has). Set it below that only
        /// knowingly.
        public var postIdleTimeout: Duration?
        /// How many ended sessions the gateway remembers, so that a late POST for one gets
        /// `410 Gone` rather than `404`.
        public var endedSessionsRemembered: Int
        /// Whether a TLS listener offers HTTP/2 (ALPN `h2`) for the stream: its GET and POSTs
        /// are then streams of one connection. WebSocket stays on HTTP/1.1 either way.
        public var http2: Bool

        public init(
            path: String = Endpoint.defaultHTTPStreamPath,
            maxPostBodySize: Int = 1 << 20,
            postIdleTimeout: Duration? = nil,
            endedSessionsRemembered: Int = 4096,
            http2: Bool = true
        ) {
            self.path = path
            self.maxPostBodySize = maxPostBodySize
            self.postIdleTimeout = postIdleTimeout
            self.endedSessionsRemembered = endedSessionsRemembered
            self.http2 = http2
        }

        public static var defaults: HTTPStream { HTTPStream() }

        func validate() throws(ConfigurationError) {
            guard self.maxPostBodySize >= HTTPStreamBinding.clientPostBodySize else {
                throw ConfigurationError(
                    "webSocket.stream.maxPostBodySize must be at least \(HTTPStreamBinding.clientPostBodySize) (a client's largest POST), got \(self.maxPostBodySize)"
                )
            }
            if let postIdleTimeout = self.postIdleTimeout, postIdleTimeout <= .zero {
                throw ConfigurationError("webSocket.stream.postIdleTimeout must be positive, got \(postIdleTimeout)")
            }
            guard self.endedSessionsRemembered >= 0 else {
                throw ConfigurationError("webSocket.stream.endedSessionsRemembered cannot be negative")
            }
        }
    }
}
