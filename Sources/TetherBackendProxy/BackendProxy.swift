public import AsyncHTTPClient
import Atomics
import Foundation
public import Logging
import NIOConcurrencyHelpers
import NIOCore
public import ServiceLifecycle
public import TetherCore
public import TetherGateway

/// The event proxy: hands clients' connects, requests and reliable messages to a backend
/// written in any language, over HTTP (`openapi.yaml`'s `webhooks`) or gRPC
/// (`Protos/tether/v1/backend.proto`), as the configuration's URL says (`http://`, `https://`,
/// `grpc://`).
///
/// ```swift
/// let backend = try BackendProxy(configuration: try BackendConfiguration(url: "http://127.0.0.1:5000", connect: true, requests: ["*"]))
/// let gateway = try Gateway(configuration: configuration, messageStore: store, authenticator: backend)
/// backend.install(on: gateway)
/// let group = ServiceGroup(services: [backend, gateway], gracefulShutdownSignals: [.sigterm], logger: logger)
/// ```
///
/// - **connect**: the HELLO's credentials; the answer says who the client is
///   (``ClientAuthenticator``).
/// - **requests**: the body; the answer is the RESPONSE. The call is abandoned when the
///   client's deadline passes or it cancels.
/// - **messages**: with an idempotency key; MESSAGE_ACK leaves only after the backend
///   processed it, and a failure leaves the message to be sent again with the same key: a
///   backend that keeps the keys processes each message once. With
///   ``BackendConfiguration/messageBatch`` above 1, the messages waiting go several to a call
///   (``MessageBatcher``), each with its own key and outcome.
/// - **disconnect**: a notification when an established connection closes, sent once by
///   ``run()`` (at most ``disconnectBuffer`` wait; more are dropped and counted).
///
/// At most ``BackendConfiguration/maxConcurrentCalls`` calls are under way; the rest wait for a
/// slot. After ``BackendConfiguration/Breaker-swift.struct/failures`` failures in a row the
/// breaker opens: calls are answered `unavailable` at once (messages stay unacknowledged), and
/// `/ready` says so, until a probe succeeds.
///
/// Run it in the gateway's service group: over gRPC, ``run()`` keeps the connections to the
/// backend (calls made before it runs wait for it), and it sends the disconnect notifications.
public final class BackendProxy: ClientAuthenticator, Service, Sendable {
    public let configuration: BackendConfiguration
    private let transport: Transport
    private let clock: any TetherClock
    private let logger: Logger
    private let slots: CallSlots
    private let breaker: NIOLockedValueBox<CircuitBreaker>
    private let disconnects: AsyncStream<Disconnected>
    private let disconnectsInput: AsyncStream<Disconnected>.Continuation
    private let droppedDisconnects = ManagedAtomic<Int>(0)
    /// Gathers messages into batch calls when ``BackendConfiguration/messageBatch`` is above 1.
    private let batcher: MessageBatcher<BatchedMessage, Result<MessageOutcome, BackendFailure>>?

    /// The most disconnect notifications waiting to be sent; more are dropped (a backend that
    /// is down or slow must not make the gateway hold an unbounded queue).
    public static let disconnectBuffer = 10_000

    /// A connection that closed, to tell the backend.
    struct Disconnected: Sendable {
        var connection: ConnectionInfo
        var reason: String
    }

    private enum Transport: Sendable {
        case http(HTTPTransport)
        case grpc(any BackendTransport & GRPCConnections)

        var calls: any BackendTransport {
            switch self {
            case .http(let transport): transport
            case .grpc(let transport): transport
            }
        }
    }

