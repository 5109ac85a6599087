import Foundation
import JWTKit
import NIOCore
import Testing
import TetherCore
import TetherGateway
import TetherProcess
import TetherTestSupport

@testable import TetherJWT

/// Tokens signed here with jwt-kit (and an RSA key made by `openssl`), checked by the
/// authenticator as a gateway would.
@Suite("JWT authenticator")
struct JWTAuthenticatorTests {
    /// The claims a token carries, as the authenticator reads them; `nil` leaves a claim out.
    typealias Claims = TetherClaims

    static let now = Date(timeIntervalSince1970: 1_800_000_000)
    static let secret = "a shared secret of more than 32 bytes"

    func claims(
        sub: String? = "alice",
        expiresIn: TimeInterval? = 3600,
        notBefore: TimeInterval? = nil,
        iss: String? = nil,
        aud: [String]? = nil,
        rooms: [String]? = nil,
        info: String? = nil
    ) -> Claims {
        Claims(
            sub: sub.map { SubjectClaim(value: $0) },
            exp: expiresIn.map { ExpirationClaim(value: Self.now + $0) },
            nbf: notBefore.map { NotBeforeClaim(value: Self.now + $0) },
            iss: iss.map { IssuerClaim(value: $0) },
            aud: aud.map { AudienceClaim(value: $0) },
            rooms: rooms,
            info: info
        )
    }

