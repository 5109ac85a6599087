import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2Posix
import NIOCore
import TetherCore
import TetherGRPCProtos
import TetherGateway

/// The proxy's events over gRPC (`Protos/tether/v1/backend.proto`), with grpc-swift 2 and one
/// HTTP/2 connection that carries every call at once: plaintext for `grpc://` (keep the backend
/// on a private network), TLS for `grpcs://`.
///
/// Refusals are gRPC status codes, mapped as `backend.proto` says; UNAVAILABLE without a
/// `tether-status` tells the breaker the backend is down.
@available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *)
final class GRPCTransport: BackendTransport, GRPCConnections {
    private let client: GRPCClient<HTTP2ClientTransport.Posix>
    private let backend: Tether_V1_Backend.Client<HTTP2ClientTransport.Posix>
    private let metadata: Metadata

    init(host: String, port: Int, tls: Bool, configuration: BackendConfiguration) throws(GatewayError) {
        let transport: HTTP2ClientTransport.Posix
        let security: HTTP2ClientTransport.Posix.TransportSecurity
        if tls {
            // Full verification: the backend's certificate must be signed by a trusted authority
            // and name HOST.
            security = .tls { config in
                if let caFile = configuration.caFile { config.trustRoots = .certificates([.file(path: caFile, format: .pem)]) }
            }
        } else {
            security = .plaintext
        }
        do {
            transport = try HTTP2ClientTransport.Posix(
                target: Self.target(host: host, port: port),
                transportSecurity: security,
                config: .defaults { config in
                    config.connection.maxIdleTime = nil
                }
            )
        } catch {
            throw GatewayError(code: .invalidConfiguration, message: "the gRPC backend \(host):\(port) cannot be used: \(error)")
        }
        self.client = GRPCClient(transport: transport)
        self.backend = Tether_V1_Backend.Client(wrapping: self.client)
        var metadata = Metadata()
        if let authorization = configuration.authorization { metadata.addString(authorization, forKey: "authorization") }
        self.metadata = metadata
    }

    /// An IP address as itself (over TLS, its certificate must name that address: an address
    /// cannot be sent as the server's name), a name through DNS.
    private static func target(host: String, port: Int) -> any ResolvableTarget {
        if host.contains(":") { return .ipv6(address: host, port: port) }
        let parts = host.split(separator: ".", omittingEmptySubsequences: false)
        if parts.count == 4, parts.allSatisfy({ UInt8($0) != nil }) { return .ipv4(address: host, port: port) }
        return .dns(host: host, port: port)
    }

    func runConnections() async throws {
        try await self.client.runConnections()
    }

    func beginGracefulShutdown() {
        self.client.beginGracefulShutdown()
    }

    func connect(_ hello: HandshakeInfo, timeout: Duration) async throws(BackendFailure) -> Answered<ConnectOutcome> {
        var event = Tether_V1_ConnectEvent()
        event.client = hello.clientID
        if let token = hello.authToken { event.token = Data(token.readableBytesView) }
        if let userAgent = hello.userAgent { event.userAgent = userAgent }
        if let address = hello.remoteAddress { event.remoteAddress = address }
        let reply: Tether_V1_Identity
        do {
            reply = try await self.backend.connect(event, metadata: self.metadata, options: Self.options(timeout))
        } catch let error as RPCError {
            switch error.code {
            case .unauthenticated:
                return Answered(
                    outcome: .refused(AuthenticationError(.unauthenticated, Self.text(error, or: "the backend refused the credentials")))
                )
            case .permissionDenied:
                return Answered(
                    outcome: .refused(AuthenticationError(.permissionDenied, Self.text(error, or: "the backend refused the client")))
                )
            default:
                throw Self.failure(error)
            }
        } catch {
            throw Self.failure(error)
        }
        let fields = IdentityFields(
            client: reply.client,
            expiresAt: reply.hasExpiresAt ? reply.expiresAt : nil,
            rooms: reply.hasRooms ? reply.rooms.names : nil,
            topics: reply.hasTopics ? reply.topics.names : nil,
            channels: reply.hasChannels ? reply.channels.names : nil,
            attributes: reply.attributes,
            info: reply.hasInfo ? reply.info : nil
        )
        do {
            return Answered(outcome: .identity(try fields.identity()))
        } catch {
            return Answered(outcome: .refused(error))
        }
    }

