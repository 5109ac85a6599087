import AsyncHTTPClient
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
import Testing
import Tether
import TetherBackendProxy
import TetherCore
import TetherGateway
import TetherPostgres
import TetherServerAPI
import TetherTestSupport

/// The package's root, for the files tests read (the OpenAPI document, the Python backend).
private let packageRoot = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
    .deletingLastPathComponent()

/// Calls the server API as a backend would, with AsyncHTTPClient and JSON.
struct APICaller {
    var port: Int
    var key: String?

    struct Reply {
        var status: Int
        var headers: [String: String]
        var json: [String: Any]
    }

    func call(
        _ method: HTTPMethod = .POST,
        _ path: String,
        body: String? = nil,
        bytes: ByteBuffer? = nil,
        headers: [String: String] = [:]
    ) async throws -> Reply {
        var request = HTTPClientRequest(url: "http://127.0.0.1:\(self.port)\(path)")
        request.method = method
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let key { request.headers.add(name: "Authorization", value: "Bearer \(key)") }
        if let body {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(ByteBuffer(string: body))
        } else if let bytes {
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(bytes)
        }
        let response = try await HTTPClient.shared.execute(request, timeout: .seconds(30))
        let data = Data(buffer: try await response.body.collect(upTo: 8 << 20))
        let json = (try? JSONSerialization.jsonObject(with: data)) as? [String: Any] ?? [:]
        var headers: [String: String] = [:]
        for header in response.headers { headers[header.name.lowercased()] = header.value }
        return Reply(status: Int(response.status.code), headers: headers, json: json)
    }
}

extension Harness {
    /// A server API in front of `gateway` on an ephemeral port; stopped when the harness ends.
    func serverAPI(_ gateway: Gateway, keys: [String], maxBodyBytes: Int = 4 << 20) async throws -> Int {
        let api = ServerAPIService(
            gateway: gateway,
            configuration: try ServerAPIConfiguration(port: 0, keys: keys, maxBodyBytes: maxBodyBytes),
            logger: testLogger("api")
        )
        let task = Task { try await api.run() }
        self.onExit { task.cancel() }
        return try await api.listeningPort()
    }
}

/// The Python backend of `Examples/python-backend`, as a process of its own.
final class PythonBackend: Sendable {
    let port: Int
    let database: String
    private let process: NIOLockedValueBox<ChildProcess?>
    private let harness: Harness

    init(in harness: Harness, environment: [String: String] = [:]) async throws {
        self.port = try await freePort()
        self.database = FileManager.default.temporaryDirectory.appendingPathComponent("tether-backend-\(UUID().uuidString).sqlite").path
        self.harness = harness
        self.process = NIOLockedValueBox(nil)
        let database = self.database
        harness.onExit {
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: database + suffix) }
        }
        try await self.start()
    }

    /// Starts it (again), on the same port and database.
    func start() async throws {
        let script = packageRoot.appendingPathComponent("Examples/python-backend/backend.py").path
        let process = try ChildProcess(
            executable: "/usr/bin/env",
            ["python3", script, "--port", "\(self.port)", "--db", self.database],
            in: self.harness
        )
        self.process.withLockedValue { $0 = process }
        try await eventually("the Python backend listens") { process.lines.contains { $0.hasPrefix("backend listening") } }
    }

    /// SIGKILL: it dies mid-call, without answering.
    func kill() async throws {
        let process = self.process.withLockedValue { $0 }
        process?.kill()
        _ = try await process?.exitStatus()
    }

    var url: String { "http://127.0.0.1:\(self.port)" }

    /// Its `/stats`: what it processed.
    func stats() async throws -> [String: Any] {
        let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: self.url + "/stats"), timeout: .seconds(10))
        let data = Data(buffer: try await response.body.collect(upTo: 1 << 20))
        return try JSONSerialization.jsonObject(with: data) as? [String: Any] ?? [:]
    }
}

extension IntegrationTests {
    @Suite("A backend in any language: the server API and the event proxy", .timeLimit(.minutes(4)))
    struct BackendTests {
        static let keys = ["first-key-0123456789", "second-key-0123456789"]

