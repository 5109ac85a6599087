import AsyncHTTPClient
import Foundation
import NIOCore
import Testing
import Tether
import TetherGateway
import TetherLab
import TetherTestSupport
import TetherTesting

extension IntegrationTests {
    @Suite("The admin listener: /health, /ready and /metrics", .timeLimit(.minutes(2)))
    struct AdminTests {
        static func get(_ url: String) async throws -> (status: Int, body: String) {
            let response = try await HTTPClient.shared.execute(HTTPClientRequest(url: url), timeout: .seconds(10))
            let body = try await response.body.collect(upTo: 64 * 1024)
            return (Int(response.status.code), String(buffer: body))
        }

        @Test("/health and /ready answer while the gateway serves; during a graceful shutdown /ready is 503 'draining'; other paths 404")
        func healthAndReady() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    messageStore: InMemoryMessageStore(),
                    configure: { $0.admin = .init(port: 0) },
                    routes: { gateway in
                        gateway.handle("slow") { _, _ in
                            try await Task.sleep(for: .seconds(2))
                            return ByteBuffer(string: "done")
                        }
                    }
                )
                let admin = "http://127.0.0.1:\(try await gateway.adminAddress.port!)"
                let health = try await Self.get(admin + "/health")
                #expect(health.status == 200)
                let decoded = try JSONDecoder().decode(Gateway.Health.self, from: Data(health.body.utf8))
                #expect(decoded.status == "alive" && !decoded.draining && decoded.open && !decoded.insecureOpen)
                let ready = try await Self.get(admin + "/ready")
                #expect(ready.status == 200 && ready.body.contains("\"ready\":true"), "\(ready)")
                #expect(try await Self.get(admin + "/metrics").status == 404)

                let client = try harness.client([endpoint])
                let slow = Task { try await client.request("slow").string }
                try await eventually("the request is in flight") { gateway.connections.count == 1 }
                try await Task.sleep(for: .milliseconds(200))
                gateway.shutdown()
                let draining = try await Self.get(admin + "/ready")
                #expect(draining.status == 503 && draining.body.contains("draining"), "\(draining)")
                #expect(try await Self.get(admin + "/health").body.contains("\"draining\":true"))
                #expect(try await slow.value == "done", "the request in flight finishes while /ready says draining")
            }
        }

        /// The samples of a Prometheus text exposition, by series (`name{labels}`).
        static func samples(_ text: String) -> [String: Double] {
            MetricsSamples(parsing: text).values
        }

        /// `/metrics` once `condition` holds of its samples (or after 10 s, as it is then).
        static func metrics(_ admin: String, when condition: ([String: Double]) -> Bool) async throws -> [String: Double] {
            let deadline = ContinuousClock.now + .seconds(10)
            while true {
                let samples = Self.samples(try await Self.get(admin + "/metrics").body)
                if condition(samples) || ContinuousClock.now > deadline { return samples }
                try await Task.sleep(for: .milliseconds(20))
            }
        }

        @Test(
            "/metrics counts connections, handshakes, requests by method and status with their latency, pushes, reliable messages and store commits"
        )
        func metrics() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    messageStore: InMemoryMessageStore(),
                    configure: {
                        $0.admin = .init(port: 0)
                        // The gateway's deadline, not the client's timer, ends "slow": a client
                        // whose own timeout fired first would CANCEL it, counted as `cancelled`.
                        $0.timeouts.handler = .milliseconds(300)
                    },
                    metrics: .prometheus(),
                    routes: { gateway in
                        gateway.handleInline("echo") { request, _ in request.body }
                        gateway.handle("refuse") { _, _ in throw RequestError(.invalidRequest, "no") }
                        gateway.handle("slow") { _, _ in
                            try await Task.sleep(for: .seconds(10))
                            return ByteBuffer()
                        }
                        gateway.handle("join") { _, context in ByteBuffer(string: context.join("lobby") ? "in" : "out") }
                        harness.installChatHandler(on: gateway)
                    }
                )
                let admin = "http://127.0.0.1:\(try await gateway.adminAddress.port!)"
                let reliable: (inout ClientConfiguration) -> Void = { $0.reliability = try! .init(outbox: InMemoryOutboxStore()) }
                let alice = try harness.client([endpoint], clientID: "alice", configure: reliable)
                let bob = try harness.client([endpoint], clientID: "bob", configure: reliable)
                let received = DeliveryCollector(bob, in: harness)
                for index in 0..<3 { #expect(try await alice.request("echo", body: ByteBuffer(string: "\(index)")).string == "\(index)") }
                await #expect(throws: TetherError.self) { try await alice.request("refuse") }
                await #expect(throws: TetherError.self) { try await alice.request("nobody.handles.this") }
                await #expect(throws: TetherError.self) { try await alice.request("slow", timeout: .seconds(5)) }
                #expect(try await bob.request("join").string == "in")
                #expect(try gateway.push("news", ByteBuffer(string: "hi"), to: .room("lobby")) == 1)
                for index in 0..<5 {
                    _ = try await alice.send("chat.send", body: ByteBuffer(string: "m\(index)"), conversation: "bob")
                }
                try await eventually("bob has the 5 messages") { received.count == 5 }

                var samples = try await Self.metrics(admin) { $0["tether_reliable_deliveries_acknowledged_total"] == 5 }
                #expect(samples["tether_reliable_deliveries_acknowledged_total"] == 5)
                #expect(samples[#"tether_connections_open{transport="tcp"}"#] == 2)
                #expect(samples[#"tether_connections_accepted_total{transport="tcp"}"#] == 2)
                #expect(samples[#"tether_handshakes_total{result="ok"}"#] == 2)
                #expect(samples[#"tether_requests_total{method="echo",status="ok"}"#] == 3)
                #expect(samples[#"tether_request_duration_seconds_count{method="echo"}"#] == 3)
                #expect(samples[#"tether_requests_total{method="refuse",status="invalid_request"}"#] == 1)
                #expect(samples[#"tether_requests_total{method="unknown",status="unknown_method"}"#] == 1)
                #expect(samples[#"tether_requests_total{method="join",status="ok"}"#] == 1)
                #expect((samples[#"tether_bytes_received_total{transport="tcp"}"#] ?? 0) > 0)
                #expect((samples[#"tether_bytes_sent_total{transport="tcp"}"#] ?? 0) > 0)
                #expect(samples[#"tether_pushes_total{target="room"}"#] == 1)
                #expect(samples["tether_push_fanout_sum"] == 1)
                #expect(samples["tether_reliable_messages_processed_total"] == 5)
                #expect(samples["tether_reliable_deliveries_sent_total"] == 5)
                #expect((samples["tether_store_commit_seconds_count"] ?? 0) >= 1)
                #expect((samples["tether_reliable_batch_messages_sum"] ?? 0) == 5)
                let slow = #"tether_requests_total{method="slow",status="deadline_exceeded"}"#
                samples = try await Self.metrics(admin) { $0[slow] == 1 }
                #expect(samples[slow] == 1, "the timed-out handler's end is counted")
                // No client id, room or topic is a label.
                let text = try await Self.get(admin + "/metrics").body
                for name in ["alice", "bob", "lobby", "news", "chat.message"] { #expect(!text.contains(name), "\(name) is a label") }

                alice.shutdown()
                let closed: ([String: Double]) -> Double = {
                    $0.filter { $0.key.hasPrefix(#"tether_connections_closed_total{transport="tcp""#) }.values.reduce(0, +)
                }
                samples = try await Self.metrics(admin) { closed($0) == 1 }
                #expect(
                    closed(samples) == 1 && samples[#"tether_connections_open{transport="tcp"}"#] == 1,
                    "the closed connection is counted"
                )
            }
        }
    }
}

