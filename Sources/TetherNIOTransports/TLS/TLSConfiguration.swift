import Crypto
import Foundation
package import NIOCore
public import NIOSSL
public import TetherCore
package import TetherNIO

/// PEM text, in memory or in a file: certificates, a certificate chain or a private key.
///
/// ```swift
/// let chain = PEMSource.file("/etc/tether/chain.pem")
/// let key = PEMSource.text(ProcessInfo.processInfo.environment["TETHER_TLS_KEY"]!)
/// ```
public enum PEMSource: Sendable, Hashable {
    /// A file holding PEM text.
    case file(String)
    /// The PEM text itself (`-----BEGIN …-----`).
    case text(String)

    /// The certificates it holds, in order.
    /// - Throws: ``ConfigurationError`` if the file cannot be read or holds no certificate.
    package func certificates(what: String) throws(ConfigurationError) -> [NIOSSLCertificate] {
        let certificates: [NIOSSLCertificate]
        do {
            switch self {
            case .file(let path): certificates = try NIOSSLCertificate.fromPEMFile(path)
            case .text(let text): certificates = try NIOSSLCertificate.fromPEMBytes(Array(text.utf8))
            }
        } catch {
            throw ConfigurationError("\(what): cannot read PEM certificates from \(self): \(error)")
        }
        guard !certificates.isEmpty else { throw ConfigurationError("\(what): \(self) holds no PEM certificate") }
        return certificates
    }

    /// The private key it holds.
    /// - Throws: ``ConfigurationError`` if the file cannot be read or holds no private key.
    package func privateKey(what: String) throws(ConfigurationError) -> NIOSSLPrivateKey {
        do {
            switch self {
            case .file(let path): return try NIOSSLPrivateKey(file: path, format: .pem)
            case .text(let text): return try NIOSSLPrivateKey(bytes: Array(text.utf8), format: .pem)
            }
        } catch {
            throw ConfigurationError("\(what): cannot read a PEM private key from \(self): \(error)")
        }
    }
}

extension PEMSource: CustomStringConvertible {
    public var description: String {
        switch self {
        case .file(let path): "the file '\(path)'"
        case .text: "the PEM text given"
        }
    }
}

/// A certificate pin: the SHA-256 digest of a certificate's public key (its DER
/// SubjectPublicKeyInfo), written `sha256/BASE64` as in HTTP Public Key Pinning.
///
/// Pin the key, not the certificate, so that a renewed certificate with the same key still
/// matches; list the next key's pin too before rotating keys.
///
/// ```swift
/// let pin = try CertificatePin("sha256/47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=")
/// ```
/// Print a certificate's pin with
/// `openssl x509 -in cert.pem -pubkey -noout | openssl pkey -pubin -outform der | openssl dgst -sha256 -binary | base64`.
public struct CertificatePin: Hashable, Sendable, CustomStringConvertible {
    /// The 32-byte SHA-256 digest.
    public let digest: [UInt8]

    /// Parses `sha256/BASE64` (the prefix may be left out).
    /// - Throws: ``ConfigurationError`` if the text is not a base64 SHA-256 digest.
    public init(_ text: String) throws(ConfigurationError) {
        let encoded = text.hasPrefix("sha256/") ? String(text.dropFirst("sha256/".count)) : text
        guard let data = Data(base64Encoded: encoded), data.count == 32 else {
            throw ConfigurationError("a certificate pin is 'sha256/' and the base64 of a 32-byte SHA-256 digest, got '\(text)'")
        }
        self.digest = Array(data)
    }

    /// The pin of a public key, given as its DER SubjectPublicKeyInfo.
    public init(subjectPublicKeyInfo: [UInt8]) {
        self.digest = Array(SHA256.hash(data: subjectPublicKeyInfo))
    }

    /// The pin of a certificate's public key.
    package init(of certificate: NIOSSLCertificate) throws {
        self.init(subjectPublicKeyInfo: try certificate.extractPublicKey().toSPKIBytes())
    }

    public var description: String { "sha256/" + Data(self.digest).base64EncodedString() }
}

/// How a client secures `tethers://` and `wss://` connections.
///
/// By default it trusts the system's certificate authorities and checks that the certificate
/// names the host it connects to, like a browser.
///
/// ```swift
/// var tls = ClientTLSConfiguration.defaults
/// tls.additionalTrustRoots = [.file("internal-ca.pem")]
/// tls.pins = [try CertificatePin("sha256/…current…"), try CertificatePin("sha256/…next…")]
/// let transport = try TCPClientTransport(tls: tls)
/// ```
public struct ClientTLSConfiguration: Sendable, Hashable {
    /// Which certificate authorities to trust.
    public enum TrustRoots: Sendable, Hashable {
        /// The operating system's.
        case system
        /// Only these (a private CA), and none of the system's.
        case only(PEMSource)
    }

