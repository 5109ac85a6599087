public import NIOCore
import NIOPosix
public import TetherCore
public import TetherGateway
public import TetherNIO

#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#endif

/// An in-process network: clients reach gateways of the same process through socket pairs,
/// without TCP/IP or ports, and a ``FaultController`` can break the links.
///
/// ```swift
/// let network = LocalNetwork()
/// let endpoint = Endpoint(host: "gateway", port: 1)
/// network.attach(gateway, at: endpoint)
/// let client = try TetherClient(configuration: .init(endpoints: [endpoint], clientID: "a"), transport: network.transport)
/// network.faults.blackhole()   // the client's heartbeat must notice
/// ```
///
/// Each connection is a real pair of connected stream sockets (`socketpair(AF_UNIX)`) driven by
/// SwiftNIO, so flow control, closing and half-open behaviour are those of a kernel socket.
public final class LocalNetwork: Sendable {
    /// Breaks the links of this network.
    public let faults = FaultController()
    private let gateways = TetherLock<[Endpoint: Gateway]>([:])
    private let eventLoopGroup: any EventLoopGroup

    /// - Parameter eventLoopGroup: Where the gateways' ends of the connections run.
    public init(eventLoopGroup: (any EventLoopGroup)? = nil) {
        self.eventLoopGroup = eventLoopGroup ?? MultiThreadedEventLoopGroup.singleton
    }

    /// Makes `gateway` reachable at `endpoint` (the endpoint is only a name here).
    public func attach(_ gateway: Gateway, at endpoint: Endpoint) {
        self.gateways.withLockedValue { $0[endpoint] = gateway }
    }

    /// Makes `endpoint` unreachable: new connections are refused.
    public func detach(_ endpoint: Endpoint) {
        _ = self.gateways.withLockedValue { $0.removeValue(forKey: endpoint) }
    }

    /// The transport clients use to reach this network's gateways.
    public var transport: LocalTransport { LocalTransport(network: self) }

    func connect(
        to endpoint: Endpoint,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel, Framing) throws -> Void
    ) async throws -> any Channel {
        if self.faults.isStalled(endpoint) {
            try await Task.sleep(for: timeout)
            throw ChannelError.connectTimeout(TimeAmount(timeout))
        }
        guard let gateway = self.gateways.withLockedValue({ $0[endpoint] }), !self.faults.isRefused(endpoint) else {
            throw IOError(errnoCode: ECONNREFUSED, reason: "connect to \(endpoint)")
        }
        let (clientSocket, gatewaySocket) = try Self.socketPair()
        let faults = self.faults
        let clientChannel: any Channel
        do {
            clientChannel = try await ClientBootstrap(group: eventLoop)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        faults.track(channel)
                        try channel.pipeline.syncOperations.addHandler(FaultInjectionHandler(faults: faults))
                        try initializer(channel, .byteStream)
                    }
                }
                .withConnectedSocket(clientSocket)
                .get()
        } catch {
            _ = close(clientSocket)
            _ = close(gatewaySocket)
            throw error
        }
        do {
            let gatewayChannel = try await ClientBootstrap(group: self.eventLoopGroup)
                .channelOption(.autoRead, value: false)  // the gateway starts reading once set up
                .withConnectedSocket(gatewaySocket)
                .get()
            try await gateway.accept(gatewayChannel, framing: .byteStream)
        } catch {
            clientChannel.close(promise: nil)
            throw IOError(errnoCode: ECONNREFUSED, reason: "connect to \(endpoint): \(error)")
        }
        return clientChannel
    }

    private static func socketPair() throws -> (CInt, CInt) {
        var sockets: [CInt] = [-1, -1]
        #if canImport(Darwin)
            let result = socketpair(AF_UNIX, SOCK_STREAM, 0, &sockets)
        #else
            let result = socketpair(AF_UNIX, CInt(SOCK_STREAM.rawValue), 0, &sockets)
        #endif
        guard result == 0 else { throw IOError(errnoCode: errno, reason: "socketpair") }
        return (sockets[0], sockets[1])
    }
}

/// The ``ClientTransport`` of a ``LocalNetwork``.
public struct LocalTransport: ClientTransport {
    let network: LocalNetwork

    public func connect(
        to endpoint: Endpoint,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel, Framing) throws -> Void
    ) async throws -> any Channel {
        try await self.network.connect(to: endpoint, timeout: timeout, eventLoop: eventLoop, initializer: initializer)
    }
}
