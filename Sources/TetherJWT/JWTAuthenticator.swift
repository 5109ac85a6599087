public import Foundation
import JWTKit
public import TetherGateway

/// A ``ClientAuthenticator`` for JSON Web Tokens: the client sends a JWT as its HELLO token,
/// and the token's subject (`sub`) is its client id.
///
/// It checks the signature (HS256, RS256 or ES256, with keys from files, PEM text or a JWKS
/// document), the expiry (`exp`, required unless ``Configuration-swift.struct/requireExpiration``
/// is off), `nbf`, and the issuer and audience when configured. A token whose subject is not
/// the client id the HELLO claims is refused with `permission denied`; a missing, malformed,
/// badly signed, expired or not-yet-valid token with `unauthenticated`, each with a message
/// that says which. The connection of a client whose token expires is drained once the
/// gateway's ``GatewayConfiguration/Timeouts-swift.struct/credentialGrace`` has passed.
///
/// Optional claims restrict the client: `rooms` (an array of strings) lists the rooms it may
/// be joined to, `topics` the request methods it may call and the message topics it may send,
/// `channels` the channels it may subscribe to (names, or prefixes ending in `*`). `info` (a
/// string) is what the client shows others in channels' presence (``ClientIdentity/info``).
///
/// ```swift
/// let authenticator = try await JWTAuthenticator(
///     keyFiles: ["/etc/tether/jwt-public.pem"],
///     configuration: .init(issuer: "https://auth.example.com", audience: "chat")
/// )
/// let gateway = try Gateway(configuration: .defaults, authenticator: authenticator)
/// ```
public struct JWTAuthenticator: ClientAuthenticator {
    /// What a token must contain besides a valid signature.
    public struct Configuration: Sendable, Hashable {
        /// The `iss` a token must carry; `nil` accepts any.
        public var issuer: String?
        /// A value the token's `aud` must contain; `nil` accepts any.
        public var audience: String?
        /// Whether a token without `exp` is refused.
        public var requireExpiration: Bool
        /// The clock difference tolerated when checking `exp` and `nbf`.
        public var leeway: Duration

        public init(issuer: String? = nil, audience: String? = nil, requireExpiration: Bool = true, leeway: Duration = .seconds(30)) {
            self.issuer = issuer
            self.audience = audience
            self.requireExpiration = requireExpiration
            self.leeway = leeway
        }

        public static var defaults: Configuration { Configuration() }
    }

    /// A verification key.
    public enum Key: Sendable, Hashable {
        /// An HMAC secret of at least 32 bytes, for HS256.
        case hmacSecret(Data)
        /// A public key in PEM (`-----BEGIN PUBLIC KEY-----`), RSA for RS256 or P-256 for ES256,
        /// or an X.509 certificate in PEM holding one.
        case publicKeyPEM(String)
        /// A JSON Web Key Set: `{"keys": [...]}`; each key is chosen by the token's `kid`.
        case jwks(String)
    }

    private let keys: JWTKeyCollection
    private let iteratesKeys: Bool
    private let configuration: Configuration
    private let now: @Sendable () -> Date

