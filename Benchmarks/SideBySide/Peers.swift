import AsyncHTTPClient
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import Hummingbird
import HummingbirdWebSocket
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Tether
import TetherGateway
import TetherPostgres
import WSClient

/// One request/response round trip through a peer's client, as an app would call it.
protocol EchoClient: Sendable {
    /// Sends `body` and returns the size of the echoed response.
    func echo(_ body: ByteBuffer) async throws -> Int
    /// Where the driver's tasks should run; `nil`: Swift's global executor.
    var preferredExecutor: (any TaskExecutor)? { get }
}

extension EchoClient {
    var preferredExecutor: (any TaskExecutor)? { nil }
}

/// The protocols compared. Each has a server (run in its own process) and a client.
enum Peer: String, CaseIterable, Sendable {
    /// The floor: a minimal SwiftNIO length-prefixed echo, driven by a NIO handler (no Swift
    /// concurrency on the client's hot path either).
    case rawNIO = "raw-nio"
    /// Tether request/response over TCP: a handler in a task (``Gateway/handle(_:_:)``), callers
    /// on Swift's global executor.
    case tether
    /// The same gateway, with the echo registered as an inline handler (``Gateway/handleInline(_:_:)``):
    /// called on the event loop, no task per request.
    case tetherInline = "tether-inline"
    /// The inline handler, and the callers' tasks on the client's own event loop
    /// (`withTaskExecutorPreference(client.taskExecutor)`): no thread hop on either side.
    case tetherInlineOnLoop = "tether-inline-loop"
    /// The inline handler, and callers using the completion-handler API (``TetherDataTask``):
    /// each completion handler, on the client's event loop, sends the next request, as the raw
    /// floor's driver does. No Swift task per request on either side.
    case tetherCallback = "tether-callback"
    /// ``tether`` with the gateway's metrics on: swift-metrics into a Prometheus registry, as
    /// `tether serve --admin-port` runs (``tether`` records them into swift-metrics' no-op factory).
    case tetherMetrics = "tether-metrics"
    /// ``tetherInline`` with the gateway's metrics on.
    case tetherInlineMetrics = "tether-inline-metrics"
    /// ``tether`` over TLS 1.3 (`tethers://`, swift-nio-ssl on both sides).
    case tetherTLS = "tether-tls"
    /// ``tether`` over WebSocket (`ws://`, NIOWebSocket on both sides).
    case tetherWebSocket = "tether-ws"
    /// ``tether`` over WebSocket over TLS 1.3 (`wss://`).
    case tetherSecureWebSocket = "tether-wss"
    /// ``tether`` over the HTTP stream (`http://`): frames down one chunked HTTP/1.1 response,
    /// up in POSTs on a second connection (NIOHTTP1 on both sides).
    case tetherHTTPStream = "tether-http-stream"
    /// ``tether`` over the HTTP stream over TLS 1.3 (`https://`), HTTP/2 (ALPN `h2`): the GET
    /// and the POSTs are streams of one connection (swift-nio-http2 on both sides).
    case tetherSecureHTTPStream = "tether-https-stream"
    /// The same over HTTP/1.1 (the gateway does not offer `h2`): two connections.
    case tetherSecureHTTP1Stream = "tether-https1-stream"
    /// HTTP/1.1 keep-alive: Hummingbird 2 and AsyncHTTPClient, one connection.
    case http = "http1"
    /// gRPC unary: grpc-swift-2 over its NIO HTTP/2 transport, one connection.
    case grpcUnary = "grpc-unary"
    /// gRPC bidirectional streaming: one stream per client task, one connection.
    case grpcStream = "grpc-stream"
    /// A WebSocket with request-id correlation: hummingbird-websocket and WSClient.
    case webSocket = "websocket"

    static let logger: Logger = {
        var logger = Logger(label: "tether-bench")
        logger.logLevel = .error
        return logger
    }()

