import Crypto
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2Posix
import NIOConcurrencyHelpers
import NIOCore
import NIOFoundationCompat
import Testing
import Tether
import TetherBackendProxy
import TetherCore
import TetherGRPCProtos
import TetherGateway
import TetherServerAPI
import TetherTestSupport

/// The package's root, for the protos and their recorded digest.
private let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

extension Harness {
    /// A gRPC client of `port` on loopback whose connections run until the harness ends.
    func grpcClient(port: Int) throws -> GRPCClient<HTTP2ClientTransport.Posix> {
        let client = GRPCClient(
            transport: try HTTP2ClientTransport.Posix(target: .ipv4(address: "127.0.0.1", port: port), transportSecurity: .plaintext)
        )
        let task = Task { try await client.runConnections() }
        self.onExit {
            client.beginGracefulShutdown()
            task.cancel()
        }
        return client
    }
}

extension IntegrationTests {
    @Suite("gRPC: the server API and the event proxy", .timeLimit(.minutes(3)))
    struct GRPCTests {
        static let keys = ["first-key-0123456789", "second-key-0123456789"]

        static func metadata(_ key: String?) -> Metadata {
            var metadata = Metadata()
            if let key { metadata.addString("Bearer \(key)", forKey: "authorization") }
            return metadata
        }

        /// The status code of what `body` threw, or nil when it did not throw an RPCError.
        static func code(_ body: () async throws -> Void) async -> (RPCError.Code, String)? {
            do {
                try await body()
                return nil
            } catch let error as RPCError {
                return (error.code, error.message)
            } catch {
                return nil
            }
        }

        @Test("the generated code is the protos': scripts/generate-grpc ran after the last change to Protos/")
        func generatedFromTheProtos() throws {
            let recorded = try String(contentsOf: packageRoot.appendingPathComponent("Protos/generated.sha256"), encoding: .utf8)
            var lines: [String] = []
            for name in ["backend.proto", "server_api.proto"] {
                let data = try Data(contentsOf: packageRoot.appendingPathComponent("Protos/tether/v1/\(name)"))
                lines.append(SHA256.hash(data: data).map { String(format: "%02x", $0) }.joined() + "  tether/v1/\(name)")
            }
            #expect(recorded.split(separator: "\n").map(String.init) == lines, "run scripts/generate-grpc")
        }

