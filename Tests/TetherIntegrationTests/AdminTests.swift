import AsyncHTTPClient
import Foundation
import NIOCore
import Testing
import Tether
import TetherGateway
import TetherTestSupport

extension IntegrationTests {
    @Suite("The admin listener: /health and /ready", .timeLimit(.minutes(2)))
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
    }
}
