import NIOCore
public import TetherCore
import TetherNIO

/// Breaks the connections of a ``LocalNetwork`` on demand.
///
/// ```swift
/// network.faults.blackhole()        // connections stay open, bytes stop flowing (half-open link)
/// network.faults.blackhole(.toClient) // only replies are lost: requests arrive, answers do not
/// network.faults.dropConnections()  // every connection is cut, as on a network switch
/// network.faults.refuse(endpoint)   // new connections to it fail, as if the gateway were down
/// network.faults.heal()             // all back to normal
/// ```
public final class FaultController: Sendable {
    /// Which way bytes are lost.
    public enum Direction: Sendable, Hashable {
        /// Both ways.
        case both
        /// From the gateway to the client: what the gateway sends is lost.
        case toClient
        /// From the client to the gateway: what the client sends is lost.
        case toGateway
    }

    private struct State {
        var blackholed: Set<Direction> = []
        var refused: Set<Endpoint> = []
        var stalled: Set<Endpoint> = []
        var channels: [ObjectIdentifier: any Channel] = [:]
    }

    private let state = TetherLock(State())

    public init() {}

    /// Silently drops every byte going `direction` on current and new connections, which stay open.
    public func blackhole(_ direction: Direction = .both) {
        self.state.withLockedValue { state in
            switch direction {
            case .both: state.blackholed.formUnion([.toClient, .toGateway])
            case .toClient, .toGateway: state.blackholed.insert(direction)
            }
        }
    }

    /// Closes every current connection.
    public func dropConnections() {
        let channels = self.state.withLockedValue { Array($0.channels.values) }
        for channel in channels { channel.close(promise: nil) }
    }

    /// Makes new connections to `endpoint` fail with "connection refused".
    public func refuse(_ endpoint: Endpoint) { _ = self.state.withLockedValue { $0.refused.insert(endpoint) } }

    /// Makes new connections to `endpoint` hang until the client's connect timeout.
    public func stall(_ endpoint: Endpoint) { _ = self.state.withLockedValue { $0.stalled.insert(endpoint) } }

    /// Removes every fault; connections already closed stay closed.
    public func heal() {
        self.state.withLockedValue { state in
            state.blackholed.removeAll()
            state.refused.removeAll()
            state.stalled.removeAll()
        }
    }

    /// The number of open connections.
    public var openConnections: Int { self.state.withLockedValue { $0.channels.count } }

    func isBlackholed(_ direction: Direction) -> Bool { self.state.withLockedValue { $0.blackholed.contains(direction) } }
    func isRefused(_ endpoint: Endpoint) -> Bool { self.state.withLockedValue { $0.refused.contains(endpoint) } }
    func isStalled(_ endpoint: Endpoint) -> Bool { self.state.withLockedValue { $0.stalled.contains(endpoint) } }

    func track(_ channel: any Channel) {
        let key = ObjectIdentifier(channel)
        self.state.withLockedValue { $0.channels[key] = channel }
        channel.closeFuture.whenComplete { _ in
            self.state.withLockedValue { _ = $0.channels.removeValue(forKey: key) }
        }
    }
}

/// Applies a ``FaultController``'s blackhole to the bytes of one connection.
final class FaultInjectionHandler: ChannelDuplexHandler {
    typealias InboundIn = ByteBuffer
    typealias InboundOut = ByteBuffer
    typealias OutboundIn = ByteBuffer
    typealias OutboundOut = ByteBuffer

    private let faults: FaultController

    init(faults: FaultController) {
        self.faults = faults
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard !self.faults.isBlackholed(.toClient) else { return }
        context.fireChannelRead(data)
    }

    func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard !self.faults.isBlackholed(.toGateway) else {
            promise?.succeed()  // "sent", as far as the sender can tell
            return
        }
        context.write(data, promise: promise)
    }
}

@available(*, unavailable)
extension FaultInjectionHandler: Sendable {}
