public import NIOCore
import NIOPosix
public import TetherCore

/// The TCP transport: one TCP connection per Tether connection, with Nagle's algorithm off.
///
/// ```swift
/// let client = try TetherClient(configuration: config, transport: TCPClientTransport())
/// ```
public struct TCPClientTransport: ClientTransport {
    public init() {}

    public func connect(
        to endpoint: Endpoint,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel) throws -> Void
    ) async throws -> any Channel {
        try await ClientBootstrap(group: eventLoop)
            .connectTimeout(TimeAmount(timeout))
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try TetherFraming.addHandlers(to: channel.pipeline.syncOperations)
                    try initializer(channel)
                }
            }
            .connect(host: endpoint.host, port: endpoint.port)
            .get()
    }
}
