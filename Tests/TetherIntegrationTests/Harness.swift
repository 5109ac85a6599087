import CoreMetrics
import Foundation
import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherGatewayTesting
import TetherNIO
import TetherTestSupport
import Tracing

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
/// every task it spawned has finished, so a test cannot leak work into the next one. A test
/// that hangs fails instead of holding up the whole run: see ``withHarness(timeLimit:_:)``.
final class Harness: Sendable {
    private let tasks = NIOLockedValueBox<[Task<Void, Never>]>([])
    /// The tasks spawned and not yet ended, by number: what a hang report names.
    private let running = NIOLockedValueBox<(next: Int, labels: [Int: String])>((0, [:]))
    private let exitHandlers = NIOLockedValueBox<(ran: Bool, handlers: [@Sendable () -> Void])>((false, []))
    private let recorders = NIOLockedValueBox<[ObjectIdentifier: EventRecorder]>([:])
    private let describers = NIOLockedValueBox<[@Sendable () -> String]>([])

    /// Runs `operation` in the background until the harness finishes; `label` names it if it
    /// does not end.
    func spawn(_ label: String = "a task of the test", _ operation: @escaping @Sendable () async -> Void) {
        let number = self.running.withLockedValue { running in
            defer { running.next += 1 }
            running.labels[running.next] = label
            return running.next
        }
        let task = Task {
            await operation()
            self.running.withLockedValue { _ = $0.labels.removeValue(forKey: number) }
        }
        self.tasks.withLockedValue { $0.append(task) }
    }

    /// Adds a line to what a hang report says of the harness's gateways and clients.
    func describe(_ line: @escaping @Sendable () -> String) {
        self.describers.withLockedValue { $0.append(line) }
    }

    /// The tasks still running, and the state of the gateways and clients: what a hang report says.
    var report: String {
        let states = self.describers.withLockedValue { $0 }.map { $0() }
        return "spawned tasks still running: \(self.stillRunning); \(states.joined(separator: "; "))"
    }

    /// Runs `handler` when the test body is done (to shut something down).
    func onExit(_ handler: @escaping @Sendable () -> Void) {
        self.exitHandlers.withLockedValue { $0.handlers.append(handler) }
    }

    /// The labels of the spawned tasks still running, in the order they were spawned.
    var stillRunning: [String] {
        self.running.withLockedValue { running in running.labels.sorted { $0.key < $1.key }.map(\.value) }
    }

    /// Shuts down what the test started, once (the exit handlers run in reverse order).
    fileprivate func shutDown() {
        let handlers = self.exitHandlers.withLockedValue { exit in
            defer { exit.ran = true }
            return exit.ran ? [] : exit.handlers
        }
        for handler in handlers.reversed() { handler() }
    }

    /// Shuts everything down and waits for the spawned tasks, for at most `limit`.
    /// - Returns: `nil` if they all ended, else a report of what did not (it is abandoned).
    fileprivate func finish(within limit: Duration) async -> String? {
        self.shutDown()
        let tasks = self.tasks.withLockedValue { $0 }
        let ended = await firstOf(limit: limit) {
            for task in tasks { await task.value }
        }
        return ended ? nil : self.report
    }

    /// A gateway on 127.0.0.1 with an ephemeral port, and its endpoint; `routes` registers its
    /// handlers before it starts.
    func gateway(
        port: Int = 0,
        transport: Endpoint.Transport = .tcp,
        messageStore: (any MessageStore)? = nil,
        configure: (inout GatewayConfiguration) -> Void = { _ in },
        authenticate: Gateway.Authenticator? = nil,
        authenticator: (any ClientAuthenticator)? = nil,
        metrics: Gateway.Metrics = .system,
        tracer: (any Tracer)? = nil,
        routes: (Gateway) -> Void = { _ in }
    ) async throws -> (Gateway, Endpoint) {
        var configuration = GatewayConfiguration.defaults
        configuration.configureListener(transport, port: port)
        configure(&configuration)
        let gateway =
            if let authenticate {
                try Gateway(
                    configuration: configuration,
                    messageStore: messageStore,
                    authenticate: authenticate,
                    metrics: metrics,
                    tracer: tracer,
                    logger: testLogger("gateway")
                )
            } else {
                try Gateway(
                    configuration: configuration,
                    messageStore: messageStore,
                    authenticator: authenticator,
                    metrics: metrics,
                    tracer: tracer,
                    logger: testLogger("gateway")
                )
            }
        routes(gateway)
        self.spawn("gateway.run() of a gateway on 127.0.0.1") { try? await gateway.run() }
        self.describe { "gateway on 127.0.0.1: \(gateway.connections.count) established connections" }
        self.onExit { gateway.shutdown() }
        let address = try await transport.isHTTP ? gateway.webSocketAddress : gateway.listeningAddress
        return (gateway, Endpoint(host: "127.0.0.1", port: address.port!, transport: transport))
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
        self.spawn("gateway.run() at \(endpoint) on a local network") { try? await gateway.run() }
        self.describe { "gateway at \(endpoint): \(gateway.connections.count) established connections" }
        self.onExit { gateway.shutdown() }
        return gateway
    }