    /// - Parameters:
    ///   - configuration: What goes to the backend, and the limits.
    ///   - httpClient: The client whose pool of keep-alive connections carries HTTP calls.
    ///   - clock: The clock of the breaker's delays.
    ///   - logger: Where failures are logged.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidConfiguration`` when a
    ///   gRPC backend's address cannot be used (or gRPC is not available on this system).
    public init(
        configuration: BackendConfiguration,
        httpClient: HTTPClient = .shared,
        clock: any TetherClock = SystemClock(),
        logger: Logger = Logger(label: "tether.backend")
    ) throws(GatewayError) {
        self.configuration = configuration
        self.clock = clock
        self.logger = logger
        self.slots = CallSlots(configuration.maxConcurrentCalls)
        self.batcher = configuration.messageBatch > 1 ? MessageBatcher(maxMessages: configuration.messageBatch) : nil
        self.breaker = NIOLockedValueBox(CircuitBreaker(configuration.breaker))
        (self.disconnects, self.disconnectsInput) = AsyncStream.makeStream(bufferingPolicy: .bufferingOldest(Self.disconnectBuffer))
        if let target = configuration.grpcTarget {
            if #available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *) {
                self.transport = .grpc(
                    try GRPCTransport(host: target.host, port: target.port, tls: target.tls, configuration: configuration)
                )
            } else {
                throw GatewayError(code: .invalidConfiguration, message: "a gRPC backend needs macOS 15 or later")
            }
        } else {
            self.transport = .http(HTTPTransport(client: httpClient, configuration: configuration, logger: logger))
        }
    }

    /// Sends the disconnect notifications, and keeps the connections to a gRPC backend, until
    /// graceful shutdown.
    public func run() async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                await withGracefulShutdownHandler {
                    await self.sendDisconnects()
                } onGracefulShutdown: {
                    self.disconnectsInput.finish()
                }
            }
            switch self.transport {
            case .http:
                try? await gracefulShutdown()
            case .grpc(let transport):
                try await withGracefulShutdownHandler {
                    try await transport.runConnections()
                } onGracefulShutdown: {
                    transport.beginGracefulShutdown()
                }
            }
            try await group.waitForAll()
        }
    }

    /// How many disconnect notifications were dropped because ``disconnectBuffer`` were waiting.
    public var droppedDisconnectNotifications: Int { self.droppedDisconnects.load(ordering: .relaxed) }

    /// Sends each notification once, at most a quarter of the call slots at a time (at least
    /// one), so that requests and messages keep theirs.
    private func sendDisconnects() async {
        let parallel = max(1, self.configuration.maxConcurrentCalls / 4)
        await withTaskGroup(of: Void.self) { group in
            var running = 0
            for await disconnected in self.disconnects {
                if running >= parallel {
                    await group.next()
                    running -= 1
                }
                group.addTask {
                    do throws(BackendFailure) {
                        _ = try await self.guarded { () async throws(BackendFailure) in
                            try await self.transport.calls.disconnected(
                                disconnected.connection,
                                reason: disconnected.reason,
                                timeout: self.configuration.timeout
                            )
                        }
                    } catch {
                        self.logger.debug("a disconnect notification was not sent", metadata: ["error": "\(error.message)"])
                    }
                }
                running += 1
            }
        }
    }

    /// Registers the proxied request methods and message topics on `gateway`, and the
    /// breaker's check on its `/ready`. Call it before the gateway runs.
    public func install(on gateway: Gateway) {
        for pattern in self.configuration.requests {
            let handler: Gateway.Handler = { [self] request, context in try await self.request(request, context) }
            if pattern.hasSuffix("*") {
                gateway.handle(prefix: String(pattern.dropLast()), handler)
            } else {
                gateway.handle(pattern, handler)
            }
        }
        for pattern in self.configuration.messages {
            let handler: Gateway.MessageHandler = { [self] message, context in try await self.message(message, context.connection) }
            if pattern.hasSuffix("*") {
                gateway.onMessage(prefix: String(pattern.dropLast()), handler)
            } else {
                gateway.onMessage(pattern, handler)
            }
        }
        if !self.configuration.channels.isEmpty {
            let patterns = self.configuration.channels
            gateway.authorizeChannels { [self] access, connection in
                let channel: String
                switch access {
                case .subscribe(let name), .publish(let name), .presence(let name): channel = name
                default: return
                }
                guard patterns.contains(where: { $0.matches(channel) }) else { return }
                try await self.authorize(access, channel: channel, connection)
            }
        }
        if self.configuration.disconnect {
            let input = self.disconnectsInput
            let dropped = self.droppedDisconnects
            gateway.onDisconnect { connection, reason in
                if case .dropped = input.yield(Disconnected(connection: connection, reason: reason)) {
                    dropped.wrappingIncrement(ordering: .relaxed)
                }
            }
        }
        gateway.addReadinessCheck { [self] in
            self.breakerIsOpen ? "backend unavailable: \(self.configuration.breaker.failures) calls failed in a row" : nil
        }
    }

    /// Whether the breaker refuses calls now.
    public var breakerIsOpen: Bool {
        let now = self.clock.now
        return self.breaker.withLockedValue { $0.isOpen(now: now) }
    }

    // MARK: Events

    /// Asks the backend who the client of a HELLO is.
    public func authenticate(_ hello: HandshakeInfo) async throws -> ClientIdentity {
        guard self.configuration.connect else {
            throw AuthenticationError(.unauthenticated, "this gateway takes no credentials")
        }
        let outcome: ConnectOutcome
        do {
            outcome = try await self.guarded { () async throws(BackendFailure) in
                try await self.transport.calls.connect(hello, timeout: self.configuration.timeout)
            }
        } catch {
            throw AuthenticationError(.unavailable, "the backend could not check the credentials: \(error.message)")
        }
        switch outcome {
        case .identity(let identity): return identity
        case .refused(let refusal): throw refusal
        }
    }

    /// Asks the backend whether a client may subscribe to, see the presence of, or publish to
    /// a channel; throws ``RequestError`` to refuse (`unavailable` when the backend cannot say:
    /// the check fails closed).
    func authorize(_ access: Access, channel: String, _ connection: ConnectionInfo) async throws(RequestError) {
        let outcome: AuthorizeOutcome
        do {
            outcome = try await self.guarded { () async throws(BackendFailure) in
                try await self.transport.calls.authorize(access, channel: channel, connection, timeout: self.configuration.timeout)
            }
        } catch {
            throw RequestError(.unavailable, "the backend could not check the channel's access: \(error.message)")
        }
        if case .refused(let status, let message) = outcome { throw RequestError(status, message) }
    }

    /// A request for a proxied method: the backend's answer is the response.
    func request(_ request: GatewayRequest, _ context: RequestContext) async throws -> ByteBuffer {
        let timeout = request.timeout > .zero ? request.timeout : self.configuration.timeout
        let outcome: RequestOutcome
        do {
            outcome = try await self.guarded { () async throws(BackendFailure) in
                try await self.transport.calls.request(request, context.connection, timeout: timeout)
            }
        } catch {
            throw RequestError(error.status, error.message)
        }
        switch outcome {
        case .answered(let body): return body
        case .refused(let status, let message): throw RequestError(status, message)
        }
    }

    /// A reliable message on a proxied topic: returns once the backend processed it; throws
    /// ``RequestError`` when it refuses it for good, any other error to leave it unacknowledged.
    func message(_ message: ReliableMessage, _ connection: ConnectionInfo) async throws {
        let outcome: MessageOutcome
        if let batcher = self.batcher {
            outcome = try await batcher.process(
                BatchedMessage(message: message, connection: connection),
                cancelled: .failure(BackendFailure(status: .cancelled, message: "cancelled while waiting for a batch call"))
            ) { batch in
                await self.send(batch)
            }.get()
        } else {
            outcome = try await self.guarded { () async throws(BackendFailure) in
                try await self.transport.calls.message(message, connection, timeout: self.configuration.timeout)
            }
        }
        switch outcome {
        case .processed: return
        case .refused(let status, let message): throw RequestError(status, message)
        case .retry(let reason): throw BackendFailure(status: .unavailable, message: reason)
        }
    }

    /// One batch call, in a slot and through the breaker as any call; one outcome per message.
    private func send(_ batch: [BatchedMessage]) async -> [Result<MessageOutcome, BackendFailure>] {
        do {
            let outcomes = try await self.guarded { () async throws(BackendFailure) in
                try await self.transport.calls.messages(batch, timeout: self.configuration.timeout)
            }
            return outcomes.map { .success($0) }
        } catch {
            return Array(repeating: .failure(error), count: batch.count)
        }
    }

    // MARK: Calls

    /// Makes a call in a slot, through the breaker: a call the transport could not make (it
    /// threw) or whose answer says the backend is down counts as a failure.
    private func guarded<Outcome>(
        _ call: () async throws(BackendFailure) -> Answered<Outcome>
    ) async throws(BackendFailure) -> Outcome {
        let now = self.clock.now
        guard self.breaker.withLockedValue({ $0.allows(now: now) }) else {
            throw BackendFailure(status: .unavailable, message: "the backend is unavailable (its calls failed; retried shortly)")
        }
        do {
            try await self.slots.acquire()
        } catch {
            self.breaker.withLockedValue { $0.abandoned() }
            throw BackendFailure(status: .cancelled, message: "cancelled while waiting for a call slot")
        }
        defer { self.slots.release() }
        do {
            let answered = try await call()
            let later = self.clock.now
            self.breaker.withLockedValue { answered.backendDown ? $0.failed(now: later) : $0.succeeded() }
            return answered.outcome
        } catch {
            if error.status == .cancelled || Task.isCancelled {
                self.breaker.withLockedValue { $0.abandoned() }
                throw BackendFailure(status: .cancelled, message: "the call was cancelled")
            }
            let later = self.clock.now
            self.breaker.withLockedValue { $0.failed(now: later) }
            self.logger.warning("a call to the backend failed", metadata: ["error": "\(error.message)"])
            throw error
        }
    }
}