        @Test("the gRPC server API: the same calls, checks and refusals as the JSON one, with its keys")
        func serverAPI() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(messageStore: InMemoryMessageStore()) { configuration in
                    configuration.channels = try! .init(rules: [
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: 100, maxAge: .seconds(60)), presence: true)
                    ])
                }
                let service = ServerAPIService(
                    gateway: gateway,
                    configuration: try ServerAPIConfiguration(port: 0, grpcPort: 0, keys: Self.keys, maxBodyBytes: 64 << 10),
                    logger: testLogger("api")
                )
                let task = Task { try await service.run() }
                harness.onExit { task.cancel() }
                let port = try await service.grpcListeningPort()
                let api = Tether_V1_ServerAPI.Client(wrapping: try harness.grpcClient(port: port))
                let key = Self.metadata(Self.keys[0])

                let alice = try harness.client([endpoint], clientID: "alice") {
                    $0.reliability = try! ClientConfiguration.Reliability(outbox: InMemoryOutboxStore())
                }
                let pushes = PushCollector(alice, in: harness)
                let deliveries = DeliveryCollector(alice, in: harness)
                let reader = ClientChannelTests.Reader(alice.subscribe("news"), in: harness)
                try await eventually("alice is subscribed") { reader.subscriptions.count == 1 }

                // Keys: none, a wrong one, then either of the two (rotation).
                let publication = Tether_V1_Publication.with {
                    $0.channel = "news"
                    $0.data = Data("hello".utf8)
                    $0.publisher = "shop"
                }
                let noKey = await Self.code { _ = try await api.publish(publication) }
                #expect(noKey?.0 == .unauthenticated)
                let wrongKey = await Self.code { _ = try await api.publish(publication, metadata: Self.metadata("not-a-key-0123456789")) }
                #expect(wrongKey?.0 == .unauthenticated)
                let published = try await api.publish(publication, metadata: key)
                #expect(published.hasPosition && published.position.offset == 1)
                let pushed = try await api.publish(
                    .with {
                        $0.client = "alice"
                        $0.topic = "note"
                        $0.data = Data([0, 1, 2])
                    },
                    metadata: Self.metadata(Self.keys[1])
                )
                #expect(pushed.delivered == 1)
                try await eventually("alice has both") { reader.bodies == ["hello"] && pushes.bodies.count == 1 }

                // A batch: every publication checked before any is sent.
                let good = Tether_V1_Publication.with {
                    $0.client = "alice"
                    $0.topic = "t"
                    $0.data = Data("1".utf8)
                }
                let noTopic = Tether_V1_Publication.with {
                    $0.client = "alice"
                    $0.data = Data("2".utf8)
                }
                let refusedBatch = await Self.code {
                    _ = try await api.publishBatch(.with { $0.publications = [good, noTopic] }, metadata: key)
                }
                #expect(refusedBatch?.0 == .invalidArgument && refusedBatch?.1.contains("publications[1]: a push needs a topic") == true)
                let batch = try await api.publishBatch(
                    .with {
                        $0.publications = [
                            good,
                            .with {
                                $0.channel = "news"
                                $0.data = Data("2".utf8)
                            },
                        ]
                    },
                    metadata: key
                )
                #expect(batch.results.count == 2 && batch.results[1].result.position.offset == 2)
                try await eventually("alice has the batch") { pushes.bodies.count == 2 && reader.bodies == ["hello", "2"] }

                // A reliable message, once per key.
                let message = Tether_V1_SendMessageRequest.with {
                    $0.client = "alice"
                    $0.topic = "invoice"
                    $0.data = Data("42".utf8)
                    $0.idempotencyKey = "invoice-42"
                }
                let sent = try await api.sendMessage(message, metadata: key)
                #expect(!sent.duplicate && sent.sequence == 1)
                let again = try await api.sendMessage(message, metadata: key)
                #expect(again.duplicate)
                try await eventually("alice has the message once") { deliveries.bodies == ["42"] }

                // Queries.
                let history = try await api.channelHistory(.with { $0.channel = "news" }, metadata: key)
                #expect(history.publications.map { String(decoding: $0.data, as: UTF8.self) } == ["hello", "2"])
                #expect(history.publications.first?.publisher == "shop")
                let after = try await api.channelHistory(
                    .with {
                        $0.channel = "news"
                        $0.after = .with {
                            $0.epoch = history.epoch
                            $0.offset = 1
                        }
                    },
                    metadata: key
                )
                #expect(after.publications.count == 1 && !after.gap)
                let presence = try await api.channelPresence(.with { $0.channel = "news" }, metadata: key)
                #expect(presence.total == 1 && presence.members.first?.client == "alice")
                let connections = try await api.clientConnections(.with { $0.client = "alice" }, metadata: key)
                #expect(connections.connections.count == 1)
                let room = try await api.roomMembers(.with { $0.room = "lobby" }, metadata: key)
                #expect(room.connections.isEmpty)

                // Refusals, each with its status and message, and nothing published.
                let refusals: [(String, () async throws -> Void, RPCError.Code, String)] = [
                    (
                        "no target", { _ = try await api.publish(.with { $0.data = Data("x".utf8) }, metadata: key) }, .invalidArgument,
                        "one target"
                    ),
                    (
                        "everyone false",
                        {
                            _ = try await api.publish(
                                .with {
                                    $0.everyone = false
                                    $0.topic = "t"
                                },
                                metadata: key
                            )
                        }, .invalidArgument, "everyone"
                    ),
                    (
                        "a topic on a channel",
                        {
                            _ = try await api.publish(
                                .with {
                                    $0.channel = "news"
                                    $0.topic = "t"
                                },
                                metadata: key
                            )
                        }, .invalidArgument, "no topic"
                    ),
                    ("an empty batch", { _ = try await api.publishBatch(.init(), metadata: key) }, .invalidArgument, "1 to 1000"),
                    (
                        "no idempotency key",
                        {
                            _ = try await api.sendMessage(
                                .with {
                                    $0.client = "alice"
                                    $0.topic = "t"
                                },
                                metadata: key
                            )
                        }, .invalidArgument, "Idempotency-Key"
                    ),
                    (
                        "a limit too large",
                        {
                            _ = try await api.channelHistory(
                                .with {
                                    $0.channel = "news"
                                    $0.limit = 5_000
                                },
                                metadata: key
                            )
                        }, .invalidArgument, "limit"
                    ),
                    ("no client id", { _ = try await api.clientConnections(.init(), metadata: key) }, .invalidArgument, "client id"),
                    (
                        "an expiry before 1970",
                        {
                            _ = try await api.refreshClient(
                                .with {
                                    $0.client = "alice"
                                    $0.expiresAt = -5
                                },
                                metadata: key
                            )
                        }, .invalidArgument, "expires_at"
                    ),
                    (
                        "too large",
                        {
                            _ = try await api.publish(
                                .with {
                                    $0.channel = "news"
                                    $0.data = Data(repeating: 120, count: 70_000)
                                },
                                metadata: key
                            )
                        }, .resourceExhausted, "larger than"
                    ),
                ]
                for (name, call, expected, fragment) in refusals {
                    let refused = await Self.code(call)
                    #expect(refused?.0 == expected, "\(name): \(String(describing: refused))")
                    #expect(refused?.1.contains(fragment) == true, "\(name): \(String(describing: refused))")
                }
                let stillTwo = try await api.channelHistory(.with { $0.channel = "news" }, metadata: key)
                #expect(stillTwo.publications.count == 2, "a refused call published nothing")
                #expect(pushes.bodies.count == 2)

                // Credentials: refreshed far off (nothing happens), then ended: GOAWAY
                // `credentials expired`, and alice connects again.
                let events = harness.events(of: alice)
                let refreshed = try await api.refreshClient(
                    .with {
                        $0.client = "alice"
                        $0.expiresAt = Int64(Date().timeIntervalSince1970) + 3600
                    },
                    metadata: key
                )
                #expect(refreshed.connections == 1)
                let expired = try await api.expireClient(
                    .with {
                        $0.client = "alice"
                        $0.message = "log in again"
                    },
                    metadata: key
                )
                #expect(expired.connections == 1)
                try await eventually("alice's credentials ended, and she is back") {
                    events.all.contains {
                        if case .disconnected(.goingAway(let goAway)) = $0 {
                            goAway.reason == .credentialsExpired && goAway.message == "log in again"
                        } else {
                            false
                        }
                    } && events.connects == 2 && gateway.connections(of: "alice").count == 1
                }

                // Disconnect: revoked, and alice stops connecting.
                let disconnected = try await api.disconnectClient(
                    .with {
                        $0.client = "alice"
                        $0.message = "banned"
                    },
                    metadata: key
                )
                #expect(disconnected.disconnected == 1)
                try await eventually("alice stops connecting: her access was revoked") {
                    events.all.contains { if case .failed(let error) = $0 { error.message.contains("banned") } else { false } }
                }
            }
        }

        /// A backend written with the generated service: users by token, `order.*` answered,
        /// `chat.*` messages processed once by key (the first call of two of them fails, to be
        /// retried).
        final class SwiftBackend: Tether_V1_Backend.SimpleServiceProtocol {
            struct State {
                var processed: [String: Int] = [:]
                var calls: [String: Int] = [:]
                var requests: [Tether_V1_RequestEvent] = []
                var authorization: [String] = []
                var cancelled = 0
                var disconnects: [Tether_V1_DisconnectEvent] = []
                var largestBatch = 0
            }

            let state = NIOLockedValueBox(State())

            func connect(request: Tether_V1_ConnectEvent, context: ServerContext) async throws -> Tether_V1_Identity {
                let token = String(decoding: request.token, as: UTF8.self)
                switch token {
                case "alice-token":
                    return .with {
                        $0.client = "alice"
                        $0.info = "Alice"
                        $0.topics = .with { $0.names = ["order.create", "order.reject", "order.slow", "order.nothing", "chat.room"] }
                        $0.attributes = ["role": "buyer"]
                    }
                case "banned-token":
                    throw RPCError(code: .permissionDenied, message: "alice is banned")
                default:
                    throw RPCError(code: .unauthenticated, message: "unknown token")
                }
            }

            func request(request: Tether_V1_RequestEvent, context: ServerContext) async throws -> Tether_V1_RequestReply {
                self.state.withLockedValue { $0.requests.append(request) }
                switch request.method {
                case "order.create":
                    return .with { $0.data = Data("order for \(request.client): ".utf8) + request.data }
                case "order.reject":
                    var metadata = Metadata()
                    metadata.addString("1001", forKey: "tether-status")
                    throw RPCError(code: .failedPrecondition, message: "out of stock", metadata: metadata)
                case "order.slow":
                    // gRPC tells a handler its call is over (the deadline passed, the caller
                    // cancelled) through the context's handle, not by cancelling its task.
                    for _ in 0..<300 where !context.cancellation.isCancelled {
                        try await Task.sleep(for: .milliseconds(10))
                    }
                    if context.cancellation.isCancelled { self.state.withLockedValue { $0.cancelled += 1 } }
                    throw RPCError(code: .cancelled, message: "the caller went away")
                default:
                    throw RPCError(code: .notFound, message: "no such order method")
                }
            }

            func authorize(request: Tether_V1_AuthorizeEvent, context: ServerContext) async throws -> Tether_V1_AuthorizeReply {
                if request.channel.hasPrefix("secret.") {
                    throw RPCError(code: .permissionDenied, message: "no secrets for \(request.client)")
                }
                return .init()
            }

            func disconnect(request: Tether_V1_DisconnectEvent, context: ServerContext) async throws -> Tether_V1_DisconnectReply {
                self.state.withLockedValue { $0.disconnects.append(request) }
                return .init()
            }

            func message(request: Tether_V1_MessageEvent, context: ServerContext) async throws -> Tether_V1_MessageReply {
                if let error = self.process(request) { throw error }
                return .init()
            }

            func messages(request: Tether_V1_MessageBatch, context: ServerContext) async throws -> Tether_V1_MessageResults {
                self.state.withLockedValue { $0.largestBatch = max($0.largestBatch, request.messages.count) }
                return .with {
                    $0.results = request.messages.map { message in
                        guard let error = self.process(message) else { return .init() }
                        return .with { result in
                            result.code = Int32(error.code.rawValue)
                            result.message = error.message
                            if let status = error.metadata[stringValues: "tether-status"].first(where: { _ in true }) {
                                result.tetherStatus = UInt32(status) ?? 0
                            }
                        }
                    }
                }
            }

            /// A message processed once by its key, or why not.
            private func process(_ request: Tether_V1_MessageEvent) -> RPCError? {
                let text = String(decoding: request.data, as: UTF8.self)
                if text == "refuse me" { return RPCError(code: .invalidArgument, message: "not a chat message") }
                if text == "refuse with 1002" {
                    var metadata = Metadata()
                    metadata.addString("1002", forKey: "tether-status")
                    return RPCError(code: .failedPrecondition, message: "closed for the night", metadata: metadata)
                }
                let calls = self.state.withLockedValue { state in
                    state.calls[request.idempotencyKey, default: 0] += 1
                    return state.calls[request.idempotencyKey]!
                }
                // The first call of the 50th message of each conversation fails: it must come
                // again, with the same key.
                if calls == 1 && request.sequence == 50 { return RPCError(code: .unavailable, message: "try again") }
                self.state.withLockedValue { $0.processed[request.idempotencyKey, default: 0] += 1 }
                return nil
            }
        }

        /// Records the `authorization` metadata of every call to the backend.
        struct AuthorizationRecorder: ServerInterceptor {
            let backend: SwiftBackend

            func intercept<Input: Sendable, Output: Sendable>(
                request: StreamingServerRequest<Input>,
                context: ServerContext,
                next: @Sendable (StreamingServerRequest<Input>, ServerContext) async throws -> StreamingServerResponse<Output>
            ) async throws -> StreamingServerResponse<Output> {
                let values = request.metadata[stringValues: "authorization"].map { String($0) }
                self.backend.state.withLockedValue { $0.authorization += values.isEmpty ? ["none"] : values }
                return try await next(request, context)
            }
        }

        @Test(
            "each listener of the server API (JSON, gRPC) holds at most maxConnections: the next connection waits, and is served once one closes"
        )
        func connectionCap() async throws {
            try await withHarness { harness in
                let (gateway, _) = try await harness.gateway(messageStore: InMemoryMessageStore())
                let service = ServerAPIService(
                    gateway: gateway,
                    configuration: try ServerAPIConfiguration(port: 0, grpcPort: 0, keys: Self.keys, maxConnections: 2),
                    logger: testLogger("api")
                )
                let task = Task { try await service.run() }
                harness.onExit { task.cancel() }

                // JSON: two connections served, a third waits until one of them closes.
                let port = try await service.listeningPort()
                let authorization = [("Authorization", "Bearer \(Self.keys[0])")]
                var held: [HTTPPeer] = []
                for _ in 0..<2 {
                    let peer = try await HTTPPeer.connect(port: port)
                    held.append(peer)
                    #expect(try await peer.send(.GET, "/v1/clients/x/connections", headers: authorization).wait().status == .ok)
                }
                let waiting = try await HTTPPeer.connect(port: port)
                defer {
                    waiting.close()
                    for peer in held { peer.close() }
                }
                let exchange = try await waiting.send(.GET, "/v1/clients/x/connections", headers: authorization)
                try await Task.sleep(for: .milliseconds(500))
                #expect(exchange.response == nil, "a third connection is not served while two are open")
                #expect(try await held[0].send(.GET, "/v1/clients/x/connections", headers: authorization).wait().status == .ok)
                held[1].close()
                #expect(try await exchange.wait(timeout: .seconds(5)).status == .ok, "it is served once one closed")

                // gRPC: the same with three clients (a client holds one connection).
                let grpcPort = try await service.grpcListeningPort()
                let key = Self.metadata(Self.keys[0])
                // One at a time: each client connects when made.
                var clients: [(GRPCClient<HTTP2ClientTransport.Posix>, Task<Void, any Error>)] = []
                defer {
                    for (client, task) in clients {
                        client.beginGracefulShutdown()
                        task.cancel()
                    }
                }
                /// nil once answered, or the call's error code.
                @Sendable func call(_ client: GRPCClient<HTTP2ClientTransport.Posix>, timeout: Duration) async -> RPCError.Code? {
                    var options = CallOptions.defaults
                    options.timeout = timeout
                    let api = Tether_V1_ServerAPI.Client(wrapping: client)
                    return await Self.code {
                        _ = try await api.clientConnections(.with { $0.client = "x" }, metadata: key, options: options)
                    }?
                    .0
                }
                var answers: [RPCError.Code?] = []
                for index in 0..<3 {
                    let client = GRPCClient(
                        transport: try HTTP2ClientTransport.Posix(
                            target: .ipv4(address: "127.0.0.1", port: grpcPort),
                            transportSecurity: .plaintext
                        )
                    )
                    clients.append((client, Task { try await client.runConnections() }))
                    answers.append(await call(client, timeout: index < 2 ? .seconds(5) : .milliseconds(500)))
                }
                #expect(answers[0] == nil && answers[1] == nil, "\(answers)")
                #expect(answers[2] != nil, "a third connection is not served while two are open")
                #expect(await call(clients[0].0, timeout: .seconds(5)) == nil, "those within the cap are")
                clients[1].0.beginGracefulShutdown()
                let third = clients[2].0
                try await eventually("the third client is served once one closed", timeout: .seconds(10)) {
                    await call(third, timeout: .seconds(1)) == nil
                }
            }
        }

        @Test("the gRPC event proxy: connects, requests (statuses, deadlines) and reliable messages once each")
        func proxy() async throws {
            try await withHarness { harness in
                let backend = SwiftBackend()
                let server = GRPCServer(
                    transport: .http2NIOPosix(address: .ipv4(host: "127.0.0.1", port: 0), transportSecurity: .plaintext),
                    services: [backend],
                    interceptors: [AuthorizationRecorder(backend: backend)]
                )
                let serving = Task { try await server.serve() }
                harness.onExit {
                    server.beginGracefulShutdown()
                    serving.cancel()
                }
                guard let port = try await server.listeningAddress?.ipv4?.port else {
                    Issue.record("the backend does not listen")
                    return
                }
                let proxy = try BackendProxy(
                    configuration: try BackendConfiguration(
                        url: "grpc://127.0.0.1:\(port)",
                        connect: true,
                        disconnect: true,
                        channels: ["*"],
                        requests: ["order.*"],
                        messages: ["chat.*"],
                        timeout: .seconds(2),
                        authorization: "Bearer gateway-secret",
                        breaker: .init(failures: 1_000, openFor: .seconds(1))
                    ),
                    logger: testLogger("backend")
                )
                let running = Task { try await proxy.run() }
                harness.onExit { running.cancel() }
                let (gateway, endpoint) = try await harness.gateway(
                    messageStore: InMemoryMessageStore(),
                    configure: { $0.channels = try! .init(rules: [.init(pattern: .all, history: nil)]) },
                    authenticator: proxy
                ) {
                    proxy.install(on: $0)
                }

                // connect
                let identity = try await proxy.authenticate(
                    HandshakeInfo(clientID: "alice", authToken: ByteBuffer(string: "alice-token"), userAgent: nil, remoteAddress: nil)
                )
                #expect(identity.clientID == "alice" && identity.info == "Alice" && identity.attributes == ["role": "buyer"])
                #expect(identity.topics?.contains("chat.room") == true && identity.rooms == nil)
                await #expect(throws: AuthenticationError(.unauthenticated, "unknown token")) {
                    try await proxy.authenticate(
                        HandshakeInfo(clientID: "alice", authToken: ByteBuffer(string: "x"), userAgent: nil, remoteAddress: nil)
                    )
                }
                await #expect(throws: AuthenticationError(.permissionDenied, "alice is banned")) {
                    try await proxy.authenticate(
                        HandshakeInfo(clientID: "alice", authToken: ByteBuffer(string: "banned-token"), userAgent: nil, remoteAddress: nil)
                    )
                }
                let authorization = backend.state.withLockedValue { $0.authorization }
                #expect(authorization.count == 3 && authorization.allSatisfy { $0 == "Bearer gateway-secret" }, "\(authorization)")

                // requests
                let alice = try IntegrationTests.BackendTests.client(harness, endpoint, "alice", token: "alice-token")
                let answer = try await alice.request("order.create", body: ByteBuffer(string: "book"), timeout: .seconds(10))
                #expect(answer.string == "order for alice: book")
                let event = backend.state.withLockedValue { $0.requests.last }
                #expect(event?.client == "alice" && event?.method == "order.create")
                await #expect {
                    _ = try await alice.request("order.reject", timeout: .seconds(10))
                } throws: { error in
                    (error as? TetherError)?.status == StatusCode(rawValue: 1001) && (error as? TetherError)?.message == "out of stock"
                }
                // The client's deadline passes: the backend's call is cancelled.
                await #expect(throws: TetherError.self) {
                    _ = try await alice.request("order.slow", timeout: .milliseconds(300))
                }
                try await eventually("the backend's call was cancelled") { backend.state.withLockedValue { $0.cancelled } == 1 }
                await #expect {
                    _ = try await alice.request("order.nothing", timeout: .seconds(10))
                } throws: { error in (error as? TetherError)?.status == .unknownMethod }

                // messages: each processed once, the failed first calls retried with their keys.
                let count = 200
                var receipts: [MessageReceipt] = []
                for index in 0..<count {
                    receipts.append(
                        try await alice.send(
                            "chat.room",
                            body: ByteBuffer(string: "message \(index)"),
                            conversation: index % 2 == 0 ? "a" : "b"
                        )
                    )
                }
                for receipt in receipts {
                    let outcome = await alice.outcome(of: receipt)
                    #expect(outcome == .acknowledged, "\(String(describing: outcome))")
                }
                let state = backend.state.withLockedValue { $0 }
                #expect(state.processed.count == count && state.processed.values.allSatisfy { $0 == 1 })
                #expect(state.calls.values.filter { $0 == 2 }.count == 2, "the two failed messages were sent twice, with their keys")
                let refused = try await alice.send("chat.room", body: ByteBuffer(string: "refuse me"))
                #expect(await alice.outcome(of: refused) == .refused(.invalidRequest))

                // A client the backend refuses never connects.
                let mallory = try IntegrationTests.BackendTests.client(harness, endpoint, "mallory", token: "stolen")
                let malloryEvents = harness.events(of: mallory)
                try await eventually("mallory is refused") {
                    malloryEvents.all.contains {
                        if case .connectFailed(_, let error) = $0 { error.message.contains("unknown token") } else { false }
                    }
                }

                // channel access: asked of the backend.
                let news = ClientChannelTests.Reader(alice.subscribe("news"), in: harness)
                try await eventually("alice is subscribed to news") { news.subscriptions.count == 1 }
                let secret = ClientChannelTests.Reader(alice.subscribe("secret.plans"), in: harness)
                try await eventually("alice is refused secret.plans") { secret.ended }
                #expect((secret.error as? TetherError)?.status == .permissionDenied, "\(String(describing: secret.error))")
                #expect((secret.error as? TetherError)?.message.contains("no secrets for alice") == true)

                // disconnect: one notification, with the reason (the refused client never
                // connected: nothing about it).
                #expect(gateway.disconnect(client: "alice", reconnect: false, message: "banned") == 1)
                try await eventually("the backend heard of alice's disconnect") {
                    backend.state.withLockedValue { $0.disconnects.count } == 1
                }
                let disconnect = backend.state.withLockedValue { $0.disconnects.first }
                #expect(disconnect?.client == "alice" && disconnect?.reason == "goaway_revoked", "\(String(describing: disconnect))")
            }
        }

        @Test("the gRPC batch event: 8 clients' messages several to a call, each processed once, its own outcome")
        func proxyBatches() async throws {
            try await withHarness { harness in
                let backend = SwiftBackend()
                let server = GRPCServer(
                    transport: .http2NIOPosix(address: .ipv4(host: "127.0.0.1", port: 0), transportSecurity: .plaintext),
                    services: [backend]
                )
                let serving = Task { try await server.serve() }
                harness.onExit {
                    server.beginGracefulShutdown()
                    serving.cancel()
                }
                let port = try #require(try await server.listeningAddress?.ipv4?.port)
                let proxy = try BackendProxy(
                    configuration: try BackendConfiguration(
                        url: "grpc://127.0.0.1:\(port)",
                        messages: ["chat.*"],
                        messageBatch: 16,
                        timeout: .seconds(2),
                        breaker: .init(failures: 1_000, openFor: .seconds(1))
                    ),
                    logger: testLogger("backend")
                )
                let running = Task { try await proxy.run() }
                harness.onExit { running.cancel() }
                let (_, endpoint) = try await harness.gateway(messageStore: InMemoryMessageStore(), routes: { proxy.install(on: $0) })
                let senders = try (0..<8).map { index in
                    try harness.client([endpoint], clientID: "sender-\(index)") {
                        $0.reliability = try! ClientConfiguration.Reliability(outbox: InMemoryOutboxStore())
                    }
                }
                let perSender = 100
                let outcomes = try await withThrowingTaskGroup(of: [String: Int].self) { group in
                    for sender in senders {
                        group.addTask {
                            var receipts: [MessageReceipt] = []
                            for number in 0..<perSender {
                                let conversation = number % 2 == 0 ? "a" : "b"
                                receipts.append(
                                    try await sender.send("chat.room", body: ByteBuffer(string: "\(number)"), conversation: conversation)
                                )
                            }
                            var outcomes: [String: Int] = [:]
                            for receipt in receipts {
                                outcomes["\(await sender.outcome(of: receipt).map { "\($0)" } ?? "unknown")", default: 0] += 1
                            }
                            return outcomes
                        }
                    }
                    return try await group.reduce(into: [String: Int]()) { $0.merge($1, uniquingKeysWith: +) }
                }
                let count = senders.count * perSender
                #expect(outcomes == ["acknowledged": count], "\(outcomes)")
                let state = backend.state.withLockedValue { $0 }
                #expect(state.processed.count == count && state.processed.values.allSatisfy { $0 == 1 })
                // Each sender's two conversations reach sequence 50: 16 messages failed once, in
                // their batches, and came again with their keys.
                #expect(state.calls.values.filter { $0 == 2 }.count == 16, "\(state.calls.values.filter { $0 == 2 }.count)")
                #expect(state.largestBatch > 1 && state.largestBatch <= 16, "several lanes' messages in one call: \(state.largestBatch)")

                // Refusals in a batch: each its own status, the others processed.
                let refused = try await senders[0].send("chat.room", body: ByteBuffer(string: "refuse me"))
                let ownStatus = try await senders[1].send("chat.room", body: ByteBuffer(string: "refuse with 1002"))
                let fine = try await senders[2].send("chat.room", body: ByteBuffer(string: "fine"))
                #expect(await senders[0].outcome(of: refused) == .refused(.invalidRequest))
                #expect(await senders[1].outcome(of: ownStatus) == .refused(StatusCode(rawValue: 1002)))
                #expect(await senders[2].outcome(of: fine) == .acknowledged)
            }
        }

        @Test("a grpcs:// backend: over TLS, its certificate checked against the CA file; one an impostor signed is refused")
        func proxyOverTLS() async throws {
            try await withHarness { harness in
                let certificates = TestCertificates.shared
                let authority = try TestCertificates.write(certificates.authority.certificatePEM, name: "grpc-ca.pem")
                let impostorAuthority = try TestCertificates.write(
                    certificates.impostorAuthority.certificatePEM,
                    name: "grpc-impostor-ca.pem"
                )
                /// A backend over TLS with `identity`'s certificate; its port.
                func serve(_ identity: TestCertificates.Identity) async throws -> Int {
                    let server = GRPCServer(
                        transport: .http2NIOPosix(
                            address: .ipv4(host: "127.0.0.1", port: 0),
                            transportSecurity: .tls(
                                certificateChain: [.bytes(Array(identity.certificatePEM.utf8), format: .pem)],
                                privateKey: .bytes(Array(identity.keyPEM.utf8), format: .pem)
                            )
                        ),
                        services: [SwiftBackend()]
                    )
                    let serving = Task { try await server.serve() }
                    harness.onExit {
                        server.beginGracefulShutdown()
                        serving.cancel()
                    }
                    return try #require(try await server.listeningAddress?.ipv4?.port)
                }
                let port = try await serve(certificates.server)
                func proxy(caFile: String, port: Int) throws -> BackendProxy {
                    let proxy = try BackendProxy(
                        configuration: try BackendConfiguration(
                            url: "grpcs://127.0.0.1:\(port)",
                            connect: true,
                            caFile: caFile,
                            timeout: .seconds(2),
                            breaker: .init(failures: 1_000, openFor: .seconds(1))
                        ),
                        logger: testLogger("backend")
                    )
                    let running = Task { try await proxy.run() }
                    harness.onExit { running.cancel() }
                    return proxy
                }
                let hello = HandshakeInfo(
                    clientID: "alice",
                    authToken: ByteBuffer(string: "alice-token"),
                    userAgent: nil,
                    remoteAddress: nil
                )
                let trusted = try proxy(caFile: authority, port: port)
                #expect(try await trusted.authenticate(hello).clientID == "alice", "over TLS, the backend's certificate trusted")

                // Signed by an authority the gateway was not told of: no call reaches the backend.
                let fooled = try proxy(caFile: impostorAuthority, port: port)
                await #expect {
                    _ = try await fooled.authenticate(hello)
                } throws: { error in
                    (error as? AuthenticationError)?.status == .unavailable
                }
                // Signed by the right authority, but a client's (device-42, not 127.0.0.1): refused too.
                let misnamed = try proxy(caFile: authority, port: try await serve(certificates.client))
                await #expect {
                    _ = try await misnamed.authenticate(hello)
                } throws: { error in
                    (error as? AuthenticationError)?.status == .unavailable
                }
                // grpcs:// without the port, a CA file for plaintext, or one that is not there: refused.
                for (url, caFile, fragment) in [
                    ("grpcs://127.0.0.1", nil, "grpcs://HOST:PORT"),
                    ("grpc://127.0.0.1:\(port)", authority, "for a grpcs:// backend"),
                    ("grpcs://127.0.0.1:\(port)", "/nonexistent/ca.pem", "cannot be read"),
                ] {
                    #expect {
                        _ = try BackendConfiguration(url: url, connect: true, caFile: caFile)
                    } throws: { error in
                        (error as? GatewayError)?.message.contains(fragment) == true
                    }
                }
            }
        }

        @Test(
            "a Python peer (grpcio, its stubs generated from Protos/) drives the gRPC API and serves the Backend",
            .requires(.pythonGRPC)
        )
        func pythonPeer() async throws {
            try OutsideTool.pythonGRPC.require()
            try await withHarness { harness in
                let script = packageRoot.appendingPathComponent("Tests/TetherIntegrationTests/Peers/grpc_peer.py").path
                let protos = packageRoot.appendingPathComponent("Protos").path
                let backendPort = try await freePort()
                let backend = try ChildProcess(
                    executable: "/usr/bin/env",
                    ["python3", script, "backend", "--protos", protos, "--port", "\(backendPort)"],
                    in: harness
                )
                try await eventually("the Python backend listens", timeout: .seconds(30)) {
                    backend.lines.contains { $0.contains("backend listening") }
                }
                let proxy = try BackendProxy(
                    configuration: try BackendConfiguration(
                        url: "grpc://127.0.0.1:\(backendPort)",
                        connect: true,
                        disconnect: true,
                        requests: ["py.*"],
                        messages: ["py.*"],
                        timeout: .seconds(5)
                    ),
                    logger: testLogger("backend")
                )
                let running = Task { try await proxy.run() }
                harness.onExit { running.cancel() }
                let (gateway, endpoint) = try await harness.gateway(messageStore: InMemoryMessageStore(), authenticator: proxy) {
                    proxy.install(on: $0)
                }
                let service = ServerAPIService(
                    gateway: gateway,
                    configuration: try ServerAPIConfiguration(port: 0, grpcPort: 0, keys: Self.keys),
                    logger: testLogger("api")
                )
                let serving = Task { try await service.run() }
                harness.onExit { serving.cancel() }
                let apiPort = try await service.grpcListeningPort()

                // The Python backend: connect, requests, a reliable message.
                let py = try IntegrationTests.BackendTests.client(harness, endpoint, "py", token: "py-token")
                let pushes = PushCollector(py, in: harness)
                let deliveries = DeliveryCollector(py, in: harness)
                let reversed = try await py.request("py.reverse", body: ByteBuffer(string: "abc"), timeout: .seconds(10))
                #expect(reversed.string == "cba")
                await #expect {
                    _ = try await py.request("py.refuse", timeout: .seconds(10))
                } throws: { error in
                    (error as? TetherError)?.status == StatusCode(rawValue: 1001) && (error as? TetherError)?.message == "refused in Python"
                }
                let receipt = try await py.send("py.note", body: ByteBuffer(string: "hi"))
                #expect(await py.outcome(of: receipt) == .acknowledged)
                #expect(backend.lines.contains { $0.contains(#""event": "message""#) && $0.contains(#""first": true"#) })

                // The Python caller of the API.
                let caller = try ChildProcess(
                    executable: "/usr/bin/env",
                    ["python3", script, "api", "--protos", protos, "--port", "\(apiPort)", "--key", Self.keys[1]],
                    in: harness
                )
                #expect(try await caller.exitStatus() == 0, "\(caller.lines)")
                let output = caller.lines.last { $0.hasPrefix("{") } ?? "{}"
                let results = try JSONSerialization.jsonObject(with: Data(output.utf8)) as? [String: [String: Any]] ?? [:]
                #expect(results["publish"]?["delivered"] as? Int == 1, "\(output)")
                #expect(results["message"]?["sequence"] as? Int == 1 && results["message"]?["duplicate"] as? Bool == false, "\(output)")
                #expect(results["message again"]?["duplicate"] as? Bool == true, "\(output)")
                #expect(results["connections"]?["count"] as? Int == 1, "\(output)")
                #expect(results["no target"]?["code"] as? String == "INVALID_ARGUMENT", "\(output)")
                #expect(results["no key"]?["code"] as? String == "UNAUTHENTICATED", "\(output)")
                try await eventually("py has the push and the message, once") {
                    pushes.bodies == ["from python"] && deliveries.bodies == ["7"]
                }

                // The disconnect notification reaches Python.
                #expect(gateway.disconnect(client: "py", reconnect: false) == 1)
                try await eventually("the Python backend heard of the disconnect") {
                    backend.lines.contains { $0.contains(#""event": "disconnect""#) && $0.contains("goaway_revoked") }
                }
            }
        }
    }
}
