import Foundation
import MetricsTestKit
import NIOCore
import Testing
import Tether
import TetherGateway
import TetherTestSupport
import TetherTesting

extension IntegrationTests {
    @Suite("Client statistics, metrics and alerts", .timeLimit(.minutes(2)))
    struct ClientStatisticsTests {
        @Test(
            "a snapshot counts attempts, reconnections, round trips, bytes, requests and time connected; a flap raises one alert; the metrics agree"
        )
        func statistics() async throws {
            try await withHarness { harness in
                let (gateway, upstream) = try await harness.gateway(routes: { gateway in
                    gateway.handleInline("echo") { request, _ in request.body }
                })
                let proxy = TCPFaultProxy(upstream: upstream)
                let endpoint = Endpoint(host: "127.0.0.1", port: try await proxy.start().port!)
                harness.onExit { proxy.cutAll() }
                let metrics = TestMetrics()
                let client = try harness.client([endpoint], metrics: metrics) {
                    $0.heartbeat.interval = .milliseconds(100)
                    $0.alerts = try! .init(window: .seconds(30), reconnects: 1, heartbeatLosses: nil)
                }
                let events = harness.events(of: client)
                for _ in 0..<3 { _ = try await client.request("echo", body: ByteBuffer(string: "hello")) }
                await #expect(throws: TetherError.self) { try await client.request("nobody.handles.this") }
                try await eventually("a PING was answered") { client.statistics.roundTrip != nil }

                proxy.cutAll()  // the connection drops; the client connects again
                try await eventually("connected again") { client.statistics.connects == 2 && gateway.connections.count == 1 }
                try await eventually("the flap raised an alert") {
                    events.all.contains { if case .alert(.reconnects(count: 1, _)) = $0 { true } else { false } }
                }

                let statistics = client.statistics
                #expect(statistics.connectAttempts >= 2)
                #expect(statistics.reconnects == 1 && statistics.disconnects == 1)
                #expect(statistics.requests == 4 && statistics.requestsFailed == 1 && statistics.requestsTimedOut == 0)
                #expect(statistics.heartbeatsSent >= 1 && statistics.heartbeatsLost == 0)
                #expect(statistics.smoothedRoundTrip != nil && statistics.heartbeatInterval != nil)
                #expect(statistics.bytesSent > 100 && statistics.bytesReceived > 100)
                #expect(statistics.currentTransport == .tcp && (statistics.timeConnected[.tcp] ?? .zero) > .zero)
                #expect(statistics.alerts == 1)
                #expect(events.all.filter { if case .alert = $0 { true } else { false } }.count == 1, "one alert per episode")

                #expect(metrics.counterTotal(label: "tether_client_connects_total") == 2)
                #expect(metrics.counterTotal(label: "tether_client_disconnects_total") == 1)
                #expect(try metrics.expectCounter("tether_client_requests_total", [("outcome", "ok")]).totalValue == 3)
                // Heartbeats keep writing: the counter and the snapshot are read at slightly different times.
                try await eventually("the bytes metric agrees with the snapshot") {
                    metrics.counterTotal(label: "tether_client_bytes_sent_total") == Int64(client.statistics.bytesSent)
                }
                #expect(metrics.counterTotal(label: "tether_client_alerts_total") == 1)
                #expect(try metrics.expectTimer("tether_client_round_trip_seconds").values.count >= 1)
            }
        }

        @Test("reliable messages: first transmissions, acknowledgements and the outbox's depth")
        func messages() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    messageStore: InMemoryMessageStore(),
                    routes: { gateway in
                        gateway.onMessage("chat.send") { _, _ in }
                    }
                )
                let client = try harness.client([endpoint], clientID: "alice") {
                    $0.reliability = try! .init(outbox: InMemoryOutboxStore())
                }
                var receipts: [MessageReceipt] = []
                for index in 0..<5 {
                    receipts.append(try await client.send("chat.send", body: ByteBuffer(string: "\(index)"), conversation: "bob"))
                }
                for receipt in receipts { #expect(await client.outcome(of: receipt) == .acknowledged) }
                try await eventually("every message counted") { client.statistics.messagesAcknowledged == 5 }
                let statistics = client.statistics
                #expect(statistics.messagesSent == 5 && statistics.messagesExpired == 0)
                #expect(statistics.outboxDepth == 0)
                #expect(statistics.estimatedLoss == Double(statistics.messagesRetransmitted) / Double(5 + statistics.messagesRetransmitted))
            }
        }
    }
}