    func hmacToken(_ claims: Claims, secret: String = Self.secret) async throws -> String {
        try await JWTKeyCollection().add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256).sign(claims)
    }

    func authenticator(
        _ keys: [JWTAuthenticator.Key],
        _ configuration: JWTAuthenticator.Configuration = .defaults
    ) async throws
        -> JWTAuthenticator
    {
        try await JWTAuthenticator(keys: keys, configuration: configuration, now: { Self.now })
    }

    func hello(_ token: String?, clientID: String = "alice") -> HandshakeInfo {
        HandshakeInfo(clientID: clientID, authToken: token.map { ByteBuffer(string: $0) }, userAgent: nil, remoteAddress: nil)
    }

    /// The refusal the authenticator gives, or `nil` if it accepts.
    func refusal(_ authenticator: JWTAuthenticator, _ token: String?) async -> AuthenticationError? {
        do {
            _ = try await authenticator.authenticate(self.hello(token))
            return nil
        } catch let error as AuthenticationError {
            return error
        } catch {
            Issue.record("unexpected error \(error)")
            return nil
        }
    }

    @Test("HS256: a valid token gives the subject as client id, the expiry and the rooms")
    func valid() async throws {
        let authenticator = try await self.authenticator([.hmacSecret(Data(Self.secret.utf8))])
        let token = try await self.hmacToken(self.claims(rooms: ["lobby"]))
        let identity = try await authenticator.authenticate(self.hello(token))
        #expect(identity.clientID == "alice")
        #expect(identity.expiresAt == Self.now + 3600)
        #expect(identity.rooms == ["lobby"] && identity.allows(room: "lobby") && !identity.allows(room: "vip"))
        #expect(identity.topics == nil && identity.allows(topic: "anything"))
        #expect(identity.info == nil)
        let described = try await authenticator.authenticate(self.hello(try await self.hmacToken(self.claims(info: #"{"name":"Alice"}"#))))
        #expect(described.info == #"{"name":"Alice"}"#, "the info claim is what channels' presence shows")
    }

    @Test("missing, foreign-key, malformed, expired, early and exp-less tokens are refused as unauthenticated, each saying why")
    func refusals() async throws {
        let authenticator = try await self.authenticator([.hmacSecret(Data(Self.secret.utf8))])
        let cases: [(String?, String)] = [
            (nil, "token is required"),
            ("", "token is required"),
            (try await self.hmacToken(self.claims(), secret: "another shared secret, also long enough"), "bad signature"),
            ("not.a.jwt", "not a valid JWT"),
            (try await self.hmacToken(self.claims(expiresIn: -120)), "expired"),
            (try await self.hmacToken(self.claims(notBefore: 600)), "not valid before"),
            (try await self.hmacToken(self.claims(expiresIn: nil)), "no expiry"),
            (try await self.hmacToken(self.claims(sub: nil)), "no subject"),
        ]
        for (token, reason) in cases {
            let refusal = await self.refusal(authenticator, token)
            #expect(refusal?.status == .unauthenticated, "\(reason)")
            #expect(refusal?.message.contains(reason) == true, "\(refusal?.message ?? "accepted") should say \(reason)")
        }
        // Within the leeway (30 s by default), an expiry just past is still accepted.
        #expect(await self.refusal(authenticator, try await self.hmacToken(self.claims(expiresIn: -10))) == nil)
    }

    @Test("issuer and audience are checked when configured")
    func issuerAndAudience() async throws {
        let authenticator = try await self.authenticator(
            [.hmacSecret(Data(Self.secret.utf8))],
            .init(issuer: "https://auth.example", audience: "chat")
        )
        let good = try await self.hmacToken(self.claims(iss: "https://auth.example", aud: ["chat", "other"]))
        #expect(await self.refusal(authenticator, good) == nil)
        let wrongIssuer = try await self.hmacToken(self.claims(iss: "https://evil.example", aud: ["chat"]))
        #expect(await self.refusal(authenticator, wrongIssuer)?.message.contains("issuer") == true)
        let wrongAudience = try await self.hmacToken(self.claims(iss: "https://auth.example", aud: ["billing"]))
        #expect(await self.refusal(authenticator, wrongAudience)?.message.contains("audience") == true)
        let noAudience = try await self.hmacToken(self.claims(iss: "https://auth.example"))
        #expect(await self.refusal(authenticator, noAudience)?.message.contains("audience") == true)
    }

    @Test("ES256 with a PEM public key; a token signed by another key is refused")
    func es256() async throws {
        let signer = ES256PrivateKey()
        let authenticator = try await self.authenticator([.publicKeyPEM(signer.publicKey.pemRepresentation)])
        let token = try await JWTKeyCollection().add(ecdsa: signer).sign(self.claims())
        #expect(try await authenticator.authenticate(self.hello(token)).clientID == "alice")
        let forged = try await JWTKeyCollection().add(ecdsa: ES256PrivateKey()).sign(self.claims())
        #expect(await self.refusal(authenticator, forged)?.message.contains("bad signature") == true)
        let hmac = try await self.hmacToken(self.claims())
        #expect(await self.refusal(authenticator, hmac)?.status == .unauthenticated, "an HS256 token is not accepted for an ES256 key")
    }

    @Test("RS256 with an RSA key pair made by openssl, loaded from PEM files", .requires(.openssl))
    func rs256() async throws {
        try OutsideTool.openssl.require()
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-jwt-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let privatePath = directory.appendingPathComponent("private.pem").path
        let publicPath = directory.appendingPathComponent("public.pem").path
        try await Self.openssl(["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", privatePath])
        try await Self.openssl(["pkey", "-in", privatePath, "-pubout", "-out", publicPath])

        let authenticator = try await JWTAuthenticator(keyFiles: [publicPath], now: { Self.now })
        let privateKey = try Insecure.RSA.PrivateKey(pem: String(contentsOfFile: privatePath, encoding: .utf8))
        let token = try await JWTKeyCollection().add(rsa: privateKey, digestAlgorithm: .sha256).sign(self.claims())
        #expect(try await authenticator.authenticate(self.hello(token)).clientID == "alice")
    }

    @Test("a JWKS file: the token's kid picks the key; a token whose kid names another key is refused")
    func jwks() async throws {
        let first = ES256PrivateKey()
        let second = ES256PrivateKey()
        func jwk(_ key: ES256PrivateKey, _ kid: String) throws -> String {
            let parameters = try #require(key.publicKey.parameters)
            return #"{"kty": "EC", "crv": "P-256", "alg": "ES256", "kid": "\#(kid)", "x": "\#(parameters.x)", "y": "\#(parameters.y)"}"#
        }
        let json = "{\"keys\": [\(try jwk(first, "2026-10")), \(try jwk(second, "2026-11"))]}"
        let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-jwks-\(UUID().uuidString).json").path
        try json.write(toFile: path, atomically: true, encoding: .utf8)
        defer { try? FileManager.default.removeItem(atPath: path) }
        let authenticator = try await JWTAuthenticator(keyFiles: [path], now: { Self.now })

        for (key, kid) in [(first, "2026-10"), (second, "2026-11")] {
            let token = try await JWTKeyCollection().add(ecdsa: key, kid: JWKIdentifier(string: kid)).sign(
                self.claims(),
                kid: JWKIdentifier(string: kid)
            )
            #expect(try await authenticator.authenticate(self.hello(token)).clientID == "alice")
        }
        let mislabelled = try await JWTKeyCollection().add(ecdsa: second, kid: "2026-10").sign(self.claims(), kid: "2026-10")
        #expect(await self.refusal(authenticator, mislabelled)?.message.contains("bad signature") == true)
    }

    @Test("several keys (a rotation): a token signed by any of them is accepted")
    func rotation() async throws {
        let old = ES256PrivateKey()
        let new = ES256PrivateKey()
        let authenticator = try await self.authenticator([
            .publicKeyPEM(old.publicKey.pemRepresentation), .publicKeyPEM(new.publicKey.pemRepresentation),
        ])
        for signer in [old, new] {
            let token = try await JWTKeyCollection().add(ecdsa: signer).sign(self.claims())
            #expect(try await authenticator.authenticate(self.hello(token)).clientID == "alice")
        }
    }

    @Test("key files: an unreadable path, an empty secret or garbage PEM is a clear configuration error")
    func badKeys() async throws {
        await #expect(throws: JWTConfigurationError.self) { try await JWTAuthenticator(keyFiles: ["/nonexistent/key.pem"]) }
        await #expect(throws: JWTConfigurationError.self) { try await JWTAuthenticator(keys: []) }
        await #expect(throws: JWTConfigurationError.self) { try await JWTAuthenticator(keys: [.hmacSecret(Data())]) }
        await #expect(throws: JWTConfigurationError.self, "shorter than SHA-256's 32 bytes") {
            try await JWTAuthenticator(keys: [.hmacSecret(Data("short".utf8))])
        }
        await #expect(throws: JWTConfigurationError.self) {
            try await JWTAuthenticator(keys: [.publicKeyPEM("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----")])
        }
        await #expect(throws: JWTConfigurationError.self) { try await JWTAuthenticator(keys: [.jwks("{\"keys\": [{\"kty\": \"XX\"}]}")]) }
    }

    static func openssl(_ arguments: [String]) async throws {
        let completed = try await SpawnedProgram.run(["openssl"] + arguments)
        guard completed.termination.succeeded else {
            throw CocoaError(
                .fileWriteUnknown,
                userInfo: [NSLocalizedDescriptionKey: "openssl \(completed.termination): \(completed.output)"]
            )
        }
    }
}
