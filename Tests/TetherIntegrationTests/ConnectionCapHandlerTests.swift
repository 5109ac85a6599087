import NIOCore
import NIOEmbedded
import Testing

@testable import TetherServerAPI

extension IntegrationTests {
    /// The server API's gRPC listener's cap, on an embedded listening channel: the accepted
    /// connections are its reads.
    @Suite("The server API's connection cap")
    struct ConnectionCapHandlerTests {
        /// Counts the reads that reach the socket (first in the pipeline).
        final class Socket: ChannelOutboundHandler {
            typealias OutboundIn = Never
            var reads = 0

            func read(context: ChannelHandlerContext) {
                self.reads += 1
                context.read()
            }
        }

        /// What reaches the accept handler (last in the pipeline).
        final class Accepted: ChannelInboundHandler {
            typealias InboundIn = any Channel
            var channels: [ObjectIdentifier] = []

            func channelRead(context: ChannelHandlerContext, data: NIOAny) {
                self.channels.append(ObjectIdentifier(Self.unwrapInboundIn(data)))
            }
        }

        @Test("three connections in one read with a cap of 2: two pass, the third waits until one closes; reads stop at the cap and resume")
        func burst() throws {
            let listener = EmbeddedChannel()
            let socket = Socket()
            let accepted = Accepted()
            try listener.pipeline.syncOperations.addHandler(socket)
            try listener.pipeline.syncOperations.addHandler(ConnectionCapHandler(maxConnections: 2))
            try listener.pipeline.syncOperations.addHandler(accepted)
            let connections = (0..<3).map { _ in EmbeddedChannel() }
            func id(_ index: Int) -> ObjectIdentifier { ObjectIdentifier(connections[index] as any Channel) }

            listener.read()
            #expect(socket.reads == 1, "below the cap, reads go on")
            for connection in connections { try listener.writeInbound(connection as any Channel) }
            #expect(accepted.channels == [id(0), id(1)], "a read of three: two pass")
            listener.read()
            #expect(socket.reads == 1, "at the cap, no read reaches the socket")

            _ = try connections[0].finish()
            listener.embeddedEventLoop.run()
            #expect(accepted.channels == [id(0), id(1), id(2)], "the waiting connection passes when one closes")
            #expect(socket.reads == 1, "still at the cap: no read")

            _ = try connections[1].finish()
            listener.embeddedEventLoop.run()
            #expect(socket.reads == 2, "below the cap, the read asked for at the cap goes on")
            listener.read()
            #expect(socket.reads == 3, "and the next ones")
            _ = try? connections[2].finish()
            _ = try? listener.finish()
        }

        @Test("the listener closing closes the connections still waiting")
        func listenerCloses() throws {
            let listener = EmbeddedChannel()
            try listener.pipeline.syncOperations.addHandler(ConnectionCapHandler(maxConnections: 1))
            let connections = (0..<2).map { _ in EmbeddedChannel() }
            for connection in connections {
                try connection.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
                try listener.writeInbound(connection as any Channel)
            }
            #expect(connections[1].isActive)
            _ = try? listener.finish()
            listener.embeddedEventLoop.run()
            #expect(!connections[1].isActive, "the waiting one is closed")
            _ = try? connections[0].finish()
        }
    }
}