    /// Runs the server on `port` (0 picks one), calls `ready` with the port, and serves until
    /// the task is cancelled.
    func serve(
        port: Int,
        reusePort: Bool = false,
        cluster: ClusterNodeOptions? = nil,
        ready: @escaping @Sendable (Int) -> Void
    ) async throws {
        switch self {
        case .rawNIO: try await RawEcho.serve(port: port, ready: ready)
        case .tether, .tetherInline, .tetherInlineOnLoop, .tetherCallback, .tetherTLS, .tetherWebSocket, .tetherSecureWebSocket,
            .tetherHTTPStream, .tetherSecureHTTPStream, .tetherSecureHTTP1Stream, .tetherMetrics, .tetherInlineMetrics:
            try await TetherPeer.serve(
                port: port,
                transport: self.transport,
                http2: self != .tetherSecureHTTP1Stream,
                reusePort: reusePort,
                cluster: cluster,
                metrics: self == .tetherMetrics || self == .tetherInlineMetrics ? .prometheus() : .system,
                ready: ready
            )
        case .http: try await HTTPPeer.serve(port: port, ready: ready)
        case .grpcUnary, .grpcStream: try await GRPCPeer.serve(port: port, ready: ready)
        case .webSocket: try await WebSocketPeer.serve(port: port, ready: ready)
        }
    }

    /// Runs `body` with a connected client.
    func withClient<R: Sendable>(port: Int, _ body: @escaping @Sendable (any EchoClient) async throws -> R) async throws -> R {
        switch self {
        case .rawNIO: fatalError("the raw floor is driven by RawEcho.drive")
        case .tetherCallback: fatalError("the callback peer is driven by CallbackDriver.drive")
        case .tether, .tetherTLS, .tetherWebSocket, .tetherSecureWebSocket, .tetherHTTPStream, .tetherSecureHTTPStream,
            .tetherSecureHTTP1Stream, .tetherMetrics:
            try await TetherPeer.withClient(port: port, transport: self.transport, method: "echo", onLoop: false, body)
        case .tetherInline, .tetherInlineMetrics:
            try await TetherPeer.withClient(port: port, transport: .tcp, method: "echo.inline", onLoop: false, body)
        case .tetherInlineOnLoop: try await TetherPeer.withClient(port: port, transport: .tcp, method: "echo.inline", onLoop: true, body)
        case .http: try await HTTPPeer.withClient(port: port, body)
        case .grpcUnary: try await GRPCPeer.withClient(port: port, streaming: false, body)
        case .grpcStream: try await GRPCPeer.withClient(port: port, streaming: true, body)
        case .webSocket: try await WebSocketPeer.withClient(port: port, body)
        }
    }
}

extension Peer {
    /// How a Tether peer's client reaches its gateway.
    var transport: Endpoint.Transport {
        switch self {
        case .tetherTLS: .tls
        case .tetherWebSocket: .webSocket
        case .tetherSecureWebSocket: .secureWebSocket
        case .tetherHTTPStream: .httpStream
        case .tetherSecureHTTPStream, .tetherSecureHTTP1Stream: .secureHTTPStream
        default: .tcp
        }
    }
}

// MARK: - Tether

enum TetherPeer {
    static func serve(
        port: Int,
        transport: Endpoint.Transport = .tcp,
        http2: Bool = true,
        reusePort: Bool = false,
        cluster: ClusterNodeOptions? = nil,
        metrics: Gateway.Metrics = .system,
        ready: @escaping @Sendable (Int) -> Void
    ) async throws {
        var configuration = GatewayConfiguration.defaults
        if transport.isSecure {
            let files = try BenchCertificate.files()
            configuration.tls = .init(certificateChain: .file(files.certificate), privateKey: .file(files.key))
        }
        if transport.isHTTP {
            configuration.listen = nil
            configuration.webSocket = .init(host: "127.0.0.1", port: port, tls: transport.isSecure)
            configuration.webSocket?.stream?.http2 = http2
        } else {
            configuration.listen = .init(host: "127.0.0.1", port: port, reusePort: reusePort, tls: transport.isSecure)
        }
        configuration.limits.maxConcurrentRequestsPerConnection = 1024
        // Every generator connects from 127.0.0.1, tens of thousands at once.
        configuration.limits.maxConnectionsPerAddress = configuration.limits.maxConnections
        configuration.limits.maxUnauthenticatedConnections = configuration.limits.maxConnections
        configuration.limits.handshakesPerSecond = 1_000_000
        configuration.limits.handshakesPerSecondPerAddress = 1_000_000
        configuration.limits.requestsPerSecondPerConnection = .max  // no limit: the benchmarks are floods
        if let level = ProcessInfo.processInfo.environment["TETHER_BENCH_COMPRESSION_LEVEL"].flatMap(Int.init) {
            configuration.compression = try Compression(level: level)  // `tether-bench compression --level`
        }
        var node: (store: PostgresMessageStore, cluster: PostgresCluster)?
        if let cluster { node = try await cluster.join() }
        // `fanout --target channel-store`: the channel bench.store keeps its history in the
        // store (PostgreSQL's in a cluster, else a SQLite file); every other one in memory.
        var messageStore: (any MessageStore)? = node?.store
        if messageStore == nil, let path = ProcessInfo.processInfo.environment["TETHER_BENCH_CHANNEL_STORE"] {
            messageStore = try SQLiteMessageStore(path: path)
        }
        // `channels`: the recovery of 10,000 missed publications needs a deeper history
        // (bench.recovery.store in the store, bench.recovery.memory in memory), and the
        // presence of bench.presence's members is kept.
        let retention = try ChannelRetention(maxCount: 1_000, maxAge: .seconds(300))
        let deep = try ChannelRetention(maxCount: 100_000, maxAge: .seconds(600))
        var rules: [GatewayConfiguration.Channels.Rule] = []
        if messageStore != nil {
            rules.append(.init(pattern: try ChannelPattern("bench.store"), history: retention, storage: .store))
            rules.append(.init(pattern: try ChannelPattern("bench.recovery.store"), history: deep, storage: .store))
        }
        rules.append(.init(pattern: try ChannelPattern("bench.recovery.memory"), history: deep))
        rules.append(.init(pattern: try ChannelPattern("bench.presence"), history: nil, presence: true))
        rules.append(.init(pattern: .all, history: retention))
        configuration.channels = try .init(rules: rules)
        let gateway = try Gateway(
            configuration: configuration,
            messageStore: messageStore,
            cluster: node?.cluster,
            metrics: metrics,
            logger: Peer.logger
        )
        gateway.handle("echo") { request, _ in request.body }
        gateway.handleInline("echo.inline") { request, _ in request.body }
        Self.installRoom(on: gateway)
        try await Self.run(gateway, ready: ready)
    }