    /// The certificate authorities a server's chain must lead to.
    public var trustRoots: TrustRoots
    /// Certificate authorities trusted besides ``trustRoots`` (a company's own CA).
    public var additionalTrustRoots: [PEMSource]
    /// The name to send (SNI) and to check the certificate against, instead of the endpoint's
    /// host: for connecting to an IP address whose certificate names a host.
    public var serverName: String?
    /// The public keys the server's certificate may have; empty accepts any trusted
    /// certificate. A certificate that chains to a trusted root but matches no pin is refused
    /// with ``TransportError/Code/certificatePinMismatch``.
    public var pins: [CertificatePin]
    /// A certificate chain and key to present to gateways that ask for one (mutual TLS).
    public var clientCertificate: (chain: PEMSource, privateKey: PEMSource)?
    /// The oldest TLS version accepted; 1.2 by default (1.3 is preferred when both offer it).
    public var minimumVersion: TLSVersion

    /// The system's trust roots, no pins, no client certificate, TLS 1.2 or later.
    public static var defaults: ClientTLSConfiguration { ClientTLSConfiguration() }

    public init(
        trustRoots: TrustRoots = .system,
        additionalTrustRoots: [PEMSource] = [],
        serverName: String? = nil,
        pins: [CertificatePin] = [],
        clientCertificate: (chain: PEMSource, privateKey: PEMSource)? = nil,
        minimumVersion: TLSVersion = .tlsv12
    ) {
        self.trustRoots = trustRoots
        self.additionalTrustRoots = additionalTrustRoots
        self.serverName = serverName
        self.pins = pins
        self.clientCertificate = clientCertificate
        self.minimumVersion = minimumVersion
    }

    public static func == (lhs: Self, rhs: Self) -> Bool {
        lhs.trustRoots == rhs.trustRoots && lhs.additionalTrustRoots == rhs.additionalTrustRoots
            && lhs.serverName == rhs.serverName && lhs.pins == rhs.pins && lhs.minimumVersion == rhs.minimumVersion
            && lhs.clientCertificate?.chain == rhs.clientCertificate?.chain
            && lhs.clientCertificate?.privateKey == rhs.clientCertificate?.privateKey
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(self.trustRoots)
        hasher.combine(self.additionalTrustRoots)
        hasher.combine(self.serverName)
        hasher.combine(self.pins)
        hasher.combine(self.clientCertificate?.chain)
        hasher.combine(self.clientCertificate?.privateKey)
    }

    /// NIOSSL's configuration for a connection speaking `alpn`.
    /// - Throws: ``ConfigurationError`` if a PEM source cannot be read.
    package func nioSSLConfiguration(alpn: [String]) throws(ConfigurationError) -> NIOSSL.TLSConfiguration {
        var configuration = NIOSSL.TLSConfiguration.makeClientConfiguration()
        configuration.minimumTLSVersion = self.minimumVersion
        configuration.applicationProtocols = alpn
        configuration.shutdownTimeout = TLSShutdown.timeout
        switch self.trustRoots {
        case .system: configuration.trustRoots = .default
        case .only(let source): configuration.trustRoots = .certificates(try source.certificates(what: "tls.trustRoots"))
        }
        if !self.additionalTrustRoots.isEmpty {
            var extra: [NIOSSLCertificate] = []
            for source in self.additionalTrustRoots {
                extra += try source.certificates(what: "tls.additionalTrustRoots")
            }
            configuration.additionalTrustRoots = [.certificates(extra)]
        }
        if let client = self.clientCertificate {
            configuration.certificateChain = try client.chain.certificates(what: "tls.clientCertificate").map { .certificate($0) }
            configuration.privateKey = .privateKey(try client.privateKey.privateKey(what: "tls.clientCertificate"))
        }
        return configuration
    }
}

/// How long a closing TLS connection waits for the peer's `close_notify`.
package enum TLSShutdown {
    /// 250 ms, not NIOSSL's 5 s: Tether frames carry their own lengths, so a connection cut
    /// before the peer's `close_notify` loses nothing (no truncation attack applies), and a
    /// link found dead by the heartbeat must not stay open for seconds more.
    package static let timeout = TimeAmount.milliseconds(250)
}

extension TransportError {
    /// A trusted certificate at `endpoint` whose public key, `presented` (`nil` if it could not
    /// be read), matches none of `pins`.
    package static func pinMismatch(at endpoint: Endpoint, presented: CertificatePin?, pins: [CertificatePin]) -> TransportError {
        TransportError(
            code: .certificatePinMismatch,
            message:
                "the certificate of \(endpoint) is trusted, but its public key (\(presented?.description ?? "unreadable")) matches none of the \(pins.count) configured pin\(pins.count == 1 ? "" : "s")"
        )
    }
}
