import NIOConcurrencyHelpers
import NIOCore
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherNIO
import TetherTestSupport

extension IntegrationTests {
    @Suite("Several gateway processes on one port, several source addresses", .timeLimit(.minutes(2)))
    struct ScaleOutTests {
        @Test("gateways with reusePort share a port and split its clients; one without it is refused the port")
        func reusePort() async throws {
            try await withHarness { harness in
                let from: (Gateway) -> Void = { gateway in
                    gateway.handle("from") { _, context in ByteBuffer(string: context.connection.remoteAddress ?? "") }
                }
                let (first, endpoint) = try await harness.gateway(configure: { $0.listen?.reusePort = true }, routes: from)
                let (second, shared) = try await harness.gateway(
                    port: endpoint.port,
                    configure: { $0.listen?.reusePort = true },
                    routes: from
                )
                #expect(shared == endpoint)
                let refused = await #expect(throws: GatewayError.self) { _ = try await harness.gateway(port: endpoint.port) }
                #expect(refused?.code == .bindFailed)
                let transport = try TCPClientTransport(sourceAddress: "127.0.0.2")
                #expect(transport.sourceAddress == "127.0.0.2")
                for index in 0..<8 {
                    let client = try harness.client([endpoint], clientID: "client-\(index)", transport: transport)
                    let from = try await client.request("from").string
                    #expect(from.contains("127.0.0.2"), "the gateway sees the source address: \(from)")
                }
                #expect(first.connections.count + second.connections.count == 8, "each client is served by one of the two")
            }
        }

        @Test("a source address must be an IP address")
        func invalidSourceAddress() {
            #expect(throws: ConfigurationError.self) { try TCPClientTransport(sourceAddress: "localhost") }
            #expect(throws: ConfigurationError.self) { try TCPClientTransport(sourceAddress: "") }
        }
    }
}