    /// For `fanout`: members join one room; a publisher pushes COUNT bodies of SIZE bytes to it
    /// (one repeated byte, or with KIND 1, JSON).
    static func installRoom(on gateway: Gateway) {
        gateway.handle("room.join") { _, context in
            context.join("bench")
            return ByteBuffer()
        }
        gateway.handle("room.publish") { request, context in
            guard let count = request.body.getInteger(at: request.body.readerIndex, as: UInt32.self),
                let size = request.body.getInteger(at: request.body.readerIndex + 4, as: UInt32.self)
            else { throw RequestError(.invalidRequest, "the body is COUNT and SIZE, two UInt32") }
            // JSON needs room for its frame: 32 bytes at least.
            let json = request.body.getInteger(at: request.body.readerIndex + 8, as: UInt32.self) == 1 && size >= 32
            var recipients = 0
            for index in 0..<Int(count) {
                let body = json ? Self.chatJSON(size: Int(size), seed: index) : ByteBuffer(repeating: UInt8(ascii: "p"), count: Int(size))
                recipients = try context.push("bench.tick", body, to: .room("bench"))
            }
            var reply = ByteBuffer()
            reply.writeInteger(UInt32(recipients))
            return reply
        }
        // COUNT, SIZE, KIND as for room.publish, then the channel's name: the COUNT
        // publications at once, as COUNT publishers would (a store appends those that arrive
        // together in one transaction).
        gateway.handle("channel.publish") { request, context in
            var body = request.body
            guard let count = body.readInteger(as: UInt32.self), let size = body.readInteger(as: UInt32.self),
                let kind = body.readInteger(as: UInt32.self), let channel = body.readString(length: body.readableBytes), !channel.isEmpty
            else { throw RequestError(.invalidRequest, "the body is COUNT, SIZE and KIND (three UInt32), then the channel") }
            let json = kind == 1 && size >= 32
            try await withThrowingTaskGroup { group in
                for index in 0..<Int(count) {
                    let payload =
                        json ? Self.chatJSON(size: Int(size), seed: index) : ByteBuffer(repeating: UInt8(ascii: "p"), count: Int(size))
                    group.addTask { _ = try await context.publish(payload, toChannel: channel) }
                }
                try await group.waitForAll()
            }
            return ByteBuffer()
        }
    }

