import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherNIO
import TetherTestSupport
import TetherTesting

/// The integration tests: real sockets, real timers, real concurrency.
///
/// They run one at a time (`.serialized`), so that the stress tests (10,000 requests at once)
/// never share the two CPUs with tests whose assertions involve timeouts. The unit suites of
/// the other test targets run in parallel with them.
@Suite("Integration", .serialized, .timeLimit(.minutes(5)))
struct IntegrationTests {}

/// Starts gateways and clients for a test and tears them down afterwards.
///
/// `withHarness` returns only after every gateway and client it started has shut down and
/// every task it spawned has finished, so a test cannot leak work into the next one.
final class Harness: Sendable {
    private let tasks = NIOLockedValueBox<[Task<Void, Never>]>([])
    private let exitHandlers = NIOLockedValueBox<[@Sendable () -> Void]>([])
    private let recorders = NIOLockedValueBox<[ObjectIdentifier: EventRecorder]>([:])

    /// Runs `operation` in the background until the harness finishes.
    func spawn(_ operation: @escaping @Sendable () async -> Void) {
        let task = Task { await operation() }
        self.tasks.withLockedValue { $0.append(task) }
    }

    /// Runs `handler` when the test body is done (to shut something down).
    func onExit(_ handler: @escaping @Sendable () -> Void) {
        self.exitHandlers.withLockedValue { $0.append(handler) }
    }

    fileprivate func finish() async {
        for handler in self.exitHandlers.withLockedValue({ $0 }).reversed() { handler() }
        for task in self.tasks.withLockedValue({ $0 }) { await task.value }
    }

    /// A gateway on 127.0.0.1 with an ephemeral port, and its endpoint; `routes` registers its
    /// handlers before it starts.
    func gateway(
        port: Int = 0,
        messageStore: (any MessageStore)? = nil,
        configure: (inout GatewayConfiguration) -> Void = { _ in },
        authenticate: Gateway.Authenticator? = nil,
        authenticator: (any ClientAuthenticator)? = nil,
        routes: (Gateway) -> Void = { _ in }
    ) async throws -> (Gateway, Endpoint) {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = .init(host: "127.0.0.1", port: port)
        configure(&configuration)
        let gateway =
            if let authenticate {
                try Gateway(
                    configuration: configuration,
                    messageStore: messageStore,
                    authenticate: authenticate,
                    logger: testLogger("gateway")
                )
            } else {
                try Gateway(
                    configuration: configuration,
                    messageStore: messageStore,
                    authenticator: authenticator,
                    logger: testLogger("gateway")
                )
            }
        routes(gateway)
        self.spawn { try? await gateway.run() }
        self.onExit { gateway.shutdown() }
        let address = try await gateway.listeningAddress
        return (gateway, Endpoint(host: "127.0.0.1", port: address.port!))
    }

    /// A gateway reachable only through a ``LocalNetwork``; `routes` registers its handlers
    /// before it starts.
    func localGateway(
        network: LocalNetwork,
        at endpoint: Endpoint,
        configure: (inout GatewayConfiguration) -> Void = { _ in },
        routes: (Gateway) -> Void = { _ in }
    ) throws -> Gateway {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = nil
        configure(&configuration)
        let gateway = try Gateway(configuration: configuration, logger: testLogger("gateway"))
        routes(gateway)
        network.attach(gateway, at: endpoint)
        self.spawn { try? await gateway.run() }
        self.onExit { gateway.shutdown() }
        return gateway
    }

    /// A running client.
    func client(
        _ endpoints: [Endpoint],
        clientID: String = "test-client",
        transport: (any ClientTransport)? = nil,
        clock: (any Clock<Duration>)? = nil,
        configure: (inout ClientConfiguration) -> Void = { _ in }
    ) throws -> TetherClient {
        var configuration = ClientConfiguration(endpoints: endpoints, clientID: clientID)
        configuration.reconnect.backoff = try Backoff(initial: .milliseconds(20), maximum: .milliseconds(200))
        configure(&configuration)
        let client = try TetherClient(
            configuration: configuration,
            transport: transport ?? TCPClientTransport(),
            clock: clock ?? ContinuousClock(),
            logger: testLogger("client")
        )
        // Subscribe before the client starts, so that `events(of:)` sees its first attempt.
        let recorder = EventRecorder(client, in: self)
        self.recorders.withLockedValue { $0[ObjectIdentifier(client)] = recorder }
        self.spawn { try? await client.run() }
        self.onExit { client.shutdown() }
        return client
    }

    /// Every connection event of a client made by ``client(_:clientID:transport:clock:configure:)``,
    /// from its first attempt on.
    func events(of client: TetherClient) -> EventRecorder {
        guard let recorder = self.recorders.withLockedValue({ $0[ObjectIdentifier(client)] }) else {
            preconditionFailure("events(of:) needs a client made by the harness")
        }
        return recorder
    }
}

/// Runs `body` with a harness; shuts everything down afterwards.
func withHarness(_ body: (Harness) async throws -> Void) async throws {
    let harness = Harness()
    do {
        try await body(harness)
    } catch {
        await harness.finish()
        throw error
    }
    await harness.finish()
}

/// Records a client's connection events for later assertions.
final class EventRecorder: Sendable {
    private let events = NIOLockedValueBox<[ConnectionEvent]>([])

    /// Subscribes to `client`'s events from now on; ``Harness/events(of:)`` has them from the start.
    fileprivate init(_ client: TetherClient, in harness: Harness) {
        let stream = client.events
        harness.spawn {
            for await event in stream { self.events.withLockedValue { $0.append(event) } }
        }
    }

    var all: [ConnectionEvent] { self.events.withLockedValue { $0 } }

    var connects: Int { self.all.filter { if case .connected = $0 { true } else { false } }.count }

    var disconnectReasons: [DisconnectReason] {
        self.all.compactMap { if case .disconnected(let reason) = $0 { reason } else { nil } }
    }
}

/// A gateway handler that waits (for a minute by default) and records whether it started and
/// whether it was cancelled, for tests of timeouts, cancellation and lost connections.
final class WaitingHandler: Sendable {
    private let state = NIOLockedValueBox((started: false, cancelled: false))
    private let duration: Duration

    init(waitsFor duration: Duration = .seconds(60)) {
        self.duration = duration
    }

    var started: Bool { self.state.withLockedValue { $0.started } }
    var cancelled: Bool { self.state.withLockedValue { $0.cancelled } }

    var handler: Gateway.Handler {
        { request, _ in
            self.state.withLockedValue { $0.started = true }
            do {
                try await Task.sleep(for: self.duration)
            } catch {
                self.state.withLockedValue { $0.cancelled = true }
                throw error
            }
            return request.body
        }
    }
}
