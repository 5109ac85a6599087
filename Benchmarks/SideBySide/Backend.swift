import ArgumentParser
import AsyncHTTPClient
import Foundation
import Histogram
import Hummingbird
import Logging
import NIOCore
import NIOPosix
import ServiceLifecycle
import Tether
import TetherBackendProxy
import TetherGateway
import TetherServerAPI

/// `tether-bench backend`: what issue 43 asks of a gateway driven by a backend, each party in a
/// process of its own — a backend (Hummingbird, answering at once), a gateway proxying to it
/// with its server API, and this process as the clients:
///
/// - a request proxied to the backend, beside a direct HTTP call to the same backend and a
///   Tether round trip to a handler in the gateway (sequential, p50);
/// - publications through the server API, one per call and in batches (one HTTP/1.1
///   keep-alive connection, sequential calls);
/// - reliable messages through the proxy to the backend.
struct BackendBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "backend",
        abstract: "A proxied request beside a direct HTTP call, server API publications, reliable messages through the proxy."
    )

    @Option(help: "Sequential requests measured for each latency (after a tenth as many warm-up).")
    var requests = 5_000

    @Option(help: "Seconds of publications through the API, for each of one per call and batches.")
    var seconds = 3.0

    @Option(help: "Publications per batch call.")
    var batch = 1_000

    @Option(help: "Reliable messages sent through the proxy.")
    var messages = 40_000

    @Option(help: "Clients sending them (each its own client id, so its own lane).")
    var senders = 16

    @Option(help: "Connections the gateway's proxy keeps to the backend.")
    var proxyConnections = 8

    @Option(help: "The most reliable messages in one call of the batch event (the second measure of messages).")
    var messageBatch = 64

    @Option(help: "Where the results go.")
    var output = "bench-results"

    struct Latency: Codable {
        var what: String
        var p50Microseconds: Double
        var p99Microseconds: Double
    }

    struct Results: Codable {
        var latencies: [Latency]
        /// The proxied request's p50 over (the direct call's p50 + the Tether round trip's p50).
        var proxiedRatio: Double
        var publicationsPerSecondOnePerCall: Double
        var publicationsPerSecondBatched: Double
        var batch: Int
        var reliableMessagesPerSecond: Double
        /// With the batch event (`POST /tether/messages`), up to ``messageBatch`` to a call.
        var reliableMessagesPerSecondBatched: Double
        var messageBatch: Int
        var messages: Int
        var senders: Int
        var proxyConnections: Int
    }

    func run() async throws {
        let executable = try ChildProcess.thisExecutable()
        let backend = try ChildProcess(executable, ["backend-serve"])
        defer { backend.terminate() }
        guard let ready = backend.readLine(), ready.hasPrefix("ready "), let backendPort = Int(ready.dropFirst(6)) else {
            throw BenchError("the backend did not start: \(backend.errors())")
        }
        let gateway = try ChildProcess(
            executable,
            [
                "backend-gateway", "--backend", "http://127.0.0.1:\(backendPort)", "--connections", "\(self.proxyConnections)",
                "--message-batch", "\(self.messageBatch)",
            ]
        )
        defer { gateway.terminate() }
        guard let line = gateway.readLine(), line.hasPrefix("ready "),
            case let ports = line.dropFirst(6).split(separator: " ").compactMap({ Int($0) }), ports.count == 2
        else {
            throw BenchError("the gateway did not start: \(gateway.errors())")
        }
        let (port, apiPort) = (ports[0], ports[1])

        var configuration = HTTPClient.Configuration()
        configuration.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 1)
        let http = HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton, configuration: configuration)
        do {
            try await self.measure(http, backendPort: backendPort, port: port, apiPort: apiPort)
            try await http.shutdown()
        } catch {
            try? await http.shutdown()
            throw error
        }
    }

    private func measure(_ http: HTTPClient, backendPort: Int, port: Int, apiPort: Int) async throws {
        let body = ByteBuffer(repeating: UInt8(ascii: "x"), count: 32)

        // Latencies, sequential: the peers' own echo clients, driven as every peer's are.
        let requests = self.requests
        let direct = try await Self.latency(HTTPPeer.Client(client: http, url: "http://127.0.0.1:\(backendPort)/echo"), body, requests)
        let (tether, proxied) = try await TetherPeer.withClient(port: port) { client in
            (
                try await Self.latency(TetherPeer.Client(client: client, method: "echo", onLoop: false), body, requests),
                try await Self.latency(TetherPeer.Client(client: client, method: "backend.echo", onLoop: false), body, requests)
            )
        }
        let latencies = [
            Latency(what: "direct HTTP call to the backend", p50Microseconds: direct.p50, p99Microseconds: direct.p99),
            Latency(what: "Tether request to a handler in the gateway", p50Microseconds: tether.p50, p99Microseconds: tether.p99),
            Latency(what: "Tether request proxied to the backend", p50Microseconds: proxied.p50, p99Microseconds: proxied.p99),
        ]
        for latency in latencies {
            emit(
                "\(latency.what): p50 \(Report.number(latency.p50Microseconds, 1)) µs, p99 \(Report.number(latency.p99Microseconds, 1)) µs"
            )
        }
        let ratio = proxied.p50 / (direct.p50 + tether.p50)
        emit("proxied p50 / (direct p50 + Tether p50) = \(Report.number(ratio, 2))× (target ≤ 1.5×)")

        // Publications through the API.
        let single = try await self.publications(http, apiPort: apiPort, perCall: 1)
        emit("server API, one publication per call: \(Int(single)) publications/s (target ≥ 10,000)")
        let batched = try await self.publications(http, apiPort: apiPort, perCall: self.batch)
        emit("server API, \(self.batch) per call: \(Int(batched)) publications/s (target ≥ 50,000)")

        // Reliable messages through the proxy.
        let rate = try await self.reliable(port: port, topic: "bench.backend")
        emit("reliable messages through the proxy, one per call, \(self.senders) senders: \(Int(rate)) messages/s (target ≥ 20,000)")
        let batchedRate = try await self.reliable(port: port, topic: "batched.backend")
        emit(
            "reliable messages through the proxy, up to \(self.messageBatch) per call, \(self.senders) senders: \(Int(batchedRate)) messages/s (target ≥ 20,000)"
        )

        try writeJSON(
            Results(
                latencies: latencies,
                proxiedRatio: ratio,
                publicationsPerSecondOnePerCall: single,
                publicationsPerSecondBatched: batched,
                batch: self.batch,
                reliableMessagesPerSecond: rate,
                reliableMessagesPerSecondBatched: batchedRate,
                messageBatch: self.messageBatch,
                messages: self.messages,
                senders: self.senders,
                proxyConnections: self.proxyConnections
            ),
            to: "\(self.output)/backend.json"
        )
    }

    /// p50 and p99 in microseconds of `count` sequential echoes (after `count / 10` unmeasured).
    static func latency(_ client: any EchoClient, _ body: ByteBuffer, _ count: Int) async throws -> (p50: Double, p99: Double) {
        _ = try await AsyncDriver.sequential(client, body: body, requests: count / 10)  // warm-up, not measured
        let (histogram, _) = try await AsyncDriver.sequential(client, body: body, requests: count)
        return (Double(histogram.valueAtPercentile(50)) / 1000, Double(histogram.valueAtPercentile(99)) / 1000)
    }

    /// Publications per second through `POST /v1/publish` (`perCall` 1) or `/v1/publish/batch`.
    private func publications(_ http: HTTPClient, apiPort: Int, perCall: Int) async throws -> Double {
        let data = String(repeating: "x", count: 32)
        let publication = #"{"channel":"bench.api","data":"\#(data)"}"#
        let (path, json) =
            perCall == 1
            ? ("/v1/publish", publication)
            : ("/v1/publish/batch", #"{"publications":["# + Array(repeating: publication, count: perCall).joined(separator: ",") + "]}")
        let payload = ByteBuffer(string: json)
        func call() async throws {
            var request = HTTPClientRequest(url: "http://127.0.0.1:\(apiPort)\(path)")
            request.method = .POST
            request.headers.add(name: "Authorization", value: "Bearer \(BackendGateway.apiKey)")
            request.headers.add(name: "Content-Type", value: "application/json")
            request.body = .bytes(payload)
            let response = try await http.execute(request, timeout: .seconds(30))
            _ = try await response.body.collect(upTo: 16 << 20)
            guard response.status == .ok else { throw BenchError("the API answered \(response.status)") }
        }
        let warmUp = ContinuousClock.now
        while ContinuousClock.now - warmUp < .seconds(1) { try await call() }
        var published = 0
        let started = ContinuousClock.now
        while ContinuousClock.now - started < .seconds(self.seconds) {
            try await call()
            published += perCall
        }
        return Double(published) / (ContinuousClock.now - started).totalSeconds
    }

    /// Messages per second on `topic`: from the first send until every message's outcome is known.
    private func reliable(port: Int, topic: String) async throws -> Double {
        let (messages, senders) = (self.messages, self.senders)
        let perSender = messages / senders
        let body = ByteBuffer(repeating: UInt8(ascii: "m"), count: 32)
        let started = ContinuousClock.now
        try await withThrowingTaskGroup(of: Void.self) { group in
            for sender in 0..<senders {
                group.addTask {
                    var configuration = ClientConfiguration(
                        endpoints: [Endpoint(host: "127.0.0.1", port: port)],
                        clientID: "\(topic)-sender-\(sender)"
                    )
                    configuration.reliability = try .init(outbox: InMemoryOutboxStore(), capacity: max(perSender, 1_000))
                    let client = try TetherClient(configuration: configuration, logger: Peer.logger)
                    try await withThrowingTaskGroup(of: Void.self) { inner in
                        inner.addTask { try await client.run() }
                        var receipts: [MessageReceipt] = []
                        for index in 0..<perSender {
                            receipts.append(try await client.send(topic, body: body, conversation: "c\(index % 4)"))
                        }
                        for receipt in receipts {
                            guard case .acknowledged = await client.outcome(of: receipt) else {
                                throw BenchError("a message was not acknowledged")
                            }
                        }
                        client.shutdown()
                        try await inner.waitForAll()
                    }
                }
            }
            try await group.waitForAll()
        }
        return Double(perSender * senders) / (ContinuousClock.now - started).totalSeconds
    }
}