    /// Creates an authenticator from keys.
    /// - Parameters:
    ///   - keys: At least one key. With several keys outside a JWKS, a token is checked against
    ///     each in turn.
    ///   - configuration: The issuer, audience and expiry rules.
    ///   - now: The wall clock, for tests.
    /// - Throws: ``JWTConfigurationError`` if a key cannot be read.
    public init(
        keys: [Key],
        configuration: Configuration = .defaults,
        now: @escaping @Sendable () -> Date = { Date() }
    ) async throws(JWTConfigurationError) {
        guard !keys.isEmpty else { throw JWTConfigurationError("a JWT authenticator needs at least one key") }
        let collection = JWTKeyCollection()
        // Keys outside a JWKS have no `kid` when there is one (the collection's default key), and
        // a made-up one each when there are several (a token is then checked against each).
        let several = keys.filter { if case .jwks = $0 { false } else { true } }.count > 1
        var plainKeys = 0
        func kid() -> JWKIdentifier? { several ? JWKIdentifier(string: "tether-key-\(plainKeys)") : nil }
        for key in keys {
            switch key {
            case .hmacSecret(let secret):
                // RFC 7518 3.2: an HS256 key is at least as long as the hash, 32 bytes.
                guard secret.count >= 32 else {
                    throw JWTConfigurationError("an HS256 secret must have at least 32 bytes (it has \(secret.count))")
                }
                await collection.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256, kid: kid())
                plainKeys += 1
            case .publicKeyPEM(let pem):
                if let key = try? ES256PublicKey(pem: pem) {
                    await collection.add(ecdsa: key, kid: kid())
                } else if let key = try? ES256PublicKey(certificate: pem) {
                    await collection.add(ecdsa: key, kid: kid())
                } else if let key = try? Insecure.RSA.PublicKey(pem: pem) {
                    await collection.add(rsa: key, digestAlgorithm: .sha256, kid: kid())
                } else if let key = try? Insecure.RSA.PublicKey(certificatePEM: pem) {
                    await collection.add(rsa: key, digestAlgorithm: .sha256, kid: kid())
                } else {
                    throw JWTConfigurationError("not a P-256 or RSA public key or certificate in PEM")
                }
                plainKeys += 1
            case .jwks(let json):
                do {
                    try await collection.add(jwksJSON: json)
                } catch {
                    throw JWTConfigurationError("not a usable JSON Web Key Set: \(error)")
                }
            }
        }
        self.keys = collection
        self.iteratesKeys = several
        self.configuration = configuration
        self.now = now
    }

    /// Creates an authenticator from key files: PEM public keys or certificates, JWKS documents
    /// (JSON), or HMAC secrets (any other file; its bytes, without a trailing newline).
    /// - Throws: ``JWTConfigurationError`` naming the file that cannot be read or used.
    public init(
        keyFiles: [String],
        configuration: Configuration = .defaults,
        now: @escaping @Sendable () -> Date = { Date() }
    ) async throws(JWTConfigurationError) {
        var keys: [Key] = []
        for path in keyFiles {
            guard let data = FileManager.default.contents(atPath: path) else {
                throw JWTConfigurationError("cannot read the JWT key file \(path)")
            }
            keys.append(Self.key(from: data))
        }
        do {
            try await self.init(keys: keys, configuration: configuration, now: now)
        } catch {
            throw JWTConfigurationError("the JWT key files \(keyFiles.joined(separator: ", ")): \(error.message)")
        }
    }

    /// What a key file holds, by its content.
    static func key(from data: Data) -> Key {
        let text = String(decoding: data, as: UTF8.self).trimmingCharacters(in: .whitespacesAndNewlines)
        if text.hasPrefix("-----BEGIN") { return .publicKeyPEM(text) }
        if text.hasPrefix("{"), text.contains("\"keys\"") { return .jwks(text) }
        var secret = data
        while secret.last == UInt8(ascii: "\n") || secret.last == UInt8(ascii: "\r") { secret.removeLast() }
        return .hmacSecret(secret)
    }

    public func authenticate(_ hello: HandshakeInfo) async throws -> ClientIdentity {
        guard let token = hello.authToken, token.readableBytes > 0 else {
            throw AuthenticationError(.unauthenticated, "a token is required: send a JWT in HELLO")
        }
        let claims: TetherClaims
        do {
            claims = try await self.keys.verify(Array(token.readableBytesView), as: TetherClaims.self, iteratingKeys: self.iteratesKeys)
        } catch {
            throw AuthenticationError(.unauthenticated, "the token is not a valid JWT for this gateway: \(Self.reason(error))")
        }
        let now = self.now()
        let leeway = self.configuration.leeway.totalSeconds
        if let expiry = claims.exp?.value {
            guard expiry.timeIntervalSince(now) > -leeway else {
                throw AuthenticationError(.unauthenticated, "the token expired at \(Self.format(expiry))")
            }
        } else if self.configuration.requireExpiration {
            throw AuthenticationError(.unauthenticated, "the token has no expiry (exp)")
        }
        if let notBefore = claims.nbf?.value, notBefore.timeIntervalSince(now) > leeway {
            throw AuthenticationError(.unauthenticated, "the token is not valid before \(Self.format(notBefore))")
        }
        if let issuer = self.configuration.issuer, claims.iss?.value != issuer {
            throw AuthenticationError(.unauthenticated, "the token's issuer is not '\(issuer)'")
        }
        if let audience = self.configuration.audience, !(claims.aud?.value.contains(audience) ?? false) {
            throw AuthenticationError(.unauthenticated, "the token's audience does not include '\(audience)'")
        }
        guard let subject = claims.sub?.value, !subject.isEmpty else {
            throw AuthenticationError(.unauthenticated, "the token has no subject (sub): it names no client id")
        }
        var channels: [ChannelPattern]?
        if let names = claims.channels {
            do {
                channels = try names.map { name throws(ConfigurationError) in try ChannelPattern(name) }
            } catch {
                throw AuthenticationError(.unauthenticated, "the token's channels claim is malformed: \(error.message)")
            }
        }
        return ClientIdentity(
            clientID: subject,
            expiresAt: claims.exp?.value,
            rooms: claims.rooms.map(Set.init),
            topics: claims.topics.map(Set.init),
            channels: channels,
            info: claims.info
        )
    }

    private static func format(_ date: Date) -> String {
        date.formatted(.iso8601)
    }

    /// A short reason from jwt-kit's error, without the token.
    private static func reason(_ error: any Error) -> String {
        if let error = error as? JWTError {
            switch error.errorType {
            case .signatureVerificationFailed: return "bad signature"
            case .malformedToken: return "malformed token"
            case .missingKIDHeader, .unknownKID: return "no key for its kid"
            case .noKeyProvided: return "no key for its algorithm"
            default: return "\(error.errorType)"
            }
        }
        return "\(type(of: error))"
    }
}

/// The claims Tether reads; jwt-kit decodes them, the authenticator checks them (so that each
/// refusal says which claim failed).
struct TetherClaims: JWTPayload {
    var sub: SubjectClaim?
    var exp: ExpirationClaim?
    var nbf: NotBeforeClaim?
    var iss: IssuerClaim?
    var aud: AudienceClaim?
    var rooms: [String]?
    var topics: [String]?
    var channels: [String]?
    var info: String?

    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// A JWT authenticator that cannot be made: a missing or unusable key.
public struct JWTConfigurationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// What is wrong.
    public var message: String

    public init(_ message: String) { self.message = message }

    public var description: String { self.message }
}