    /// A chat room's recent messages as JSON, exactly `size` bytes: what a room pushes, and
    /// about as compressible (keys repeat, texts are words of a small vocabulary, ids and times
    /// vary). Different for each `seed`.
    static func chatJSON(size: Int, seed: Int) -> ByteBuffer {
        let vocabulary = [
            "hello", "are", "you", "coming", "to", "the", "meeting", "tomorrow", "yes", "I", "think", "so", "what", "time",
            "does", "it", "start", "ten", "see", "there", "thanks", "great", "news", "about", "release", "ship", "today",
        ]
        var generator = SplitMix64(seed: UInt64(seed))
        func message(text: String) -> String {
            #"{"id":\#(100_000 + Int(generator.next() % 900_000)),"from":"user-\#(100 + generator.next() % 900)","#
                + #""sent_at":\#(1_764_000_000_000 + Int(generator.next() % 1_000_000_000)),"text":"\#(text)"}"#
        }
        func words(_ count: Int) -> String {
            (0..<count).map { _ in vocabulary[Int(generator.next() % UInt64(vocabulary.count))] }.joined(separator: " ")
        }
        var json = #"{"room":"bench","messages":["#
        var first = true
        while true {
            let next = (first ? "" : ",") + message(text: words(3 + Int(generator.next() % 8)))
            guard json.utf8.count + next.utf8.count + 2 <= size else { break }
            json += next
            first = false
        }
        // The rest: one more message whose text fills it, or spaces where none fits.
        let overhead = (first ? 0 : 1) + message(text: "").utf8.count
        let rest = size - json.utf8.count - 2
        if rest > overhead {
            json += (first ? "" : ",") + message(text: String(words(200).prefix(rest - overhead)))
        }
        json += String(repeating: " ", count: max(0, size - json.utf8.count - 2)) + "]}"
        return ByteBuffer(string: json)
    }

    /// Runs `gateway` until the task is cancelled, calling `ready` with its port once it listens.
    static func run(_ gateway: Gateway, ready: @escaping @Sendable (Int) -> Void) async throws {
        try await withThrowingDiscardingTaskGroup { group in
            group.addTask { try await gateway.run() }
            let address = try await gateway.configuration.webSocket != nil ? gateway.webSocketAddress : gateway.listeningAddress
            ready(address.port!)
            try await withTaskCancellationHandler {
                try await Task.sleep(for: .seconds(1_000_000))
            } onCancel: {
                gateway.shutdown()
            }
        }
    }

    struct Client: EchoClient {
        let client: TetherClient
        let method: String
        let onLoop: Bool
        func echo(_ body: ByteBuffer) async throws -> Int {
            try await self.client.request(self.method, body: body).readableBytes
        }
        var preferredExecutor: (any TaskExecutor)? { self.onLoop ? self.client.taskExecutor : nil }
    }

    static func withClient<R: Sendable>(
        port: Int,
        transport: Endpoint.Transport,
        method: String,
        onLoop: Bool,
        _ body: @escaping @Sendable (any EchoClient) async throws -> R
    ) async throws -> R {
        try await Self.withClient(port: port, transport: transport) { client in
            try await body(Client(client: client, method: method, onLoop: onLoop))
        }
    }

    /// Runs `body` with a client connected to the gateway on `port`.
    static func withClient<R: Sendable>(
        port: Int,
        transport: Endpoint.Transport = .tcp,
        _ body: @escaping @Sendable (TetherClient) async throws -> R
    ) async throws -> R {
        var tls = ClientTLSConfiguration.defaults
        if transport.isSecure { tls.trustRoots = .only(.file(try BenchCertificate.files().certificate)) }
        let client = try TetherClient(
            configuration: .init(endpoints: [Endpoint(host: "127.0.0.1", port: port, transport: transport)], clientID: "bench"),
            transport: try TCPClientTransport(tls: tls),
            logger: Peer.logger
        )
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await client.run() }
            defer { client.shutdown() }
            let result = try await body(client)
            client.shutdown()
            try await group.waitForAll()
            return result
        }
    }
}

// MARK: - HTTP/1.1

enum HTTPPeer {
    static func serve(port: Int, ready: @escaping @Sendable (Int) -> Void) async throws {
        let router = Router()
        router.post("/echo") { request, _ -> Response in
            let body = try await request.body.collect(upTo: 1 << 20)
            return Response(status: .ok, body: .init(byteBuffer: body))
        }
        let app = Application(
            router: router,
            configuration: .init(address: .hostname("127.0.0.1", port: port)),
            onServerRunning: { channel in ready(channel.localAddress!.port!) },
            logger: Peer.logger
        )
        try await app.run()
    }

    struct Client: EchoClient {
        let client: HTTPClient
        let url: String
        func echo(_ body: ByteBuffer) async throws -> Int {
            var request = HTTPClientRequest(url: self.url)
            request.method = .POST
            request.body = .bytes(body)
            let response = try await self.client.execute(request, timeout: .seconds(30))
            return try await response.body.collect(upTo: 1 << 20).readableBytes
        }
    }