/// `tether-bench backend-serve`: the backend of `tether-bench backend` — answers at once: a
/// proxied request with its body, a message with 200, `/echo` with its body.
struct BackendServe: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "backend-serve", abstract: "The backend; prints 'ready PORT'.")

    func run() async throws {
        let router = Router()
        router.post("/echo") { request, _ in Response(status: .ok, body: .init(byteBuffer: try await request.body.collect(upTo: 1 << 20))) }
        router.post("/tether/request/:method") { request, _ in
            Response(status: .ok, body: .init(byteBuffer: try await request.body.collect(upTo: 1 << 20)))
        }
        router.post("/tether/message/:topic") { request, _ in
            _ = try await request.body.collect(upTo: 1 << 20)
            return Response(status: .ok)
        }
        // The batch event: the messages decoded (as a backend would), one result each.
        struct Batch: Decodable {
            struct Message: Decodable {
                var topic: String
                var idempotencyKey: String
                var data: String?
                var dataBase64: String?

                enum CodingKeys: String, CodingKey {
                    case topic, data
                    case idempotencyKey = "idempotency_key"
                    case dataBase64 = "data_base64"
                }
            }
            var messages: [Message]
        }
        router.post("/tether/messages") { request, _ in
            let body = try await request.body.collect(upTo: 16 << 20)
            let batch = try JSONDecoder().decode(Batch.self, from: Data(body.readableBytesView))
            let results = "{\"results\":[" + Array(repeating: #"{"status":200}"#, count: batch.messages.count).joined(separator: ",") + "]}"
            var headers = HTTPFields()
            headers[.contentType] = "application/json"
            return Response(status: .ok, headers: headers, body: .init(byteBuffer: ByteBuffer(string: results)))
        }
        var logger = Logger(label: "backend")
        logger.logLevel = .error
        let application = Application(
            router: router,
            configuration: .init(address: .hostname("127.0.0.1", port: 0)),
            onServerRunning: { channel in emit("ready \(channel.localAddress!.port!)") },
            logger: logger
        )
        try await application.runService()
    }
}

