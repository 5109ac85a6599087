import Foundation
import JWTKit
import NIOConcurrencyHelpers
import NIOCore
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherTestSupport
import TetherTesting

@testable import TetherJWT

extension IntegrationTests {
    /// A gateway protected by the JWT authenticator, against clients with good, bad, expired
    /// and foreign tokens.
    @Suite("Authentication", .timeLimit(.minutes(1)))
    struct AuthenticationTests {
        static let secret = "the test gateway's HS256 secret, 32+ bytes"

        static func token(
            for subject: String,
            expiresIn: TimeInterval = 3600,
            secret: String = Self.secret,
            rooms: [String]? = nil,
            topics: [String]? = nil
        ) async throws -> String {
            try await JWTKeyCollection().add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
                .sign(
                    TetherClaims(
                        sub: SubjectClaim(value: subject),
                        exp: ExpirationClaim(value: Date() + expiresIn),
                        rooms: rooms,
                        topics: topics
                    )
                )
        }

        /// A JWT gateway with `whoami`, `echo`, `admin.reset` and `room.join` (answers whether
        /// the join was allowed), a `chat.send` message handler, and a hook that lets only
        /// "root" call `admin.` methods.
        func gateway(
            _ harness: Harness,
            messageStore: (any MessageStore)? = nil,
            configure: @escaping (inout GatewayConfiguration) -> Void = { _ in }
        ) async throws -> (Gateway, Endpoint) {
            let authenticator = try await JWTAuthenticator(keys: [.hmacSecret(Data(Self.secret.utf8))])
            return try await harness.gateway(messageStore: messageStore, configure: configure, authenticator: authenticator) { gateway in
                gateway.handle("whoami") { _, context in ByteBuffer(string: context.connection.identity?.clientID ?? "nobody") }
                gateway.handleInline("echo") { request, _ in request.body }
                gateway.handle("admin.reset") { _, _ in ByteBuffer(string: "reset") }
                gateway.handle("room.join") { request, context in
                    ByteBuffer(string: context.join(String(buffer: request.body)) ? "joined" : "refused")
                }
                gateway.onMessage("chat.send") { _, _ in }
                gateway.authorize { access, connection in
                    if case .request(let method) = access, method.hasPrefix("admin.") { return connection.clientID == "root" }
                    return true
                }
            }
        }

        /// Sends HELLO as `clientID` with `token`, and returns the gateway's first answer.
        func hello(
            _ connection: RawConnection,
            as clientID: String,
            token: String?,
            reliable: Bool = false,
            resume: Frame.Hello.Resume? = nil
        ) async throws -> Frame.Payload? {
            try await connection.send(
                .hello(
                    .init(
                        versions: 1...1,
                        features: reliable ? [.checksum, .reliableDelivery] : .checksum,
                        maxBodySize: 1 << 20,
                        clientID: clientID,
                        authToken: token.map { ByteBuffer(string: $0) },
                        resume: resume,
                        outboxEpoch: reliable ? 1 : nil
                    )
                )
            )
            return await connection.next()?.payload
        }

        /// The ERROR a HELLO with `token` claiming `clientID` gets, or `nil` if it is welcomed.
        func refusal(of token: String?, as clientID: String, at endpoint: Endpoint) async throws -> Frame.ErrorReport? {
            let connection = try await RawConnection.connect(to: endpoint)
            defer { connection.close() }
            switch try await self.hello(connection, as: clientID, token: token) {
            case .error(let report): return report
            case .welcome: return nil
            case let other:
                Issue.record("expected WELCOME or ERROR, got \(String(describing: other))")
                return nil
            }
        }

        @Test("missing, badly signed, expired and foreign-subject tokens are refused, each with its status and reason")
        func refusals() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await self.gateway(harness)
                #expect(try await self.refusal(of: try await Self.token(for: "alice"), as: "alice", at: endpoint) == nil)

