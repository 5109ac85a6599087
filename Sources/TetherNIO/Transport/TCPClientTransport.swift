public import NIOCore
import NIOPosix
public import TetherCore

/// The TCP transport: one TCP connection per Tether connection, with Nagle's algorithm off.
///
/// ```swift
/// let client = try TetherClient(configuration: config, transport: TCPClientTransport())
/// ```
public struct TCPClientTransport: ClientTransport {
    /// The local IP address connections are made from; `nil` lets the system choose.
    public let sourceAddress: String?
    private let source: SocketAddress?

    /// A transport that lets the system choose each connection's local address.
    public init() {
        self.sourceAddress = nil
        self.source = nil
    }

    /// A transport whose connections leave from `sourceAddress`, on a port the system picks.
    ///
    /// A machine can open about 28,000 connections from one address to one gateway address
    /// and port (Linux's default ephemeral port range); a load generator that needs more uses
    /// several source addresses, e.g. `127.0.0.2`, `127.0.0.3`, … on loopback.
    ///
    /// ```swift
    /// let transport = try TCPClientTransport(sourceAddress: "127.0.0.2")
    /// ```
    /// - Parameter sourceAddress: An IPv4 or IPv6 address literal of this machine.
    /// - Throws: ``ConfigurationError`` if `sourceAddress` is not an IP address.
    public init(sourceAddress: String) throws(ConfigurationError) {
        do {
            self.source = try SocketAddress(ipAddress: sourceAddress, port: 0)
        } catch {
            throw ConfigurationError("the source address must be an IP address, got '\(sourceAddress)'")
        }
        self.sourceAddress = sourceAddress
    }

    public func connect(
        to endpoint: Endpoint,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel, Framing) throws -> Void
    ) async throws -> any Channel {
        var bootstrap = ClientBootstrap(group: eventLoop)
            .connectTimeout(TimeAmount(timeout))
            .channelOption(.tcpOption(.tcp_nodelay), value: 1)
            .channelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    try initializer(channel, .byteStream)
                }
            }
        if let source = self.source {
            bootstrap = bootstrap.bind(to: source)
        }
        return try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
    }
}
