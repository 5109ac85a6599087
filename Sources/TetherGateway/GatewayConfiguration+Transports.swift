public import NIOSSL
public import TetherCore
public import TetherNIO

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

    /// A WebSocket listener (RFC 6455): an HTTP/1.1 upgrade on ``path`` with subprotocol
    /// `tether.v1`, then one Tether frame per binary message.
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

        public init(
            host: String = "127.0.0.1",
            port: Int = 7443,
            path: String = Endpoint.defaultWebSocketPath,
            tls: Bool = false,
            allowedOrigins: Set<String>? = nil
        ) {
            self.host = host
            self.port = port
            self.path = path
            self.tls = tls
            self.allowedOrigins = allowedOrigins
        }

        func validate() throws(ConfigurationError) {
            guard !self.host.isEmpty, (0...65535).contains(self.port) else {
                throw ConfigurationError("webSocket needs a host and a port from 0 to 65535")
            }
            guard self.path.hasPrefix("/"), !self.path.contains("?"), !self.path.contains(" ") else {
                throw ConfigurationError("webSocket.path must start with '/' and have no query or spaces, got '\(self.path)'")
            }
        }
    }
}