extension IntegrationTests.AdminTests {
    @Test(
        "/metrics counts channel subscriptions by what they got (from the top, recovered, a gap), recovered publications, channels and their history"
    )
    func channelMetrics() async throws {
        try await withHarness { harness in
            let (gateway, endpoint) = try await harness.gateway(
                configure: {
                    $0.admin = .init(port: 0)
                    $0.channels = try! .init(rules: [
                        .init(pattern: .all, history: try! ChannelRetention(maxCount: 10, maxAge: .seconds(600)))
                    ])
                },
                metrics: .prometheus()
            )
            let admin = "http://127.0.0.1:\(try await gateway.adminAddress.port!)"
            func publish(_ range: ClosedRange<Int>) async throws {
                for index in range { try await gateway.publish(ByteBuffer(string: "m\(index)"), toChannel: "room.lobby") }
            }
            let client = try harness.client([endpoint], clientID: "bob")
            let fromTop = Task { for try await _ in client.subscribe("room.lobby") {} }
            defer { fromTop.cancel() }
            try await publish(1...5)
            let epoch = try await client.history(of: "room.lobby", limit: 1).epoch
            // From offset 2: 3, 4, 5 recovered. From offset 3 once 25 are published and 10 kept: a gap, 16…25 recovered.
            let second = try harness.client([endpoint], clientID: "carol")
            let recovered = IntegrationTests.ClientChannelTests.Reader(
                second.subscribe("room.lobby", from: ChannelPosition(epoch: epoch, offset: 2)),
                in: harness
            )
            try await eventually("carol recovered 3…5") { recovered.bodies == ["m3", "m4", "m5"] }
            try await publish(6...25)
            let third = try harness.client([endpoint], clientID: "dave")
            let gapped = IntegrationTests.ClientChannelTests.Reader(
                third.subscribe("room.lobby", from: ChannelPosition(epoch: epoch, offset: 3)),
                in: harness
            )
            try await eventually("dave is told of the gap, then gets 16…25") { gapped.gaps.count == 1 && gapped.bodies.count == 10 }

            let samples = try await Self.metrics(admin) { $0["tether_channel_history_bytes"] == 30 }
            #expect(samples[#"tether_channel_subscriptions_total{result="top"}"#] == 1)
            #expect(samples[#"tether_channel_subscriptions_total{result="recovered"}"#] == 1)
            #expect(samples[#"tether_channel_subscriptions_total{result="gap"}"#] == 1)
            #expect(samples["tether_channel_recovered_publications_total"] == 13)
            #expect(samples["tether_channels"] == 1)
            #expect(samples["tether_channel_history_bytes"] == 30, "10 kept of 3 bytes each")
            #expect(samples[#"tether_pushes_total{target="channel"}"#] == 25)
        }
    }
}