    func request(
        _ request: GatewayRequest,
        _ connection: ConnectionInfo,
        timeout: Duration
    ) async throws(BackendFailure) -> Answered<RequestOutcome> {
        var event = Tether_V1_RequestEvent()
        event.method = request.method
        event.data = Data(request.body.readableBytesView)
        event.client = connection.clientID
        event.connection = connection.id
        event.request = request.id
        if let traceparent = request.traceContext?.fields["traceparent"] { event.traceparent = traceparent }
        if let tracestate = request.traceContext?.fields["tracestate"] { event.tracestate = tracestate }
        do {
            let reply = try await self.backend.request(event, metadata: self.metadata, options: Self.options(timeout))
            return Answered(outcome: .answered(ByteBuffer(bytes: reply.data)))
        } catch let error as RPCError where error.isAnswer {
            return Answered(
                outcome: .refused(error.tetherStatus, Self.text(error, or: "the backend refused the request")),
                backendDown: error.isDown
            )
        } catch {
            throw Self.failure(error)
        }
    }

    func message(
        _ message: ReliableMessage,
        _ connection: ConnectionInfo,
        timeout: Duration
    ) async throws(BackendFailure) -> Answered<MessageOutcome> {
        do {
            _ = try await self.backend.message(Self.event(message, connection), metadata: self.metadata, options: Self.options(timeout))
            return Answered(outcome: .processed)
        } catch let error as RPCError where error.isAnswer {
            let outcome = Self.messageOutcome(
                error.code,
                ownStatus: error.hasTetherStatus,
                explicit: error.explicitTetherStatus,
                message: error.message
            )
            if case .retry = outcome { return Answered(outcome: outcome, backendDown: error.isDown) }
            return Answered(outcome: outcome)
        } catch {
            throw Self.failure(error)
        }
    }

    func messages(_ batch: [BatchedMessage], timeout: Duration) async throws(BackendFailure) -> Answered<[MessageOutcome]> {
        var event = Tether_V1_MessageBatch()
        event.messages = batch.map { Self.event($0.message, $0.connection) }
        let results: [Tether_V1_MessageResult]
        do {
            results = try await self.backend.messages(event, metadata: self.metadata, options: Self.options(timeout)).results
        } catch let error as RPCError where error.isAnswer {
            // The whole call failed: every message of it comes again, with its key.
            let outcome = MessageOutcome.retry("the backend answered \(error.code) to the batch; its messages will come again")
            return Answered(outcome: Array(repeating: outcome, count: batch.count), backendDown: error.isDown)
        } catch {
            throw Self.failure(error)
        }
        guard results.count == batch.count else {
            let outcome = MessageOutcome.retry(
                "the backend gave \(results.count) results for \(batch.count) messages; they will come again"
            )
            return Answered(outcome: Array(repeating: outcome, count: batch.count))
        }
        return Answered(
            outcome: results.map { result in
                guard result.code != 0 else { return .processed }
                return Self.messageOutcome(
                    Status.Code(rawValue: Int(result.code)).flatMap { RPCError.Code($0) } ?? .unknown,
                    ownStatus: result.hasTetherStatus,
                    explicit: result.hasTetherStatus ? UInt16(clamping: result.tetherStatus) : nil,
                    message: result.message
                )
            }
        )
    }

    /// A message's event, as `Message` and `Messages` send it.
    private static func event(_ message: ReliableMessage, _ connection: ConnectionInfo) -> Tether_V1_MessageEvent {
        var event = Tether_V1_MessageEvent()
        event.topic = message.topic
        event.data = Data(message.body.readableBytesView)
        event.idempotencyKey = message.idempotencyKey
        event.client = connection.clientID
        event.conversation = message.conversation
        event.sequence = message.sequence
        return event
    }

    /// What a message's status means (`backend.proto`): refused for good when the backend set
    /// its own status (`ownStatus`; `explicit` its value, if it is one) or the code is not
    /// retried, else it comes again.
    private static func messageOutcome(_ code: RPCError.Code, ownStatus: Bool, explicit: UInt16?, message: String) -> MessageOutcome {
        if ownStatus || !RPCError.isRetried(code) {
            return .refused(
                RPCError.tetherStatus(code: code, explicit: explicit),
                Self.text(message, or: "the backend refused the message")
            )
        }
        return .retry("the backend answered \(code); the message will come again")
    }