    /// A running client.
    func client(
        _ endpoints: [Endpoint],
        clientID: String = "test-client",
        transport: (any ClientTransport)? = nil,
        clock: (any TetherClock)? = nil,
        tracer: (any Tracer)? = nil,
        metrics: (any MetricsFactory)? = nil,
        configure: (inout ClientConfiguration) -> Void = { _ in }
    ) throws -> TetherClient {
        var configuration = ClientConfiguration(endpoints: endpoints, clientID: clientID)
        configuration.reconnect.backoff = try Backoff(initial: .milliseconds(20), maximum: .milliseconds(200))
        configure(&configuration)
        let client = try TetherClient(
            configuration: configuration,
            transport: transport ?? testClientTransport(),
            clock: clock ?? SystemClock(),
            tracer: tracer,
            metrics: metrics,
            logger: testLogger("client")
        )
        // Subscribe before the client starts, so that `events(of:)` sees its first attempt.
        let recorder = EventRecorder(client, in: self)
        self.recorders.withLockedValue { $0[ObjectIdentifier(client)] = recorder }
        self.spawn("client.run() of '\(clientID)'") { try? await client.run() }
        self.describe { "client '\(clientID)': \(client.connectionState)" }
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
///
/// A hang becomes a failure that names what hung, rather than a run that never ends (a task
/// waiting on something that ignores cancellation outlives the suite's time limit):
/// - if `body` still runs after `timeLimit`, the harness records an issue naming the tasks
///   still running and shuts down its gateways and clients, which usually ends what `body`
///   waits for;
/// - once `body` returned, the spawned tasks (the gateways' and clients' `run()`) get 30 s to
///   end after the shutdown; those that do not are named in an issue and abandoned.
func withHarness(timeLimit: Duration = .seconds(90), _ body: (Harness) async throws -> Void) async throws {
    let harness = Harness()
    let watchdog = Task {
        guard (try? await Task.sleep(for: timeLimit)) != nil else { return }
        Issue.record(
            """
            the test still runs after \(timeLimit); shutting down its gateways and clients. \
            \(harness.report)
            """
        )
        harness.shutDown()
    }
    let failure: (any Error)?
    do {
        try await body(harness)
        failure = nil
    } catch {
        failure = error
    }
    watchdog.cancel()
    if let abandoned = await harness.finish(within: .seconds(30)) {
        Issue.record("30 s after the shutdown, the harness had not finished (what is left is abandoned): \(abandoned)")
    }
    if let failure { throw failure }
}

/// Runs `operation` in a task of its own and waits for it for at most `limit`.
/// - Returns: Whether it ended in time; if not, it is left running.
func firstOf(limit: Duration, _ operation: @escaping @Sendable () async -> Void) async -> Bool {
    let outcome = NIOLockedValueBox<(continuation: CheckedContinuation<Bool, Never>?, result: Bool?)>((nil, nil))
    @Sendable func settle(_ result: Bool) {
        let continuation = outcome.withLockedValue { state -> CheckedContinuation<Bool, Never>? in
            guard state.result == nil else { return nil }
            state.result = result
            defer { state.continuation = nil }
            return state.continuation
        }
        continuation?.resume(returning: result)
    }
    Task {
        await operation()
        settle(true)
    }
    let timer = Task {
        guard (try? await Task.sleep(for: limit)) != nil else { return }
        settle(false)
    }
    let ended = await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
        let early = outcome.withLockedValue { state -> Bool? in
            if state.result == nil { state.continuation = continuation }
            return state.result
        }
        if let early { continuation.resume(returning: early) }
    }
    timer.cancel()
    return ended
}

/// Records a client's connection events for later assertions.
final class EventRecorder: Sendable {
    private let events = NIOLockedValueBox<[ConnectionEvent]>([])

    /// Subscribes to `client`'s events from now on; ``Harness/events(of:)`` has them from the start.
    fileprivate init(_ client: TetherClient, in harness: Harness) {
        let stream = client.events
        harness.spawn("the event recorder of a client") {
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

/// The transport of the tests' clients: every endpoint kind, trusting the test CA.
func testClientTransport(configure: (inout ClientTLSConfiguration) -> Void = { _ in }) throws -> TCPClientTransport {
    var tls = ClientTLSConfiguration(trustRoots: .only(.text(TestCertificates.shared.authority.certificatePEM)))
    configure(&tls)
    return try TCPClientTransport(tls: tls)
}

extension GatewayConfiguration.TLS {
    /// A gateway identity made of a test certificate and its key.
    init(serving identity: TestCertificates.Identity) {
        self.init(certificateChain: .text(identity.certificatePEM), privateKey: .text(identity.keyPEM))
    }
}

extension GatewayConfiguration {
    /// Listens on 127.0.0.1 over `transport` only, with the test certificate for TLS.
    mutating func configureListener(_ transport: Endpoint.Transport, port: Int = 0) {
        let certificates = TestCertificates.shared
        if transport.isSecure { self.tls = .init(serving: certificates.server) }
        switch transport {
        case .tcp, .tls:
            self.listen = .init(host: "127.0.0.1", port: port, tls: transport.isSecure)
            self.webSocket = nil
        case .webSocket, .secureWebSocket, .httpStream, .secureHTTPStream:
            self.listen = nil
            self.webSocket = .init(host: "127.0.0.1", port: port, tls: transport.isSecure)
        }
    }
}