/// How the proxy reaches the backend: one call per event, its outcome, and whether the answer
/// says the backend is down (for the breaker). A call that gets no answer throws.
protocol BackendTransport: Sendable {
    func connect(_ hello: HandshakeInfo, timeout: Duration) async throws(BackendFailure) -> Answered<ConnectOutcome>
    func request(
        _ request: GatewayRequest,
        _ connection: ConnectionInfo,
        timeout: Duration
    ) async throws(BackendFailure) -> Answered<RequestOutcome>
    func message(
        _ message: ReliableMessage,
        _ connection: ConnectionInfo,
        timeout: Duration
    ) async throws(BackendFailure) -> Answered<MessageOutcome>
    /// Several messages in one call (the batch event); one outcome per message, in order.
    func messages(_ batch: [BatchedMessage], timeout: Duration) async throws(BackendFailure) -> Answered<[MessageOutcome]>
    func disconnected(_ connection: ConnectionInfo, reason: String, timeout: Duration) async throws(BackendFailure) -> Answered<Void>
    func authorize(
        _ access: Access,
        channel: String,
        _ connection: ConnectionInfo,
        timeout: Duration
    ) async throws(BackendFailure) -> Answered<AuthorizeOutcome>
}

/// What the backend says of a channel access.
enum AuthorizeOutcome: Sendable {
    case allowed
    case refused(StatusCode, String)
}

