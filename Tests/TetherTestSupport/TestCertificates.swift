import Crypto
import Foundation
import SwiftASN1
public import X509

/// Certificates made for the tests, in memory, at each run: a CA, a gateway certificate it
/// signed for `localhost` and `127.0.0.1`, a client certificate for mutual TLS, and an
/// impostor: a certificate for the same names from a CA nobody trusts. No private key is
/// committed anywhere.
///
/// ```swift
/// let certificates = TestCertificates.shared
/// configuration.tls = .init(certificateChain: .text(certificates.server.certificatePEM), privateKey: .text(certificates.server.keyPEM))
/// ```
public struct TestCertificates: Sendable {
    /// A certificate and its private key, as PEM text.
    public struct Identity: Sendable {
        public let certificate: Certificate
        public let certificatePEM: String
        public let keyPEM: String
        /// The DER SubjectPublicKeyInfo of its key, which a certificate pin hashes.
        public let subjectPublicKeyInfo: [UInt8]
    }

    /// The test CA: what the clients of the tests trust.
    public let authority: Identity
    /// The gateway's certificate, signed by ``authority``, for `localhost` and `127.0.0.1`.
    public let server: Identity
    /// A second gateway key and certificate from ``authority``, for pin rotation.
    public let rotatedServer: Identity
    /// A client certificate signed by ``authority``, its common name `device-42`.
    public let client: Identity
    /// A certificate for the same names as ``server`` from another CA (``impostorAuthority``).
    public let impostor: Identity
    /// The CA of ``impostor``, trusted by no test client unless a test says so.
    public let impostorAuthority: Identity

    /// One set per test process (making keys takes a few milliseconds each).
    public static let shared: TestCertificates = {
        do {
            return try TestCertificates()
        } catch {
            fatalError("cannot make the test certificates: \(error)")
        }
    }()

    public init() throws {
        self.authority = try Self.authority(named: "Tether Test CA")
        self.impostorAuthority = try Self.authority(named: "Impostor CA")
        self.server = try Self.leaf(commonName: "localhost", issuer: self.authority, serverNames: true)
        self.rotatedServer = try Self.leaf(commonName: "localhost", issuer: self.authority, serverNames: true)
        self.client = try Self.leaf(commonName: "device-42", issuer: self.authority, serverNames: false)
        self.impostor = try Self.leaf(commonName: "localhost", issuer: self.impostorAuthority, serverNames: true)
    }

    /// Writes `text` to a new file in the temporary directory and returns its path.
    public static func write(_ text: String, name: String) throws -> String {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
            "tether-certs-\(ProcessInfo.processInfo.processIdentifier)"
        )
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        let url = directory.appendingPathComponent(name)
        try text.write(to: url, atomically: true, encoding: .utf8)
        return url.path
    }

    private static func authority(named name: String) throws -> Identity {
        let key = P256.Signing.PrivateKey()
        let subject = try DistinguishedName { CommonName(name) }
        let extensions = try Certificate.Extensions {
            Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
            Critical(KeyUsage(keyCertSign: true, cRLSign: true))
        }
        return try Self.issue(key: key, subject: subject, extensions: extensions, issuer: subject, issuerKey: key)
    }

    private static func leaf(commonName: String, issuer: Identity, serverNames: Bool) throws -> Identity {
        let extensions = try Certificate.Extensions {
            Critical(BasicConstraints.notCertificateAuthority)
            Critical(KeyUsage(digitalSignature: true))
            try ExtendedKeyUsage([.serverAuth, .clientAuth])
            if serverNames {
                SubjectAlternativeNames([.dnsName("localhost"), .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1]))])
            } else {
                SubjectAlternativeNames([.dnsName(commonName)])
            }
        }
        return try Self.issue(
            key: P256.Signing.PrivateKey(),
            subject: try DistinguishedName { CommonName(commonName) },
            extensions: extensions,
            issuer: issuer.certificate.subject,
            issuerKey: try P256.Signing.PrivateKey(pemRepresentation: issuer.keyPEM)
        )
    }

    /// A certificate for `key`, valid from an hour ago for 30 days, signed by `issuerKey`.
    private static func issue(
        key: P256.Signing.PrivateKey,
        subject: DistinguishedName,
        extensions: Certificate.Extensions,
        issuer: DistinguishedName,
        issuerKey: P256.Signing.PrivateKey
    ) throws -> Identity {
        let now = Date()
        let certificate = try Certificate(
            version: .v3,
            serialNumber: Certificate.SerialNumber(),
            publicKey: Certificate.PublicKey(key.publicKey),
            notValidBefore: now - 3600,
            notValidAfter: now + 86400 * 30,
            issuer: issuer,
            subject: subject,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: extensions,
            issuerPrivateKey: Certificate.PrivateKey(issuerKey)
        )
        return try Self.identity(certificate, key)
    }

    private static func identity(_ certificate: Certificate, _ key: P256.Signing.PrivateKey) throws -> Identity {
        Identity(
            certificate: certificate,
            certificatePEM: try certificate.serializeAsPEM().pemString,
            keyPEM: key.pemRepresentation,
            subjectPublicKeyInfo: Array(key.publicKey.derRepresentation)
        )
    }
}
