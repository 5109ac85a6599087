import NIOConcurrencyHelpers
import NIOCore
import Testing
import Tether
import TetherGateway

extension IntegrationTests {
    /// The README's examples, verbatim except for the port, so that they keep compiling and working.
    @Suite("README examples")
    struct ReadmeExamplesTests {
        @Test("the gateway and client examples work together")
        func examples() async throws {
            // --- README: "A gateway in ten lines" (listening on an ephemeral port here) ---
            var configuration = GatewayConfiguration.defaults
            configuration.listen = .init(host: "127.0.0.1", port: 0)
            let gateway = try Gateway(configuration: configuration, logger: testLogger("readme-gateway"))
            gateway.handle("echo") { request, _ in request.body }
            gateway.handle("room.enter") { request, context in
                let room = String(buffer: request.body)
                context.join(room)
                try context.gateway.push("room.joined", ByteBuffer(string: context.connection.clientID), to: .room(room))
                return ByteBuffer(string: "welcome to \(room)")
            }
            let gatewayRun = Task { try await gateway.run() }
            let port = try await gateway.listeningAddress.port!

            // --- README: "A client in ten lines" ---
            let printed = NIOLockedValueBox<[String]>([])
            @Sendable func print(_ text: String) { printed.withLockedValue { $0.append(text) } }

            let client = try TetherClient(configuration: .init(endpoints: [Endpoint(host: "127.0.0.1", port: port)], clientID: "alice"))
            try await withThrowingDiscardingTaskGroup { group in
                group.addTask { try await client.run() }  // connects, heartbeats, reconnects
                group.addTask { for await push in client.pushes(topic: "room.joined") { print(String(buffer: push.body)) } }
                let reply = try await client.request("echo", body: ByteBuffer(string: "hi"), timeout: .seconds(3))
                print(String(buffer: reply))
                print(String(buffer: try await client.request("room.enter", body: ByteBuffer(string: "lobby"))))
                try await eventually("the push arrives") { printed.withLockedValue { $0.count == 3 } }
                client.shutdown()  // graceful: in-flight requests finish
            }
            #expect(Set(printed.withLockedValue { $0 }) == ["hi", "welcome to lobby", "alice"])

            // --- README: "Errors" (after the client shut down, every call fails) ---
            let body = ByteBuffer(string: "lobby")
            var outcome = "none"
            do {
                _ = try await client.request("room.enter", body: body, timeout: .seconds(3))
            } catch  where error.code == .timedOut {
                outcome = "timed out"
            } catch  where error.code == .serverError && error.status == .permissionDenied {
                outcome = "denied"
            } catch  where error.code == .connectionLost {
                outcome = "lost"
            } catch {
                outcome = "\(error.code)"
            }
            #expect(outcome == "shut down")
            gateway.shutdown()
            try await gatewayRun.value
        }
    }
}