/// `tether-bench backend-gateway`: a gateway whose `backend.*` requests and `bench.*` messages
/// go to the backend, with an `echo` handler of its own and its server API; prints
/// 'ready PORT API-PORT'.
struct BackendGateway: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "backend-gateway", abstract: "The gateway of tether-bench backend.")

    static let apiKey = "bench-key-0123456789"

    @Option(help: "The backend's URL.")
    var backend: String

    @Option(help: "Connections the proxy keeps to the backend.")
    var connections = 8

    @Option(help: "The most messages in one call for the batch event's topics (batched.*).")
    var messageBatch = 64

    func run() async throws {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = .init(host: "127.0.0.1", port: 0)
        // The proxy's own pool, as many connections as calls may be under way.
        var pool = HTTPClient.Configuration()
        pool.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: self.connections)
        let client = HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton, configuration: pool)
        let proxy = try BackendProxy(
            configuration: try BackendConfiguration(url: self.backend, requests: ["backend.*"], messages: ["bench.*"]),
            httpClient: client,
            logger: Peer.logger
        )
        // A second proxy for batched.*: its messages go to the backend up to messageBatch per call.
        let batched = try BackendProxy(
            configuration: try BackendConfiguration(url: self.backend, messages: ["batched.*"], messageBatch: self.messageBatch),
            httpClient: client,
            logger: Peer.logger
        )
        let gateway = try Gateway(configuration: configuration, messageStore: InMemoryMessageStore(), logger: Peer.logger)
        proxy.install(on: gateway)
        batched.install(on: gateway)
        gateway.handleInline("echo") { request, _ in request.body }
        let api = ServerAPIService(
            gateway: gateway,
            configuration: try ServerAPIConfiguration(port: 0, keys: [Self.apiKey]),
            logger: Peer.logger
        )
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await gateway.run() }
            group.addTask { try await api.run() }
            let port = try await gateway.listeningAddress.port!
            let apiPort = try await api.listeningPort()
            emit("ready \(port) \(apiPort)")
            try await group.waitForAll()
        }
    }
}