    func disconnected(_ connection: ConnectionInfo, reason: String, timeout: Duration) async throws(BackendFailure) -> Answered<Void> {
        var event = Tether_V1_DisconnectEvent()
        event.client = connection.clientID
        event.connection = connection.id
        event.reason = reason
        if let userAgent = connection.userAgent { event.userAgent = userAgent }
        if let address = connection.remoteAddress { event.remoteAddress = address }
        do {
            _ = try await self.backend.disconnect(event, metadata: self.metadata, options: Self.options(timeout))
            return Answered(outcome: ())
        } catch let error as RPCError where error.isAnswer {
            return Answered(outcome: ())
        } catch {
            throw Self.failure(error)
        }
    }

    func authorize(
        _ access: Access,
        channel: String,
        _ connection: ConnectionInfo,
        timeout: Duration
    ) async throws(BackendFailure) -> Answered<AuthorizeOutcome> {
        var event = Tether_V1_AuthorizeEvent()
        event.client = connection.clientID
        event.connection = connection.id
        event.access = access.eventName
        event.channel = channel
        do {
            _ = try await self.backend.authorize(event, metadata: self.metadata, options: Self.options(timeout))
            return Answered(outcome: .allowed)
        } catch let error as RPCError where error.isAnswer {
            return Answered(outcome: .refused(error.tetherStatus, Self.text(error, or: "the backend refused")))
        } catch {
            throw Self.failure(error)
        }
    }

    private static func options(_ timeout: Duration) -> CallOptions {
        var options = CallOptions.defaults
        options.timeout = timeout
        return options
    }

    private static func text(_ error: RPCError, or fallback: String) -> String {
        Self.text(error.message, or: fallback)
    }

    /// A backend's message for the client: at most 1,000 bytes, `fallback` if empty.
    private static func text(_ message: String, or fallback: String) -> String {
        message.isEmpty ? fallback : String(message.utf8.prefix(1_000)) ?? fallback
    }

    /// A call that got no answer: the backend unreachable, too slow, or the call cancelled.
    private static func failure(_ error: any Error) -> BackendFailure {
        if Task.isCancelled { return BackendFailure(status: .cancelled, message: "the call was cancelled") }
        guard let error = error as? RPCError else {
            return BackendFailure(status: .internalError, message: "the call to the backend failed: \(error)")
        }
        switch error.code {
        case .deadlineExceeded: return BackendFailure(status: .deadlineExceeded, message: "the backend did not answer in time")
        case .cancelled: return BackendFailure(status: .cancelled, message: "the call was cancelled")
        default: return BackendFailure(status: .unavailable, message: "the backend could not be reached: \(error.message)")
        }
    }
}

@available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *)
extension RPCError {
    /// A status the backend answered with (not the call failing to reach it or in time).
    var isAnswer: Bool { ![.deadlineExceeded, .cancelled].contains(self.code) && !(self.code == .unavailable && !self.hasTetherStatus) }

    /// The backend is down (UNAVAILABLE, without Tether's own status).
    var isDown: Bool { self.code == .unavailable && !self.hasTetherStatus }

    /// A status after which a message comes again (`backend.proto` lists them).
    var isRetried: Bool { Self.isRetried(self.code) }

    static func isRetried(_ code: Code) -> Bool {
        [.unavailable, .deadlineExceeded, .resourceExhausted, .aborted, .internalError, .unknown, .unimplemented, .dataLoss, .cancelled]
            .contains(code)
    }

    /// The backend's own status (`tether-status` metadata), if it set one.
    private var tetherStatusValue: String? { self.metadata[stringValues: "tether-status"].first(where: { _ in true }) }

    /// Whether the backend set its own status: then the answer is a refusal, never "down".
    var hasTetherStatus: Bool { self.tetherStatusValue != nil }

    /// The backend's own status as a number, if it set one that is.
    var explicitTetherStatus: UInt16? { self.tetherStatusValue.flatMap { UInt16($0) } }

    /// The status the client sees.
    var tetherStatus: StatusCode {
        Self.tetherStatus(code: self.code, explicit: self.explicitTetherStatus)
    }

    /// The status the client sees for `code`, or Tether's own (`explicit`) if the backend gave one.
    static func tetherStatus(code: Code, explicit: UInt16?) -> StatusCode {
        if let explicit, explicit != 0 { return StatusCode(rawValue: explicit) }
        switch code {
        case .invalidArgument, .alreadyExists, .failedPrecondition, .outOfRange: return .invalidRequest
        case .unauthenticated: return .unauthenticated
        case .permissionDenied: return .permissionDenied
        case .notFound, .unimplemented: return .unknownMethod
        case .deadlineExceeded: return .deadlineExceeded
        case .resourceExhausted: return .resourceExhausted
        case .unavailable: return .unavailable
        default: return .internalError
        }
    }
}
