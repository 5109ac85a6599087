import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import ServiceLifecycle
import Testing
import Tether
import TetherGateway
import TetherOTel

/// An OTLP/HTTP collector stand-in: keeps the JSON bodies POSTed to it.
final class Collector: ChannelInboundHandler, @unchecked Sendable {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    static let received = NIOLockedValueBox<[(path: String, body: Data)]>([])
    private var path = ""
    private var body = ByteBuffer()

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch Self.unwrapInboundIn(data) {
        case .head(let head):
            self.path = head.uri
            self.body.clear()
        case .body(var bytes):
            self.body.writeBuffer(&bytes)
        case .end:
            let received = (self.path, Data(self.body.readableBytesView))
            Self.received.withLockedValue { $0.append(received) }
            var headers = HTTPHeaders()
            headers.add(name: "Content-Type", value: "application/json")
            headers.add(name: "Content-Length", value: "2")
            context.write(Self.wrapOutboundOut(.head(.init(version: .http1_1, status: .ok, headers: headers))), promise: nil)
            context.write(Self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "{}")))), promise: nil)
            context.writeAndFlush(Self.wrapOutboundOut(.end(nil)), promise: nil)
        }
    }

    static func start() async throws -> any Channel {
        try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline()
                    try channel.pipeline.syncOperations.addHandler(Collector())
                }
            }
            .bind(host: "127.0.0.1", port: 0)
            .get()
    }
}

@Suite("OpenTelemetry export")
struct TetherOTelTests {
    @Test("a request's client and gateway spans reach an OTLP/HTTP collector as one trace, and the gateway's metrics with them")
    func export() async throws {
        let collector = try await Collector.start()
        defer { collector.close(promise: nil) }
        let endpoint = "http://127.0.0.1:\(collector.localAddress!.port!)"
        let observability = try TetherOTel.backends(
            serviceName: "tether-test",
            endpoint: endpoint,
            json: true,
            exportInterval: .milliseconds(200)
        )

        var configuration = GatewayConfiguration.defaults
        configuration.listen = .init(host: "127.0.0.1", port: 0)
        let gateway = try Gateway(configuration: configuration, metrics: .factory(observability.metrics), tracer: observability.tracer)
        gateway.handle("orders.place") { request, _ in request.body }
        let group = ServiceGroup(services: [observability.service, gateway], logger: Logger(label: "test"))
        try await withThrowingTaskGroup(of: Void.self) { tasks in
            tasks.addTask { try await group.run() }
            let port = try await gateway.listeningAddress.port!
            let client = try TetherClient(
                configuration: .init(endpoints: [Endpoint(host: "127.0.0.1", port: port)], clientID: "alice"),
                tracer: observability.tracer
            )
            tasks.addTask { try await client.run() }
            #expect(try await client.request("orders.place", body: ByteBuffer(string: "1 book")) == ByteBuffer(string: "1 book"))

            // The spans arrive within a few export intervals.
            var spans: [[String: Any]] = []
            let deadline = ContinuousClock.now + .seconds(20)
            while ContinuousClock.now < deadline {
                spans = Self.spans(named: "orders.place")
                if spans.count >= 2 { break }
                try await Task.sleep(for: .milliseconds(100))
            }
            let client_ = spans.first { ($0["kind"] as? Int) == 3 }  // SPAN_KIND_CLIENT
            let server = spans.first { ($0["kind"] as? Int) == 2 }  // SPAN_KIND_SERVER
            #expect(
                client_ != nil && server != nil,
                "spans: \(spans); requests received: \(Collector.received.withLockedValue { $0.map(\.path) })"
            )
            if let client_, let server {
                #expect(server["traceId"] as? String == client_["traceId"] as? String, "one trace")
                #expect(server["parentSpanId"] as? String == client_["spanId"] as? String, "the gateway's span is the client's child")
            }
            try await Task.sleep(for: .milliseconds(600))
            let metrics = Collector.received.withLockedValue { $0.filter { $0.path.hasSuffix("/v1/metrics") } }
            #expect(metrics.contains { String(decoding: $0.body, as: UTF8.self).contains("tether_requests_total") })
            client.shutdown()
            await group.triggerGracefulShutdown()
            try await tasks.waitForAll()
        }
    }

    /// The spans named `name` in what the collector received (OTLP/JSON).
    static func spans(named name: String) -> [[String: Any]] {
        var found: [[String: Any]] = []
        for (path, body) in Collector.received.withLockedValue({ $0 }) where path.hasSuffix("/v1/traces") {
            guard let json = try? JSONSerialization.jsonObject(with: body) as? [String: Any] else { continue }
            for resource in json["resourceSpans"] as? [[String: Any]] ?? [] {
                for scope in resource["scopeSpans"] as? [[String: Any]] ?? [] {
                    for span in scope["spans"] as? [[String: Any]] ?? [] where span["name"] as? String == name { found.append(span) }
                }
            }
        }
        return found
    }
}