                let missing = try await self.refusal(of: nil, as: "alice", at: endpoint)
                #expect(missing?.code == .unauthenticated && missing?.message.contains("token is required") == true)
                let forged = try await self.refusal(
                    of: try await Self.token(for: "alice", secret: "somebody else's secret, just as long"),
                    as: "alice",
                    at: endpoint
                )
                #expect(forged?.code == .unauthenticated && forged?.message.contains("bad signature") == true)
                let expired = try await self.refusal(of: try await Self.token(for: "alice", expiresIn: -600), as: "alice", at: endpoint)
                #expect(expired?.code == .unauthenticated && expired?.message.contains("expired") == true)
                let impostor = try await self.refusal(of: try await Self.token(for: "mallory"), as: "alice", at: endpoint)
                #expect(impostor?.code == .permissionDenied)
                #expect(impostor?.message.contains("'mallory'") == true && impostor?.message.contains("'alice'") == true)
            }
        }

        @Test("an impostor cannot read or acknowledge another client's deliveries")
        func impostor() async throws {
            try await withHarness { harness in
                let store = InMemoryMessageStore()
                _ = try await store.commit(
                    processed: [],
                    deliveries: [.init(recipient: "bob", topic: "t", body: ByteBuffer(string: "for bob"))]
                )
                let (_, endpoint) = try await self.gateway(harness, messageStore: store)
                let connection = try await RawConnection.connect(to: endpoint)
                let answer = try await self.hello(
                    connection,
                    as: "bob",
                    token: try await Self.token(for: "mallory"),
                    reliable: true,
                    resume: .init(epoch: store.epoch, lastSequence: 1)  // would acknowledge bob's delivery
                )
                guard case .error(let report)? = answer else {
                    Issue.record("expected ERROR")
                    return
                }
                #expect(report.code == .permissionDenied)
                #expect(await connection.next() == nil, "no DELIVERY follows")
                #expect(try await store.deliveries(for: "bob", after: 0, limit: 10).count == 1, "bob's delivery is still kept for him")
            }
        }

        @Test("a client whose token expires is drained with GOAWAY credentials expired, and connects again with a fresh token")
        func expiry() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await self.gateway(harness) { $0.timeouts.credentialGrace = .milliseconds(200) }
                let issued = NIOLockedValueBox(0)
                let client = try harness.client([endpoint], clientID: "alice") {
                    $0.authentication = .provider {
                        issued.withLockedValue { $0 += 1 }
                        // Expired 29 s ago: still accepted within the authenticator's 30 s
                        // leeway, and drained once the 200 ms grace has passed.
                        return ByteBuffer(string: try await Self.token(for: "alice", expiresIn: -29))
                    }
                }
                let events = harness.events(of: client)
                #expect(try await client.request("whoami", body: ByteBuffer()).string == "alice")
                try await eventually("the gateway drained the connection", timeout: .seconds(10)) {
                    events.disconnectReasons.contains { reason in
                        if case .goingAway(let goAway) = reason { goAway.reason == .credentialsExpired } else { false }
                    }
                }
                try await eventually("the client is connected again", timeout: .seconds(10)) { events.connects >= 2 }
                #expect(issued.withLockedValue { $0 } >= 2, "each connection fetched its token")
                #expect(try await client.request("whoami", body: ByteBuffer()).string == "alice")
            }
        }

        @Test("the token's rooms and topics, and the gateway's hook, decide what a client may do")
        func authorization() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await self.gateway(harness)
                let aliceToken = try await Self.token(for: "alice", rooms: ["lobby"], topics: ["whoami", "room.join", "admin.reset"])
                let restricted = try harness.client([endpoint], clientID: "alice") {
                    $0.authentication = .token(ByteBuffer(string: aliceToken))
                }
                #expect(try await restricted.request("whoami", body: ByteBuffer()).string == "alice")
                do {
                    _ = try await restricted.request("echo", body: ByteBuffer(string: "x"))
                    Issue.record("echo is not among the token's topics")
                } catch let error as TetherError {
                    #expect(error.status == .permissionDenied && error.message.contains("'echo'"))
                }
                #expect(try await restricted.request("room.join", body: ByteBuffer(string: "lobby")).string == "joined")
                #expect(try await restricted.request("room.join", body: ByteBuffer(string: "vip")).string == "refused")
                do {
                    _ = try await restricted.request("admin.reset", body: ByteBuffer())
                    Issue.record("the hook lets only root call admin methods")
                } catch let error as TetherError {
                    #expect(error.status == .permissionDenied)
                }

                let rootToken = try await Self.token(for: "root")
                let root = try harness.client([endpoint], clientID: "root") { $0.authentication = .token(ByteBuffer(string: rootToken)) }
                #expect(try await root.request("admin.reset", body: ByteBuffer()).string == "reset")
                #expect(try await root.request("echo", body: ByteBuffer(string: "any")).string == "any", "no topics claim: every method")
                #expect(try await root.request("room.join", body: ByteBuffer(string: "vip")).string == "joined")
            }
        }

        @Test("a reliable message on a topic the token does not allow is refused for good with permission denied")
        func messageTopics() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await self.gateway(harness, messageStore: InMemoryMessageStore())
                let connection = try await RawConnection.connect(to: endpoint)
                defer { connection.close() }
                let token = try await Self.token(for: "alice", topics: ["whoami"])
                guard case .welcome? = try await self.hello(connection, as: "alice", token: token, reliable: true) else {
                    Issue.record("expected WELCOME")
                    return
                }
                try await connection.send(
                    .message(.init(id: 1, topic: "chat.send", conversation: "c", sequence: 1, body: ByteBuffer(string: "hi")))
                )
                #expect(await connection.nextMessageAck() == [.init(id: 1, status: .permissionDenied)])
            }
        }

        /// Accepts tokens that start with "good", as the client id they claim, for ever; records
        /// every token it sees.
        struct RecordingAuthenticator: ClientAuthenticator {
            let seen = NIOLockedValueBox<[String]>([])
            func authenticate(_ hello: HandshakeInfo) async throws -> ClientIdentity {
                let token = hello.authToken.map { String(buffer: $0) } ?? ""
                self.seen.withLockedValue { $0.append(token) }
                guard token.hasPrefix("good") else { throw AuthenticationError(.unauthenticated, "not a good token: \(token)") }
                return ClientIdentity(clientID: hello.clientID, attributes: ["token": token])
            }
        }

        @Test("on virtual time: 80 % into its token's validity the client sends a fresh one on the open connection; no reconnect")
        func refreshOnVirtualTime() async throws {
            try await withHarness { harness in
                let authenticator = RecordingAuthenticator()
                let (_, endpoint) = try await harness.gateway(authenticator: authenticator) { gateway in
                    gateway.handle("token") { _, context in ByteBuffer(string: context.connection.identity?.attributes["token"] ?? "-") }
                }
                let clock = ManualClock()
                let issued = NIOLockedValueBox(0)
                let client = try harness.client([endpoint], clientID: "alice", clock: clock) {
                    $0.authentication = .expiring {
                        let number = issued.withLockedValue {
                            $0 += 1; return $0
                        }
                        return .init(token: number == 3 ? "bad-\(number)" : "good-\(number)", validFor: .seconds(100))
                    }
                }
                let events = harness.events(of: client)
                #expect(try await client.request("token", body: ByteBuffer()).string == "good-1")

                await clock.waitForSleepers(1)
                clock.advance(by: .seconds(79))
                try await Task.sleep(for: .milliseconds(100))
                #expect(authenticator.seen.withLockedValue { $0 } == ["good-1"], "not before 80 s")
                clock.advance(by: .seconds(1))
                try await eventually("the gateway checked the fresh token") { authenticator.seen.withLockedValue { $0.count } == 2 }
                try await eventually("the connection has the fresh token's identity") {
                    (try? await client.request("token", body: ByteBuffer()).string) == "good-2"
                }

                // The next refresh is refused: the connection keeps its credentials, the client
                // tries again after a tenth of the validity.
                await clock.waitForSleepers(1)
                clock.advance(by: .seconds(80))
                try await eventually("the refused token was checked") { authenticator.seen.withLockedValue { $0.count } == 3 }
                await clock.waitForSleepers(1)
                clock.advance(by: .seconds(10))
                try await eventually("a good one follows") { authenticator.seen.withLockedValue { $0.last } == "good-4" }
                try await eventually("and replaces it") { (try? await client.request("token", body: ByteBuffer()).string) == "good-4" }
                #expect(events.connects == 1, "all on the one connection")
                #expect(authenticator.seen.withLockedValue { $0 } == ["good-1", "good-2", "bad-3", "good-4"])
            }
        }

        @Test("with JWTs: a refreshed token moves the connection's expiry, so it is not drained")
        func refreshKeepsTheConnection() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await self.gateway(harness) { $0.timeouts.credentialGrace = .milliseconds(300) }
                let issued = NIOLockedValueBox(0)
                let client = try harness.client([endpoint], clientID: "alice") {
                    $0.authentication = .expiring {
                        // The first token is past its expiry (accepted within the 30 s leeway,
                        // drained after the 300 ms grace); the refresh, at 80 ms, brings a good one.
                        let first = issued.withLockedValue {
                            $0 += 1; return $0 == 1
                        }
                        let token = try await Self.token(for: "alice", expiresIn: first ? -29 : 3600)
                        return .init(token: token, validFor: first ? .milliseconds(100) : .seconds(3600))
                    }
                }
                let events = harness.events(of: client)
                #expect(try await client.request("whoami", body: ByteBuffer()).string == "alice")
                try await Task.sleep(for: .seconds(1))
                #expect(issued.withLockedValue { $0 } == 2)
                #expect(events.disconnectReasons.isEmpty, "not drained: \(events.disconnectReasons)")
                #expect(events.connects == 1)
                #expect(try await client.request("whoami", body: ByteBuffer()).string == "alice")
            }
        }

        @Test("a refresh with another client's token is refused with permission denied; the connection stays")
        func refreshWithForeignToken() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await self.gateway(harness)
                let connection = try await RawConnection.connect(to: endpoint)
                defer { connection.close() }
                guard case .welcome? = try await self.hello(connection, as: "alice", token: try await Self.token(for: "alice")) else {
                    Issue.record("expected WELCOME")
                    return
                }
                try await connection.send(
                    .request(.init(id: 1, method: "$auth", body: ByteBuffer(string: try await Self.token(for: "bob"))))
                )
                guard case .response(let refused)? = await connection.next()?.payload else {
                    Issue.record("expected RESPONSE")
                    return
                }
                #expect(refused.status == .permissionDenied)
                try await connection.send(.request(.init(id: 2, method: "whoami")))
                guard case .response(let answer)? = await connection.next()?.payload else {
                    Issue.record("expected RESPONSE")
                    return
                }
                #expect(answer.status == .ok && answer.body.string == "alice")
            }
        }
    }
}