    static func withClient<R: Sendable>(port: Int, _ body: @escaping @Sendable (any EchoClient) async throws -> R) async throws -> R {
        var configuration = HTTPClient.Configuration()
        // One connection, as for every peer: HTTP/1.1 then answers one request at a time.
        configuration.connectionPool = .init(idleTimeout: .seconds(60), concurrentHTTP1ConnectionsPerHostSoftLimit: 1)
        let client = HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton, configuration: configuration)
        do {
            let result = try await body(Client(client: client, url: "http://127.0.0.1:\(port)/echo"))
            try await client.shutdown()
            return result
        } catch {
            try? await client.shutdown()
            throw error
        }
    }
}

// MARK: - gRPC

struct BytesCoder: MessageSerializer, MessageDeserializer {
    func serialize<Bytes: GRPCContiguousBytes>(_ message: [UInt8]) throws -> Bytes { Bytes(message) }
    func deserialize<Bytes: GRPCContiguousBytes>(_ serializedMessageBytes: Bytes) throws -> [UInt8] {
        serializedMessageBytes.withUnsafeBytes { Array($0) }
    }
}

enum GRPCPeer {
    static let unary = MethodDescriptor(fullyQualifiedService: "tether.bench.Echo", method: "Unary")
    static let stream = MethodDescriptor(fullyQualifiedService: "tether.bench.Echo", method: "Stream")

    /// Echoes every message of every call, unary or streaming.
    struct EchoService: RegistrableRPCService {
        func registerMethods<Transport: ServerTransport>(with router: inout RPCRouter<Transport>) {
            for method in [GRPCPeer.unary, GRPCPeer.stream] {
                router.registerHandler(forMethod: method, deserializer: BytesCoder(), serializer: BytesCoder()) { request, _ in
                    StreamingServerResponse(of: [UInt8].self) { writer in
                        for try await message in request.messages { try await writer.write(message) }
                        return [:]
                    }
                }
            }
        }
    }

    static func serve(port: Int, ready: @escaping @Sendable (Int) -> Void) async throws {
        let transport = HTTP2ServerTransport.Posix(
            address: .ipv4(host: "127.0.0.1", port: port),
            transportSecurity: .plaintext
        )
        try await withGRPCServer(transport: transport, services: [EchoService()]) { server in
            guard let address = try await server.listeningAddress?.ipv4 else { throw CancellationError() }
            ready(address.port)
            try await Task.sleep(for: .seconds(1_000_000))
        }
    }

    struct UnaryClient: EchoClient {
        let client: GRPCClient<HTTP2ClientTransport.Posix>
        func echo(_ body: ByteBuffer) async throws -> Int {
            try await self.client.unary(
                request: ClientRequest(message: Array(buffer: body)),
                descriptor: GRPCPeer.unary,
                serializer: BytesCoder(),
                deserializer: BytesCoder(),
                options: .defaults
            ) { response in try response.message.count }
        }
    }

    static func withClient<R: Sendable>(
        port: Int,
        streaming: Bool,
        _ body: @escaping @Sendable (any EchoClient) async throws -> R
    ) async throws -> R {
        let transport = try HTTP2ClientTransport.Posix(
            target: .ipv4(address: "127.0.0.1", port: port),
            transportSecurity: .plaintext
        )
        return try await withGRPCClient(transport: transport) { client in
            guard streaming else { return try await body(UnaryClient(client: client)) }
            // One stream for the whole run; calls are told apart by their request id.
            let correlator = Correlator()
            let (outgoing, sink) = AsyncStream.makeStream(of: ByteBuffer.self)
            return try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    do {
                        try await client.bidirectionalStreaming(
                            request: StreamingClientRequest(of: [UInt8].self) { writer in
                                for await message in outgoing { try await writer.write(Array(buffer: message)) }
                            },
                            descriptor: GRPCPeer.stream,
                            serializer: BytesCoder(),
                            deserializer: BytesCoder(),
                            options: .defaults
                        ) { response in
                            for try await message in response.messages { correlator.answered(ByteBuffer(bytes: message)) }
                        }
                        correlator.failAll(CancellationError())
                    } catch {
                        correlator.failAll(error)
                    }
                }
                let result = try await body(CorrelatedClient(correlator: correlator) { sink.yield($0) })
                sink.finish()
                try await group.waitForAll()
                return result
            }
        }
    }
}