        @Test("the server API publishes, pushes, answers queries and disconnects; refusals change nothing")
        func serverAPI() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(messageStore: InMemoryMessageStore()) { configuration in
                    configuration.channels = try! .init(rules: [
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: 100, maxAge: .seconds(60)), presence: true)
                    ])
                    configuration.timeouts.credentialGrace = .milliseconds(200)
                }
                let port = try await harness.serverAPI(gateway, keys: Self.keys, maxBodyBytes: 64 << 10)
                let api = APICaller(port: port, key: Self.keys[0])
                let rotated = APICaller(port: port, key: Self.keys[1])
                let alice = try harness.client([endpoint], clientID: "alice")
                let pushes = PushCollector(alice, in: harness)
                let reader = ClientChannelTests.Reader(alice.subscribe("news"), in: harness)
                try await eventually("alice is subscribed") { reader.subscriptions.count == 1 }

                // A channel publication, with either key (rotation).
                let published = try await api.call(.POST, "/v1/publish", body: #"{"channel":"news","data":"hello","publisher":"shop"}"#)
                #expect(published.status == 200)
                #expect(published.json["offset"] as? Int == 1)
                let pushed = try await rotated.call(.POST, "/v1/publish", body: #"{"client":"alice","topic":"note","data_base64":"AAEC"}"#)
                #expect(pushed.status == 200 && pushed.json["delivered"] as? Int == 1)
                try await eventually("alice has both") { reader.bodies == ["hello"] && pushes.bodies.count == 1 }
                #expect(reader.publications.first?.publisher == "shop")

                // A batch: every publication checked before any is sent.
                let refusedBatch = try await api.call(
                    .POST,
                    "/v1/publish/batch",
                    body: #"{"publications":[{"client":"alice","topic":"t","data":"1"},{"client":"alice","data":"no topic"}]}"#
                )
                #expect(refusedBatch.status == 400)
                #expect((refusedBatch.json["message"] as? String)?.contains("publications[1]") == true)
                let batch = try await api.call(
                    .POST,
                    "/v1/publish/batch",
                    body:
                        #"{"publications":[{"client":"alice","topic":"t","data":"1"},{"channel":"news","data":"2"},{"everyone":true,"topic":"t","data":"3"}]}"#
                )
                #expect(batch.status == 200)
                #expect((batch.json["results"] as? [[String: Any]])?.count == 3)
                try await eventually("alice has the batch") { pushes.bodies.count == 3 && reader.bodies == ["hello", "2"] }

                // Queries.
                let history = try await api.call(.GET, "/v1/channels/news/history?limit=10")
                #expect(history.status == 200)
                let publications = history.json["publications"] as? [[String: Any]] ?? []
                #expect(publications.map { $0["data"] as? String } == ["hello", "2"])
                let epoch = history.json["epoch"] as? String ?? ""
                let after = try await api.call(.GET, "/v1/channels/news/history?epoch=\(epoch)&offset=1")
                #expect((after.json["publications"] as? [[String: Any]])?.count == 1)
                let presence = try await api.call(.GET, "/v1/channels/news/presence")
                #expect((presence.json["members"] as? [[String: Any]])?.first?["client"] as? String == "alice")
                let connections = try await api.call(.GET, "/v1/clients/alice/connections")
                #expect((connections.json["connections"] as? [[String: Any]])?.count == 1)
                let nobody = try await api.call(.GET, "/v1/clients/nobody/connections")
                #expect((nobody.json["connections"] as? [[String: Any]])?.isEmpty == true)

                // Refusals: each a 4xx with an Error body, and nothing published.
                let noKey = try await APICaller(port: port, key: nil).call(.POST, "/v1/publish", body: #"{"channel":"news","data":"x"}"#)
                #expect(noKey.status == 401 && noKey.headers["www-authenticate"] == "Bearer")
                #expect(noKey.json["code"] as? String == "unauthorized")
                let wrongKey = try await APICaller(port: port, key: "not-a-key-0123456789").call(
                    .POST,
                    "/v1/publish",
                    body: #"{"channel":"news","data":"x"}"#
                )
                #expect(wrongKey.status == 401)
                for (body, fragment) in [
                    (#"{"channel":"news","data":"x""#, "JSON"),
                    (#"{"channel":"news","data":"x","extra":1}"#, "extra"),
                    (#"{"channel":"news","data":"x","data_base64":"AA=="}"#, "not both"),
                    (#"{"channel":"news","client":"alice","data":"x"}"#, "one target"),
                    (#"{"channel":"news","data_base64":"%%%"}"#, "base64"),
                    (#"{"everyone":false,"topic":"t","data":"x"}"#, "everyone"),
                ] {
                    let refused = try await api.call(.POST, "/v1/publish", body: body)
                    #expect(refused.status == 400, "\(body)")
                    #expect((refused.json["message"] as? String)?.contains(fragment) == true, "\(body): \(refused.json)")
                }
                let oversized = try await api.call(
                    .POST,
                    "/v1/publish",
                    body: #"{"channel":"news","data":""# + String(repeating: "x", count: 70_000) + #""}"#
                )
                #expect(oversized.status == 413 && oversized.json["code"] as? String == "too_large")
                let badLimit = try await api.call(.GET, "/v1/channels/news/history?limit=5000")
                #expect(badLimit.status == 400)
                let stillTwo = try await api.call(.GET, "/v1/channels/news/history")
                #expect((stillTwo.json["publications"] as? [[String: Any]])?.count == 2, "a refused call published nothing")
                #expect(pushes.bodies.count == 3)

                // Disconnect: GOAWAY, and alice is gone.
                let events = harness.events(of: alice)
                let disconnected = try await api.call(
                    .POST,
                    "/v1/clients/alice/disconnect",
                    body: #"{"message":"banned","reconnect":false}"#
                )
                #expect(disconnected.status == 200 && disconnected.json["disconnected"] as? Int == 1)
                try await eventually("alice stops connecting: her access was revoked") {
                    events.all.contains { if case .failed(let error) = $0 { error.message.contains("banned") } else { false } }
                }
                #expect(events.connects == 1)
                try await eventually("the gateway closed alice's connection") { gateway.connections(of: "alice").isEmpty }

                // With reconnect: the client comes back after retry_after_ms.
                let bob = try harness.client([endpoint], clientID: "bob")
                let bobEvents = harness.events(of: bob)
                try await eventually("bob is connected") { bobEvents.connects == 1 }
                let moved = try await api.call(.POST, "/v1/clients/bob/disconnect", body: #"{"reconnect":true,"retry_after_ms":50}"#)
                #expect(moved.json["disconnected"] as? Int == 1)
                try await eventually("bob is back") { bobEvents.connects == 2 }

                // Credentials: refresh sets their expiry, a later refresh moves it, expire ends
                // them now; each time they end, the client connects again (with fresh ones).
                let carol = try harness.client([endpoint], clientID: "carol")
                let carolEvents = harness.events(of: carol)
                try await eventually("carol is connected") { carolEvents.connects == 1 }
                @Sendable func expiries() -> [String] {
                    carolEvents.all.compactMap {
                        if case .disconnected(.goingAway(let goAway)) = $0, goAway.reason == .credentialsExpired {
                            goAway.message
                        } else {
                            nil
                        }
                    }
                }
                let now = Int(Date().timeIntervalSince1970)
                let soon = try await api.call(.POST, "/v1/clients/carol/refresh", body: #"{"expires_at":\#(now + 1)}"#)
                #expect(soon.status == 200 && soon.json["connections"] as? Int == 1, "\(soon.json)")
                try await eventually("carol's credentials expired (a second, and the grace)", timeout: .seconds(10)) {
                    expiries().count == 1
                }
                try await eventually("carol is back") { carolEvents.connects == 2 }
                let near = try await rotated.call(.POST, "/v1/clients/carol/refresh", body: #"{"expires_at":\#(now + 1)}"#)
                let far = try await api.call(.POST, "/v1/clients/carol/refresh", body: #"{"expires_at":\#(now + 3600)}"#)
                #expect(near.json["connections"] as? Int == 1 && far.json["connections"] as? Int == 1)
                try await Task.sleep(for: .seconds(2))
                #expect(expiries().count == 1 && carolEvents.connects == 2, "the later refresh extended them")
                let ended = try await api.call(.POST, "/v1/clients/carol/expire", body: #"{"message":"log in again"}"#)
                #expect(ended.status == 200 && ended.json["connections"] as? Int == 1)
                try await eventually("carol's credentials ended now") { expiries().last == "log in again" }
                try await eventually("carol is back again") { carolEvents.connects == 3 }
                let nobodyRefreshed = try await api.call(.POST, "/v1/clients/nobody/refresh", body: #"{"expires_at":\#(now + 60)}"#)
                #expect(nobodyRefreshed.status == 200 && nobodyRefreshed.json["connections"] as? Int == 0)
                for (path, body, fragment) in [
                    ("refresh", #"{"expires_at":0}"#, "expires_at"),
                    ("refresh", #"{}"#, "expires_at"),
                    ("refresh", #"{"expires_at":"soon"}"#, "expires_at"),
                    ("expire", #"{"message":""# + String(repeating: "x", count: 1_001) + #""}"#, "1000"),
                    ("expire", #"{"reason":"x"}"#, "reason"),
                ] {
                    let refused = try await api.call(.POST, "/v1/clients/carol/\(path)", body: body)
                    #expect(refused.status == 400, "\(path) \(body)")
                    #expect((refused.json["message"] as? String)?.contains(fragment) == true, "\(path) \(body): \(refused.json)")
                }
                #expect(expiries().count == 2 && carolEvents.connects == 3, "the refusals changed nothing")
            }
        }

        @Test(
            "POST /v1/messages: stored and delivered once per idempotency key, even for calls made at once",
            arguments: ["memory", "sqlite"]
        )
        func keyedMessages(store: String) async throws {
            try await withHarness { harness in
                let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-keyed-\(UUID().uuidString).sqlite").path
                harness.onExit { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: path + suffix) } }
                let messageStore: any MessageStore = store == "memory" ? InMemoryMessageStore() : try SQLiteMessageStore(path: path)
                let (gateway, endpoint) = try await harness.gateway(messageStore: messageStore)
                let port = try await harness.serverAPI(gateway, keys: Self.keys)
                let api = APICaller(port: port, key: Self.keys[0])
                let bob = try harness.client([endpoint], clientID: "bob") {
                    $0.reliability = try! ClientConfiguration.Reliability(outbox: InMemoryOutboxStore())
                }
                let received = DeliveryCollector(bob, in: harness)

                let first = try await api.call(
                    .POST,
                    "/v1/messages",
                    body: #"{"client":"bob","topic":"order.shipped","data":"42"}"#,
                    headers: ["Idempotency-Key": "order-42"]
                )
                #expect(first.status == 200 && first.json["duplicate"] as? Bool == false && first.json["sequence"] as? Int == 1)
                let again = try await api.call(
                    .POST,
                    "/v1/messages",
                    body: #"{"client":"bob","topic":"order.shipped","data":"42"}"#,
                    headers: ["Idempotency-Key": "order-42"]
                )
                #expect(again.status == 200 && again.json["duplicate"] as? Bool == true && again.json["sequence"] == nil)
                // Ten calls with one new key at once: one stores.
                let duplicates = try await withThrowingTaskGroup(of: Bool.self) { group in
                    for _ in 0..<10 {
                        group.addTask {
                            let reply = try await api.call(
                                .POST,
                                "/v1/messages",
                                body: #"{"client":"bob","topic":"order.shipped","data":"43"}"#,
                                headers: ["Idempotency-Key": "order-43"]
                            )
                            return reply.json["duplicate"] as? Bool ?? false
                        }
                    }
                    return try await group.reduce(into: 0) { $0 += $1 ? 1 : 0 }
                }
                #expect(duplicates == 9)
                // Refusals store nothing.
                let noKey = try await api.call(.POST, "/v1/messages", body: #"{"client":"bob","topic":"t","data":"x"}"#)
                #expect(noKey.status == 400)
                let longKey = try await api.call(
                    .POST,
                    "/v1/messages",
                    body: #"{"client":"bob","topic":"t","data":"x"}"#,
                    headers: ["Idempotency-Key": String(repeating: "k", count: 256)]
                )
                #expect(longKey.status == 400)
                try await eventually("bob has both, once") { received.bodies == ["42", "43"] }
                try await Task.sleep(for: .milliseconds(200))
                #expect(received.bodies == ["42", "43"] && received.violations.isEmpty)
            }
        }

        @Test(
            "keyed messages on PostgreSQL: the same key sent at once through two gateways sharing the store is stored once",
            .requires(.postgresql)
        )
        func keyedMessagesOnPostgres() async throws {
            try OutsideTool.postgresql.require()
            try await TestPostgres.withDatabase { client, _ in
                try await withHarness { harness in
                    let stores = [
                        try await PostgresMessageStore(client: client, logger: testLogger("postgres")),
                        try await PostgresMessageStore(client: client, logger: testLogger("postgres")),
                    ]
                    var gateways: [Gateway] = []
                    for store in stores { gateways.append(try await harness.gateway(messageStore: store).0) }
                    let nodes = gateways
                    for round in 0..<5 {
                        let key = "shipment-\(round)"
                        let results = await withTaskGroup(of: Result<Gateway.KeyedDelivery, GatewayError>.self) { group in
                            for call in 0..<20 {
                                group.addTask {
                                    do throws(GatewayError) {
                                        return .success(
                                            try await nodes[call % 2].deliver(
                                                to: "bob",
                                                topic: "order.shipped",
                                                body: ByteBuffer(string: key),
                                                idempotencyKey: key
                                            )
                                        )
                                    } catch {
                                        return .failure(error)
                                    }
                                }
                            }
                            return await group.reduce(into: []) { $0.append($1) }
                        }
                        let delivered = results.filter { if case .success(.delivered) = $0 { true } else { false } }.count
                        let failed = results.compactMap { if case .failure(let error) = $0 { error } else { nil } }
                        // A call that lost a race on a new key may fail as a whole (a unique index
                        // refused its group): a storage error, never a second delivery.
                        #expect(delivered <= 1 && failed.allSatisfy { $0.code == .storage }, "\(results)")
                        // Retried, every call now finds the key.
                        let retried = try await nodes[0].deliver(
                            to: "bob",
                            topic: "order.shipped",
                            body: ByteBuffer(string: key),
                            idempotencyKey: key
                        )
                        #expect(delivered == 1 ? retried == .duplicate : true)
                        print(
                            "round \(round): \(delivered) delivered, \(20 - delivered - failed.count) duplicates, \(failed.count) refused to retry"
                        )
                    }
                    let stored = try await stores[0].deliveries(for: "bob", after: 0, limit: 100)
                    #expect(stored.map { String(buffer: $0.body) } == (0..<5).map { "shipment-\($0)" })
                }
            }
        }

        /// A gateway whose connects, `order.*` requests and `chat.*` messages go to the Python backend.
        static func proxiedGateway(
            _ harness: Harness,
            backendURL: String,
            connect: Bool = true,
            maxCalls: Int = 64,
            messageBatch: Int = 1,
            breaker: BackendConfiguration.Breaker = .defaults
        ) async throws -> (Gateway, Endpoint, BackendProxy) {
            let proxy = try BackendProxy(
                configuration: try BackendConfiguration(
                    url: backendURL,
                    connect: connect,
                    disconnect: true,
                    channels: ["staff.*"],
                    requests: ["order.*"],
                    messages: ["chat.*"],
                    messageBatch: messageBatch,
                    timeout: .seconds(2),
                    maxConcurrentCalls: maxCalls,
                    breaker: breaker
                ),
                logger: testLogger("backend")
            )
            let (gateway, endpoint) = try await harness.gateway(
                messageStore: InMemoryMessageStore(),
                configure: { $0.channels = try! .init(rules: [.init(pattern: .all, history: nil)]) },
                authenticator: connect ? proxy : nil
            ) {
                proxy.install(on: $0)
            }
            let running = Task { try await proxy.run() }  // it sends the disconnect notifications
            harness.onExit { running.cancel() }
            return (gateway, endpoint, proxy)
        }

        static func client(_ harness: Harness, _ endpoint: Endpoint, _ id: String, token: String) throws -> TetherClient {
            try harness.client([endpoint], clientID: id) {
                $0.authentication = .token(ByteBuffer(string: token))
                $0.reliability = try! ClientConfiguration.Reliability(outbox: InMemoryOutboxStore())
            }
        }

        @Test("connects and requests go to a Python backend: identities, answers, statuses", .requires(.python3))
        func proxiedConnectsAndRequests() async throws {
            try OutsideTool.python3.require()
            try await withHarness { harness in
                let backend = try await PythonBackend(in: harness)
                let (gateway, endpoint, proxy) = try await Self.proxiedGateway(harness, backendURL: backend.url)

                // connect: the backend says who the client is, or refuses.
                let identity = try await proxy.authenticate(
                    HandshakeInfo(clientID: "alice", authToken: ByteBuffer(string: "alice-token"), userAgent: nil, remoteAddress: nil)
                )
                #expect(identity.clientID == "alice" && identity.info == #"{"name": "Alice"}"#)
                await #expect(throws: AuthenticationError(.unauthenticated, "unknown token")) {
                    try await proxy.authenticate(
                        HandshakeInfo(clientID: "alice", authToken: ByteBuffer(string: "x"), userAgent: nil, remoteAddress: nil)
                    )
                }
                await #expect(throws: AuthenticationError(.permissionDenied, "this token is bob's")) {
                    try await proxy.authenticate(
                        HandshakeInfo(clientID: "alice", authToken: ByteBuffer(string: "bob-token"), userAgent: nil, remoteAddress: nil)
                    )
                }

                // requests: the backend's answer, its statuses.
                let alice = try Self.client(harness, endpoint, "alice", token: "alice-token")
                let order = try await alice.request("order.create", body: ByteBuffer(string: #"{"item":"book"}"#), timeout: .seconds(10))
                let answer = try JSONSerialization.jsonObject(with: Data(buffer: order)) as? [String: Any]
                #expect(answer?["item"] as? String == "book" && answer?["order"] as? Int == 1)
                await #expect {
                    _ = try await alice.request("order.create", body: ByteBuffer(string: "not json"), timeout: .seconds(10))
                } throws: { error in
                    (error as? TetherError)?.status == .invalidRequest
                        && (error as? TetherError)?.message.contains("an order is JSON") == true
                }
                await #expect {
                    _ = try await alice.request("order.reject", timeout: .seconds(10))
                } throws: { error in
                    (error as? TetherError)?.status == StatusCode(rawValue: 1001) && (error as? TetherError)?.message == "out of stock"
                }
                await #expect {
                    _ = try await alice.request("order.nothing", timeout: .seconds(10))
                } throws: { error in (error as? TetherError)?.status == .unknownMethod }
                await #expect {
                    _ = try await alice.request("not.proxied", timeout: .seconds(10))
                } throws: { error in (error as? TetherError)?.status == .unknownMethod }

                // A client the backend refuses never connects.
                let mallory = try Self.client(harness, endpoint, "mallory", token: "stolen")
                let malloryEvents = harness.events(of: mallory)
                try await eventually("mallory is refused") {
                    malloryEvents.all.contains {
                        if case .connectFailed(_, let error) = $0 { error.message.contains("unknown token") } else { false }
                    }
                }
                #expect(malloryEvents.connects == 0)

                // Channel access: staff.* only if the backend allows it (alice: yes, bob: no).
                let staff = ClientChannelTests.Reader(alice.subscribe("staff.news"), in: harness)
                try await eventually("alice is subscribed to staff.news") { staff.subscriptions.count == 1 }
                let bob = try Self.client(harness, endpoint, "bob", token: "bob-token")
                let refused = ClientChannelTests.Reader(bob.subscribe("staff.news"), in: harness)
                try await eventually("bob is refused") { refused.ended }
                #expect((refused.error as? TetherError)?.status == .permissionDenied, "\(String(describing: refused.error))")
                #expect((refused.error as? TetherError)?.message.contains("staff channels are for staff") == true)
                let open = ClientChannelTests.Reader(bob.subscribe("lobby"), in: harness)
                try await eventually("bob may read other channels (not asked)") { open.subscriptions.count == 1 }

                // disconnect: the backend is told, with the reason; a refused client never
                // connected, so nothing is sent about it.
                #expect(gateway.disconnect(client: "alice", reconnect: false, message: "banned") == 1)
                try await eventually("the backend heard of alice's disconnect") {
                    let disconnects = (try? await backend.stats())?["disconnects"] as? [[String: Any]] ?? []
                    return disconnects.count == 1 && disconnects.first?["client"] as? String == "alice"
                        && disconnects.first?["reason"] as? String == "goaway_revoked"
                }
                #expect(((try await backend.stats())["disconnects"] as? [[String: Any]])?.count == 1)
            }
        }

        @Test(
            "2,000 reliable messages from 8 clients to a backend killed and restarted mid-stream, one per call or in batches: each processed once, every outcome acknowledged",
            .requires(.python3),
            arguments: [1, 32]
        )
        func messagesThroughABackendKilled(batch: Int) async throws {
            try OutsideTool.python3.require()
            try await withHarness(timeLimit: .seconds(180)) { harness in
                let backend = try await PythonBackend(in: harness)
                // The clients are not checked by the backend here: 8 of them, 8 lanes of messages.
                let (_, endpoint, _) = try await Self.proxiedGateway(
                    harness,
                    backendURL: backend.url,
                    connect: false,
                    messageBatch: batch,
                    breaker: .init(failures: 3, openFor: .milliseconds(300))
                )
                let senders = try (0..<8).map { try Self.client(harness, endpoint, "sender-\($0)", token: "-") }
                let perSender = 250
                let count = senders.count * perSender
                let killed = Task {
                    try await eventually("the backend processed some") {
                        ((try? await backend.stats())?["processed"] as? Int ?? 0) >= count / 4
                    }
                    try await backend.kill()
                    try await Task.sleep(for: .milliseconds(700))
                    try await backend.start()
                }
                harness.onExit { killed.cancel() }
                let outcomes = try await withThrowingTaskGroup(of: [String: Int].self) { group in
                    for (index, sender) in senders.enumerated() {
                        group.addTask {
                            var receipts: [MessageReceipt] = []
                            for number in 0..<perSender {
                                let conversation = "c\(index)-\(number % 2)"
                                receipts.append(
                                    try await sender.send("chat.room", body: ByteBuffer(string: "\(number)"), conversation: conversation)
                                )
                            }
                            var outcomes: [String: Int] = [:]
                            for receipt in receipts {
                                let outcome = await sender.outcome(of: receipt)
                                outcomes["\(outcome.map { "\($0)" } ?? "unknown")", default: 0] += 1
                            }
                            return outcomes
                        }
                    }
                    return try await group.reduce(into: [String: Int]()) { $0.merge($1, uniquingKeysWith: +) }
                }
                try await killed.value
                #expect(outcomes == ["acknowledged": count], "\(outcomes)")
                let stats = try await backend.stats()
                #expect(stats["processed"] as? Int == count)
                let perConversation = stats["conversations"] as? [String: [String: Int]] ?? [:]
                for index in senders.indices {
                    for conversation in ["c\(index)-0", "c\(index)-1"] {
                        let expected = perSender / 2
                        #expect(
                            perConversation[conversation] == ["messages": expected, "distinct": expected, "last": expected],
                            "\(conversation)"
                        )
                    }
                }
                let largest = stats["largest_batch"] as? Int ?? 0
                if batch == 1 {
                    #expect(largest == 0, "no batch event when each message has its call")
                } else {
                    #expect(largest > 1 && largest <= batch, "messages of several lanes went in one call: \(largest)")
                }
                print(
                    "batch \(batch): backend killed mid-stream, \(stats["processed"] ?? "?") processed once, outcomes \(outcomes), largest batch \(largest)"
                )

                // A refusal by the backend is the outcome the sender sees (in a batch: its own).
                let refused = try await senders[0].send("chat.room", body: ByteBuffer(string: "refuse me"))
                let outcome = await senders[0].outcome(of: refused)
                #expect(outcome == .refused(.invalidRequest), "\(String(describing: outcome))")
            }
        }

        @Test("a slow backend paces requests instead of refusing them; a dead one trips the breaker and /ready", .requires(.python3))
        func slowAndDeadBackends() async throws {
            try OutsideTool.python3.require()
            try await withHarness { harness in
                let backend = try await PythonBackend(in: harness)
                let (_, endpoint, _) = try await Self.proxiedGateway(harness, backendURL: backend.url, maxCalls: 2)
                let alice = try Self.client(harness, endpoint, "alice", token: "alice-token")
                let started = ContinuousClock.now
                let answers = try await withThrowingTaskGroup(of: String.self) { group in
                    for index in 0..<10 {
                        group.addTask {
                            String(
                                buffer: try await alice.request("order.slow", body: ByteBuffer(string: "\(index)"), timeout: .seconds(20))
                            )
                        }
                    }
                    return try await group.reduce(into: []) { $0.append($1) }
                }
                #expect(answers.sorted() == (0..<10).map(String.init).sorted())
                print("10 requests of 0.2 s through 2 call slots: \(ContinuousClock.now - started) (paced, none refused)")

                // A backend that is not there: unavailable, then the breaker opens and /ready says so.
                let deadURL = "http://127.0.0.1:\(try await freePort())"
                let (deadGateway, deadEndpoint, deadProxy) = try await Self.proxiedGateway(
                    harness,
                    backendURL: deadURL,
                    breaker: .init(failures: 3, openFor: .seconds(30))
                )
                // The connect goes to the dead backend too: refused as unavailable.
                let bob = try Self.client(harness, deadEndpoint, "bob", token: "bob-token")
                let bobEvents = harness.events(of: bob)
                try await eventually("bob is refused as unavailable") {
                    bobEvents.all.contains {
                        if case .connectFailed(_, let error) = $0 { error.message.contains("backend") } else { false }
                    }
                }
                try await eventually("the breaker opens") { deadProxy.breakerIsOpen }
                let readiness = await deadGateway.readiness()
                #expect(!readiness.ready)
                #expect(readiness.reasons.contains { $0.hasPrefix("backend unavailable") }, "\(readiness.reasons)")
            }
        }

        @Test(
            "tether serve --config: every bad key or value is an error that names it; a good file configures the API, the backend and channel rules"
        )
        func configurationFile() async throws {
            try await withHarness(timeLimit: .seconds(120)) { harness in
                let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-config-\(UUID().uuidString)")
                try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
                harness.onExit { try? FileManager.default.removeItem(at: directory) }
                func write(_ text: String, _ name: String = "tether.yaml") throws -> String {
                    let path = directory.appendingPathComponent(name).path
                    try text.write(toFile: path, atomically: true, encoding: .utf8)
                    return path
                }
                for (text, expected) in [
                    ("backend:\n  url: http://127.0.0.1:1\n  connect: true\n  timeout: 5\n", "backend.timeout: unknown key"),
                    ("backend:\n  url: http://127.0.0.1:1\n  connect: yes please\n", "backend.connect must be true or false"),
                    ("backend:\n  connect: true\n", "backend.url is missing"),
                    ("backend:\n  url: ftp://x\n  connect: true\n", "http://, https://, grpc:// or grpcs://"),
                    ("backend:\n  url: grpc://127.0.0.1\n  connect: true\n", "grpc://HOST:PORT"),
                    ("backend:\n  url: http://127.0.0.1:1\n  messages: [\"chat.*\"]\n  message_batch: 0\n", "messageBatch must be 1"),
                    ("api:\n  port: 8090\n  grpc_port: 70000\n  keys: [dev-key-0123456789]\n", "gRPC port must be 0 to 65535"),
                    ("channels:\n  - pattern: \"room.*\"\n    storage: disk\n", "channels[0].storage must be store or memory"),
                    ("channels:\n  - pattern: \"a*b\"\n", "channels[0].pattern"),
                    ("channels:\n  - pattern: \"room.*\"\n    history: -1\n", "channels[0].history must be 0 or more"),
                    (
                        "channels:\n  - pattern: \"room.*\"\n    history_age_seconds: 1e300\n",
                        "history_age_seconds must be positive and at most 1e9"
                    ),
                    (
                        "api:\n  port: 0\n  keys: [long-enough-key-0123456789]\n  max_connections: 0\n",
                        "maxConnections and idleTimeout must be positive"
                    ),
                    (
                        "api:\n  port: 0\n  keys: [long-enough-key-0123456789]\n  idle_timeout_seconds: 1e300\n",
                        "--config: api.idle_timeout_seconds must be a positive number of seconds"
                    ),
                    (
                        "backend:\n  url: http://127.0.0.1:1\n  connect: true\n  timeout_seconds: 1e300\n",
                        "--backend-timeout must be a positive number of seconds"
                    ),
                    ("api:\n  port: 0\n  keys: [short]\n", "16 to 512 bytes"),
                    ("api:\n  keys: [long-enough-key-0123456789]\n", "api needs a port"),
                    ("apis: {}\n", "apis: unknown key"),
                    ("{\"backend\": {\"url\": \"http://127.0.0.1:1\", \"connect\": 1}}", "backend.connect must be true or false"),
                ] {
                    let path = try write(text)
                    let refused = try ChildProcess(["serve", "--port", "0", "--store", ":memory:", "--config", path], in: harness)
                    #expect(try await refused.exitStatus() != 0, "\(text)")
                    let said = refused.lines.joined(separator: "\n")
                    #expect(said.contains(expected), "\(text) → \(said)")
                }

                // A good file: the API with its keys, and channel rules before the options' rule.
                let (port, apiPort) = (try await freePort(), try await freePort())
                let path = try write(
                    """
                    api:
                      port: \(apiPort)
                      keys: [\(Self.keys[0])]
                    channels:
                      - pattern: "quiet.*"
                        history: 10
                        presence: false
                    """
                )
                let serve = try ChildProcess(["serve", "--port", "\(port)", "--store", ":memory:", "--config", path], in: harness)
                let api = APICaller(port: apiPort, key: Self.keys[0])
                try await eventually("the API answers") { (try? await api.call(.GET, "/v1/clients/x/connections"))?.status == 200 }
                let quiet = try await api.call(.GET, "/v1/channels/quiet.room/presence")
                #expect(quiet.status == 400 && (quiet.json["message"] as? String)?.contains("keeps no presence") == true, "\(quiet.json)")
                let loud = try await api.call(.GET, "/v1/channels/loud/presence")
                #expect(loud.status == 200, "the options' rule (presence on) takes the others")
                serve.kill()
            }
        }

        @Test("schemathesis fuzzes the running server API against openapi.yaml", .requires(.schemathesis))
        func schemathesis() async throws {
            try OutsideTool.schemathesis.require()
            try await withHarness(timeLimit: .seconds(240)) { harness in
                let (gateway, _) = try await harness.gateway(messageStore: InMemoryMessageStore()) { configuration in
                    configuration.channels = try! .init(rules: [
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: 100, maxAge: .seconds(60)), presence: true)
                    ])
                }
                let port = try await harness.serverAPI(gateway, keys: Self.keys)
                let document = packageRoot.appendingPathComponent("Sources/TetherServerAPI/openapi.yaml").path
                // A 413 (a body over the API's maximum) is a refusal too; a 5xx is never expected.
                let config = FileManager.default.temporaryDirectory.appendingPathComponent("schemathesis-\(UUID().uuidString).toml").path
                try #"""
                [checks.negative_data_rejection]
                expected-statuses = ["400", "401", "404", "405", "406", "409", "413", "415", "422", "429"]
                """#.write(toFile: config, atomically: true, encoding: .utf8)
                harness.onExit { try? FileManager.default.removeItem(atPath: config) }
                // Valid calls must get documented answers of the documented shape; invalid ones a
                // 4xx, never a 5xx. Left out: positive_data_acceptance (the document's rules across
                // fields, such as one target per publication, are in its descriptions: schema-valid
                // calls may be refused) and unsupported_method (an undocumented method gets 404,
                // not 405).
                for (mode, checks) in [
                    ("positive", ["--checks", "all", "--exclude-checks", "positive_data_acceptance,unsupported_method"]),
                    ("negative", ["--checks", "not_a_server_error,negative_data_rejection"]),
                ] {
                    let run = try ChildProcess(
                        executable: "/usr/bin/env",
                        [
                            "python3", "-m", "schemathesis.cli", "--config-file", config, "run", document, "--url",
                            "http://127.0.0.1:\(port)",
                            "-H", "Authorization: Bearer \(Self.keys[0])", "--mode", mode, "--max-examples", "25",
                            "--phases", "examples,coverage,fuzzing", "-w", "1", "--seed", "43", "--no-color",
                        ] + checks,
                        in: harness
                    )
                    let status = try await run.exitStatus(timeout: .seconds(200))
                    let summary = run.lines.filter { $0.contains("generated") || $0.contains("failures") || $0.contains("passed") }
                    print("schemathesis \(mode): exit \(status); \(summary.joined(separator: " | "))")
                    #expect(status == 0, "schemathesis \(mode) found failures:\n\(run.lines.suffix(60).joined(separator: "\n"))")
                }
            }
        }
    }
}
