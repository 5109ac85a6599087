import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing
import Tether

@testable import TetherCore
@testable import TetherGateway

/// Counts the `read`s that reach the bottom of a pipeline.
private final class ReadCounter: ChannelOutboundHandler {
    typealias OutboundIn = Never
    var reads = 0

    func read(context: ChannelHandlerContext) {
        self.reads += 1
        context.read()
    }
}

@Suite("Gateway connection dispatcher")
struct ConnectionDispatcherTests {
    @Test("reading stops while the channel is not writable and resumes when it is; the gateway counts the connection while it is open")
    func readsHeldWhileNotWritable() throws {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = nil
        let gateway = try Gateway(configuration: configuration, logger: testLogger("gateway"))
        let channel = EmbeddedChannel()
        let counter = ReadCounter()
        let requests = RequestRegistry()
        let protocolHandler = GatewayConnectionHandler(
            configuration: .init(
                handshakeTimeout: .seconds(5),
                handlerTimeout: .seconds(5),
                idleTimeout: .seconds(30),
                shutdownGracePeriod: .seconds(5),
                maxInboundBodySize: 1 << 20,
                maxBufferedOutboundBytes: 4 << 20
            ),
            requests: requests,
            logger: testLogger("gateway-handler")
        )
        let dispatcher = ConnectionDispatcher(
            gateway: gateway,
            id: 1,
            protocolHandler: protocolHandler,
            requests: requests,
            executor: nil,
            logger: testLogger("dispatcher")
        )
        try channel.pipeline.syncOperations.addHandlers(counter, dispatcher)
        #expect(gateway.activity.active == 0)
        try channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
        #expect(gateway.activity.active == 1, "an open connection is counted, and holds no task")

        let before = counter.reads
        channel.read()
        #expect(counter.reads == before + 1)

        channel.isWritable = false
        channel.pipeline.fireChannelWritabilityChanged()
        channel.read()
        channel.read()
        #expect(counter.reads == before + 1, "no read while responses cannot be written")

        channel.isWritable = true
        channel.pipeline.fireChannelWritabilityChanged()
        #expect(counter.reads == before + 2, "the held read goes on once, when the channel is writable again")

        _ = try channel.finish(acceptAlreadyClosed: true)
        #expect(gateway.activity.active == 0, "a closed connection is no longer counted")
    }
}

extension IntegrationTests {
    @Suite("Gateway activity", .timeLimit(.minutes(1)))
    struct GatewayActivityTests {
        @Test("an idle connection holds no task; a request's handler has one while it runs; shutting down leaves nothing counted")
        func idleConnectionsHoldNoTask() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway()
                let gate = NIOLockedValueBox<CheckedContinuation<Void, Never>?>(nil)
                gateway.handle("echo") { request, _ in request.body }
                gateway.handle("hold") { request, _ in
                    await withCheckedContinuation { continuation in gate.withLockedValue { $0 = continuation } }
                    return request.body
                }
                let client = try harness.client([endpoint])
                #expect(try await client.request("echo", body: ByteBuffer(string: "hi")).string == "hi")
                // Accepting counts one; the idle connection one; no task is left behind.
                try await eventually("only the listener and the connection are counted") { gateway.activity.active == 2 }

                async let held = client.request("hold", body: ByteBuffer(string: "held"))
                try await eventually("the handler runs") { gate.withLockedValue { $0 != nil } }
                #expect(gateway.activity.active == 3, "the running handler's task is counted")
                gate.withLockedValue { $0?.resume() }
                #expect(try await held.string == "held")
                try await eventually("the handler's task ended") { gateway.activity.active == 2 }

                client.shutdown()
                try await eventually("the closed connection is no longer counted") { gateway.activity.active == 1 }
                gateway.shutdown()
                try await eventually("shutting down releases the listener's count") { gateway.activity.active == 0 }
            }
        }
    }
}
