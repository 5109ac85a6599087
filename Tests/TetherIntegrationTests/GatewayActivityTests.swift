import NIOConcurrencyHelpers
import NIOCore
import Testing
import TetherTestSupport

@testable import TetherGateway

extension IntegrationTests {
    @Suite("Gateway activity", .timeLimit(.minutes(1)))
    struct GatewayActivityTests {
        /// The tasks connection `id` holds now (its handshake, its handlers, its reliable loops).
        func tasks(of gateway: Gateway, connection id: UInt64) async throws -> Int? {
            guard let handler = gateway.registry.handler(of: id) else { return nil }
            return try await handler.eventLoop.submit { handler.value.machine.tasks }.get()
        }

        @Test("an idle connection holds no task; a request's handler has one while it runs; shutting down leaves nothing counted")
        func idleConnectionsHoldNoTask() async throws {
            try await withHarness { harness in
                let gate = NIOLockedValueBox<CheckedContinuation<Void, Never>?>(nil)
                let (gateway, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handle("echo") { request, _ in request.body }
                    gateway.handle("hold") { request, _ in
                        await withCheckedContinuation { continuation in gate.withLockedValue { $0 = continuation } }
                        return request.body
                    }
                })
                let client = try harness.client([endpoint])
                #expect(try await client.request("echo", body: ByteBuffer(string: "hi")).string == "hi")
                let id = try #require(gateway.connections.first?.id)
                // Accepting counts one; the connection one; the idle connection holds no task.
                try await eventually("only the listener and the connection are counted") { gateway.activity.active == 2 }
                #expect(try await self.tasks(of: gateway, connection: id) == 0)

                async let held = client.request("hold", body: ByteBuffer(string: "held"))
                try await eventually("the handler runs") { gate.withLockedValue { $0 != nil } }
                #expect(try await self.tasks(of: gateway, connection: id) == 1, "the running handler's task is the connection's")
                #expect(gateway.activity.active == 2, "the connection is counted once, whatever runs on it")
                gate.withLockedValue { $0?.resume() }
                #expect(try await held.string == "held")
                try await eventually("the handler's task ended") { (try? await self.tasks(of: gateway, connection: id)) == 0 }

                client.shutdown()
                try await eventually("the closed connection is no longer counted") { gateway.activity.active == 1 }
                gateway.shutdown()
                try await eventually("shutting down releases the listener's count") { gateway.activity.active == 0 }
            }
        }
    }
}