extension Access {
    /// The access's name in the authorize event (`subscribe`, `publish`, `presence`).
    var eventName: String {
        switch self {
        case .subscribe: "subscribe"
        case .publish: "publish"
        case .presence: "presence"
        case .request: "request"
        case .send: "send"
        case .join: "join"
        }
    }
}

/// A transport with connections of its own to keep (gRPC).
protocol GRPCConnections: Sendable {
    func runConnections() async throws
    func beginGracefulShutdown()
}

/// What the backend answered, and whether the answer says it is down (a 502, 503 or 504 over
/// HTTP, UNAVAILABLE over gRPC, without Tether's own status).
struct Answered<Outcome: Sendable>: Sendable {
    var outcome: Outcome
    var backendDown = false
}

enum ConnectOutcome: Sendable {
    case identity(ClientIdentity)
    case refused(AuthenticationError)
}

enum RequestOutcome: Sendable {
    case answered(ByteBuffer)
    case refused(StatusCode, String)
}

enum MessageOutcome: Sendable {
    /// Processed: the message may be acknowledged.
    case processed
    /// Refused for good: the sender's `send` fails with this status.
    case refused(StatusCode, String)
    /// Not processed now: left unacknowledged, it comes again with the same key.
    case retry(String)
}

/// A call that got no answer the gateway can use.
struct BackendFailure: Error, CustomStringConvertible {
    var status: StatusCode
    var message: String
    var description: String { self.message }
}

/// Who the backend says a client is, as either transport reads it.
struct IdentityFields {
    var client: String
    var expiresAt: Int64?
    var rooms: [String]?
    var topics: [String]?
    var channels: [String]?
    var attributes: [String: String]
    var info: String?

    func identity() throws(AuthenticationError) -> ClientIdentity {
        var patterns: [ChannelPattern]?
        if let channels = self.channels {
            do {
                patterns = try channels.map { channel throws(ConfigurationError) in try ChannelPattern(channel) }
            } catch {
                throw AuthenticationError(.unavailable, "the backend's answer has an invalid channel pattern: \(error)")
            }
        }
        return ClientIdentity(
            clientID: self.client,
            expiresAt: self.expiresAt.map { Date(timeIntervalSince1970: TimeInterval($0)) },
            rooms: self.rooms.map(Set.init),
            topics: self.topics.map(Set.init),
            channels: patterns,
            attributes: self.attributes,
            info: self.info
        )
    }
}