// MARK: - Correlation over one ordered stream (gRPC streaming, WebSocket)

/// Matches answers to calls by an 8-byte request id in front of each message, as an app does
/// over a WebSocket by hand.
final class Correlator: Sendable {
    private struct State {
        var nextID: UInt64 = 1
        var waiting: [UInt64: CheckedContinuation<Int, any Error>] = [:]
        var failure: (any Error)?
    }
    private let state = NIOLockedValueBox(State())

    /// Registers a call, then hands its framed message to `send` (under the lock, so that ids
    /// go out in order).
    func call(_ body: ByteBuffer, send: (ByteBuffer) -> Void) async throws -> Int {
        try await withCheckedThrowingContinuation { continuation in
            self.state.withLockedValue { state in
                if let failure = state.failure {
                    continuation.resume(throwing: failure)
                    return
                }
                let id = state.nextID
                state.nextID += 1
                state.waiting[id] = continuation
                var message = ByteBuffer()
                message.reserveCapacity(8 + body.readableBytes)
                message.writeInteger(id)
                message.writeImmutableBuffer(body)
                send(message)
            }
        }
    }

    /// An answer arrived: resume its call with the size of the echoed body.
    func answered(_ message: ByteBuffer) {
        var message = message
        guard let id = message.readInteger(as: UInt64.self) else { return }
        let continuation = self.state.withLockedValue { $0.waiting.removeValue(forKey: id) }
        continuation?.resume(returning: message.readableBytes)
    }

    func failAll(_ error: any Error) {
        let waiting = self.state.withLockedValue { state in
            state.failure = error
            defer { state.waiting.removeAll() }
            return state.waiting.values
        }
        for continuation in waiting { continuation.resume(throwing: error) }
    }
}

struct CorrelatedClient: EchoClient {
    let correlator: Correlator
    let send: @Sendable (ByteBuffer) -> Void
    func echo(_ body: ByteBuffer) async throws -> Int {
        try await self.correlator.call(body, send: self.send)
    }
}

// MARK: - WebSocket

enum WebSocketPeer {
    static func serve(port: Int, ready: @escaping @Sendable (Int) -> Void) async throws {
        let router = Router(context: BasicWebSocketRequestContext.self)
        router.ws("/echo") { _, _ in
            .upgrade()
        } onUpgrade: { inbound, outbound, _ in
            for try await message in inbound.messages(maxSize: 1 << 20) {
                if case .binary(let buffer) = message { try await outbound.write(.binary(buffer)) }
            }
        }
        let app = Application(
            router: Router(),
            server: .http1WebSocketUpgrade(webSocketRouter: router),
            configuration: .init(address: .hostname("127.0.0.1", port: port)),
            onServerRunning: { channel in ready(channel.localAddress!.port!) },
            logger: Peer.logger
        )
        try await app.run()
    }

    static func withClient<R: Sendable>(port: Int, _ body: @escaping @Sendable (any EchoClient) async throws -> R) async throws -> R {
        let correlator = Correlator()
        let result = NIOLockedValueBox<Result<R, any Error>?>(nil)
        try await WebSocketClient.connect(url: "ws://127.0.0.1:\(port)/echo", logger: Peer.logger) { inbound, outbound, _ in
            let (outgoing, sink) = AsyncStream.makeStream(of: ByteBuffer.self)
            await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask {
                    for await message in outgoing { try await outbound.write(.binary(message)) }
                }
                group.addTask {
                    do {
                        for try await message in inbound.messages(maxSize: 1 << 20) {
                            if case .binary(let buffer) = message { correlator.answered(buffer) }
                        }
                        correlator.failAll(CancellationError())
                    } catch {
                        correlator.failAll(error)
                    }
                }
                let outcome: Result<R, any Error>
                do {
                    outcome = .success(try await body(CorrelatedClient(correlator: correlator) { sink.yield($0) }))
                } catch {
                    outcome = .failure(error)
                }
                result.withLockedValue { $0 = outcome }
                sink.finish()
                group.cancelAll()
            }
        }
        guard let outcome = result.withLockedValue({ $0 }) else { throw CancellationError() }
        return try outcome.get()
    }
}

/// A small seeded generator (SplitMix64): the same bodies in every run.
struct SplitMix64: RandomNumberGenerator {
    private var state: UInt64
    init(seed: UInt64) { self.state = seed }
    mutating func next() -> UInt64 {
        self.state &+= 0x9E37_79B9_7F4A_7C15
        var z = self.state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
