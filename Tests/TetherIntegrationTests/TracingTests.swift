import Foundation
import InMemoryTracing
import NIOCore
import Testing
import Tether
import TetherGateway
import TetherTestSupport
import Tracing

extension IntegrationTests {
    @Suite("Tracing", .timeLimit(.minutes(2)))
    struct TracingTests {
        @Test(
            "a request is one trace: the client's span, the gateway's span as its child (across the wire), the handler's own span under that"
        )
        func request() async throws {
            try await withHarness { harness in
                let tracer = InMemoryTracer()
                let (_, endpoint) = try await harness.gateway(tracer: tracer) { gateway in
                    gateway.handle("orders.place") { request, _ in
                        // The handler's own work, traced with the context the gateway's span set.
                        tracer.withSpan("database.insert") { _ in request.body }
                    }
                    gateway.handleInline("orders.peek") { _, _ in throw RequestError(.permissionDenied, "no") }
                    gateway.handleInline("orders.count") { _, _ in tracer.withSpan("cache.read") { _ in ByteBuffer(string: "3") } }
                }
                let client = try harness.client([endpoint], tracer: tracer)
                #expect(try await client.request("orders.place", body: ByteBuffer(string: "1 book")).string == "1 book")
                await #expect(throws: TetherError.self) { try await client.request("orders.peek") }

                let spans = tracer.finishedSpans
                let clientSpan = try #require(spans.first { $0.operationName == "orders.place" && $0.kind == .client })
                let serverSpan = try #require(spans.first { $0.operationName == "orders.place" && $0.kind == .server })
                let handlerSpan = try #require(spans.first { $0.operationName == "database.insert" })
                #expect(serverSpan.traceID == clientSpan.traceID && handlerSpan.traceID == clientSpan.traceID, "one trace")
                #expect(serverSpan.parentSpanID == clientSpan.spanID, "the gateway's span is the client's child")
                #expect(handlerSpan.parentSpanID == serverSpan.spanID, "the handler's span is the gateway's child")
                #expect(serverSpan.attributes["rpc.method"]?.toSpanAttribute() == "orders.place".toSpanAttribute())

                let refused = try #require(spans.first { $0.operationName == "orders.peek" && $0.kind == .server })
                let refusedClient = try #require(spans.first { $0.operationName == "orders.peek" && $0.kind == .client })
                #expect(refused.parentSpanID == refusedClient.spanID)
                #expect(refused.status?.code == .error, "an inline handler's refusal marks its span")
                #expect(refusedClient.traceID != clientSpan.traceID, "each request is a trace of its own")

                // An inline handler runs in its request's span as a task handler does.
                #expect(try await client.request("orders.count").string == "3")
                let inlineSpans = tracer.finishedSpans
                let counted = try #require(inlineSpans.first { $0.operationName == "orders.count" && $0.kind == .server })
                let cacheSpan = try #require(inlineSpans.first { $0.operationName == "cache.read" })
                #expect(cacheSpan.parentSpanID == counted.spanID, "the inline handler's span is the gateway's child")
                #expect(counted.status == nil, "an ok request's span carries no error")
            }
        }

        @Test("a reliable message is one trace: the sender's producer span, the gateway's consumer span as its child")
        func message() async throws {
            try await withHarness { harness in
                let tracer = InMemoryTracer()
                let (_, endpoint) = try await harness.gateway(messageStore: InMemoryMessageStore(), tracer: tracer) { gateway in
                    gateway.onMessage("chat.send") { _, _ in }
                }
                let client = try harness.client([endpoint], clientID: "alice", tracer: tracer) {
                    $0.reliability = try! .init(outbox: InMemoryOutboxStore())
                }
                let receipt = try await client.send("chat.send", body: ByteBuffer(string: "hi"), conversation: "bob")
                #expect(await client.outcome(of: receipt) == .acknowledged)
                try await eventually("the gateway's span ended") {
                    tracer.finishedSpans.contains { $0.operationName == "chat.send" && $0.kind == .consumer }
                }
                let spans = tracer.finishedSpans
                let producer = try #require(spans.first { $0.operationName == "chat.send" && $0.kind == .producer })
                let consumer = try #require(spans.first { $0.operationName == "chat.send" && $0.kind == .consumer })
                #expect(consumer.traceID == producer.traceID)
                #expect(consumer.parentSpanID == producer.spanID)
            }
        }

        @Test("without a client tracer the gateway's span starts a trace of its own; without a gateway tracer nothing is traced there")
        func oneSide() async throws {
            try await withHarness { harness in
                let gatewayTracer = InMemoryTracer()
                let (_, traced) = try await harness.gateway(tracer: gatewayTracer) { gateway in
                    gateway.handleInline("echo") { request, _ in request.body }
                }
                let untracedClient = try harness.client([traced])
                _ = try await untracedClient.request("echo")
                let server = try #require(gatewayTracer.finishedSpans.first { $0.kind == .server })
                #expect(server.parentSpanID == nil)

                let clientTracer = InMemoryTracer()
                let (_, untraced) = try await harness.gateway(routes: { gateway in
                    gateway.handleInline("echo") { request, _ in request.body }
                })
                let tracedClient = try harness.client([untraced], tracer: clientTracer)
                _ = try await tracedClient.request("echo")
                #expect(clientTracer.finishedSpans.map(\.kind) == [.client])
            }
        }
    }
}
