import Logging
import NIOCore
import TetherCore
import TetherNIO

/// Everything a gateway's connections share, fixed when the gateway starts: its configuration,
/// the frozen ``Router``, the registry of connections, the message store and what reliable
/// delivery shares across connections. Each connection's handler gets this one value (and its
/// event loop's executor and push batcher), instead of reaching into the ``Gateway``.
final class GatewayServices: Sendable {
    /// The gateway, for the application's handlers (``RequestContext/gateway``).
    unowned let gateway: Gateway
    let configuration: GatewayConfiguration
    let router: Router
    let registry: ConnectionRegistry
    /// What ``Gateway/run()`` waits for: the listener and each connection, until its tasks ended.
    let activity: ActivityTracker
    let authenticator: (any ClientAuthenticator)?
    /// Where reliable delivery keeps its state; `nil` disables it.
    let messageStore: (any MessageStore)?
    let outboxLanes: OutboxLanes
    let deliveryNotifier: DeliveryNotifier
    let admission: ConnectionAdmission
    let refusalLog: RateLimitedLog
    /// What the gateway offers in WELCOME.
    let handshakePolicy: Handshake.GatewayPolicy
    /// With ``GatewayConfiguration/Execution-swift.enum/eventLoop``, the task executor of each loop.
    let executors: EventLoopTaskExecutors?
    /// The ``PushBatcher`` of each loop of the gateway's group.
    let pushBatchers: [ObjectIdentifier: PushBatcher]
    let logger: Logger

    init(gateway: Gateway, router: Router) {
        self.gateway = gateway
        self.configuration = gateway.configuration
        self.router = router
        self.registry = gateway.registry
        self.activity = gateway.activity
        self.authenticator = gateway.authenticator
        self.messageStore = gateway.messageStore
        self.outboxLanes = gateway.outboxLanes
        self.deliveryNotifier = gateway.deliveryNotifier
        self.admission = gateway.admission
        self.refusalLog = gateway.refusalLog
        self.handshakePolicy = gateway.configuration.handshakePolicy(deliveryEpoch: gateway.messageStore?.epoch)
        self.executors = gateway.executors
        self.pushBatchers = gateway.pushBatchers
        self.logger = gateway.logger
    }

    /// Where a connection's tasks run: its event loop, or the global executor (`nil`).
    func executor(for eventLoop: any EventLoop) -> (any TaskExecutor)? {
        self.executors?.executor(for: eventLoop)
    }

    /// How many reliable deliveries a connection may have unacknowledged.
    var deliveryWindow: Int { self.configuration.limits.deliveryWindow }
}
