public import AsyncHTTPClient
import Foundation
public import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
public import TetherCore
public import TetherGateway

/// The event proxy over HTTP: hands clients' connects, requests and reliable messages to a
/// backend written in any language (`openapi.yaml`'s `webhooks` and README's "your backend in
/// any language" say what it receives and answers).
///
/// ```swift
/// let backend = HTTPBackend(configuration: try BackendConfiguration(url: "http://127.0.0.1:5000", connect: true, requests: ["*"]))
/// let gateway = try Gateway(configuration: configuration, messageStore: store, authenticator: backend)
/// backend.install(on: gateway)
/// ```
///
/// - **connect**: `POST /tether/connect` with the HELLO's credentials; the answer says who
///   the client is (``ClientAuthenticator``).
/// - **requests**: `POST /tether/request/METHOD` with the body; the answer is the RESPONSE.
///   The call is abandoned when the client's deadline passes or it cancels.
/// - **messages**: `POST /tether/message/TOPIC` with an `Idempotency-Key`; MESSAGE_ACK leaves
///   only after a 2xx, and a failure leaves the message to be sent again with the same key:
///   a backend that keeps the keys processes each message once.
///
/// At most ``BackendConfiguration/maxConcurrentCalls`` calls are under way; the rest wait for a
/// slot. After ``BackendConfiguration/Breaker-swift.struct/failures`` failures in a row the
/// breaker opens: calls are answered `unavailable` at once (messages stay unacknowledged), and
/// `/ready` says so, until a probe succeeds.
public final class HTTPBackend: ClientAuthenticator, Sendable {
    public let configuration: BackendConfiguration
    private let client: HTTPClient
    private let clock: any TetherClock
    private let logger: Logger
    private let slots: CallSlots
    private let breaker: NIOLockedValueBox<CircuitBreaker>

    /// - Parameters:
    ///   - configuration: What goes to the backend, and the limits.
    ///   - httpClient: The client whose pool of keep-alive connections carries the calls.
    ///   - clock: The clock of the breaker's delays.
    ///   - logger: Where failures are logged.
    public init(
        configuration: BackendConfiguration,
        httpClient: HTTPClient = .shared,
        clock: any TetherClock = SystemClock(),
        logger: Logger = Logger(label: "tether.backend")
    ) {
        self.configuration = configuration
        self.client = httpClient
        self.clock = clock
        self.logger = logger
        self.slots = CallSlots(configuration.maxConcurrentCalls)
        self.breaker = NIOLockedValueBox(CircuitBreaker(configuration.breaker))
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
        var event = ConnectEvent(client: hello.clientID, userAgent: hello.userAgent, remoteAddress: hello.remoteAddress)
        if let token = hello.authToken {
            let bytes = token.readableBytesView
            if let text = String(validating: bytes, as: UTF8.self) {
                event.token = text
            } else {
                event.tokenBase64 = Data(bytes).base64EncodedString()
            }
        }
        let body = ByteBuffer(data: try JSONEncoder().encode(event))
        let answer: Answer
        do {
            answer = try await self.call(
                "connect",
                headers: [("Content-Type", "application/json")],
                body: body,
                timeout: self.configuration.timeout
            )
        } catch {
            throw AuthenticationError(.unavailable, "the backend could not check the credentials: \(error.message)")
        }
        switch answer.status {
        case 200..<300:
            let identity: IdentityAnswer
            do {
                identity = try JSONDecoder().decode(IdentityAnswer.self, from: answer.body)
            } catch {
                self.logger.error("the backend's connect answer is not an Identity", metadata: ["error": "\(error)"])
                throw AuthenticationError(.unavailable, "the backend's answer could not be read")
            }
            return try identity.identity()
        case 401:
            throw AuthenticationError(.unauthenticated, answer.refusalMessage ?? "the backend refused the credentials")
        case 403:
            throw AuthenticationError(.permissionDenied, answer.refusalMessage ?? "the backend refused the client")
        default:
            throw AuthenticationError(.unavailable, "the backend answered \(answer.status)")
        }
    }

    /// A request for a proxied method: the backend's answer is the response.
    func request(_ request: GatewayRequest, _ context: RequestContext) async throws -> ByteBuffer {
        let connection = context.connection
        let timeout = request.timeout > .zero ? request.timeout : self.configuration.timeout
        var headers = [
            ("Content-Type", "application/octet-stream"),
            ("Tether-Client", Self.headerValue(connection.clientID)),
            ("Tether-Connection", String(connection.id)),
            ("Tether-Request", String(request.id)),
            ("Tether-Timeout-Ms", String(timeout.wholeMilliseconds)),
        ]
        // The client's trace goes on in the backend (W3C Trace Context).
        for name in ["traceparent", "tracestate"] {
            if let value = request.traceContext?.fields[name] { headers.append((name, Self.headerValue(value))) }
        }
        let answer: Answer
        do {
            answer = try await self.call(
                "request/" + Self.pathSegment(request.method),
                headers: headers,
                body: request.body,
                timeout: timeout
            )
        } catch {
            throw RequestError(error.status, error.message)
        }
        if (200..<300).contains(answer.status) { return ByteBuffer(data: answer.body) }
        throw RequestError(answer.tetherStatus, answer.errorMessage)
    }

    /// A reliable message on a proxied topic: returns once the backend processed it; throws
    /// ``RequestError`` when it refuses it for good, any other error to leave it unacknowledged.
    func message(_ message: ReliableMessage, _ connection: ConnectionInfo) async throws {
        let answer = try await self.call(
            "message/" + Self.pathSegment(message.topic),
            headers: [
                ("Content-Type", "application/octet-stream"),
                ("Idempotency-Key", Self.headerValue(message.idempotencyKey)),
                ("Tether-Client", Self.headerValue(connection.clientID)),
                ("Tether-Conversation", Self.headerValue(message.conversation)),
                ("Tether-Sequence", String(message.sequence)),
            ],
            body: message.body,
            timeout: self.configuration.timeout
        )
        if (200..<300).contains(answer.status) { return }
        if answer.headers.first(name: "Tether-Status") != nil || (400..<500).contains(answer.status) && ![408, 429].contains(answer.status)
        {
            throw RequestError(answer.tetherStatus, answer.errorMessage)
        }
        throw BackendFailure(status: .unavailable, message: "the backend answered \(answer.status); the message will come again")
    }

    // MARK: Calls

    /// What the backend answered.
    struct Answer {
        var status: Int
        var headers: HTTPHeaders
        var body: Data

        /// The status the client sees for a non-2xx answer.
        var tetherStatus: StatusCode {
            if let header = self.headers.first(name: "Tether-Status"), let code = UInt16(header), code != 0 {
                return StatusCode(rawValue: code)
            }
            switch self.status {
            case 400, 409, 422: return .invalidRequest
            case 401: return .unauthenticated
            case 403: return .permissionDenied
            case 404: return .unknownMethod
            case 408, 504: return .deadlineExceeded
            case 429: return .resourceExhausted
            case 503: return .unavailable
            default: return .internalError
            }
        }

        /// The body as an error's message (text, at most 1,000 bytes).
        var errorMessage: String {
            let text = String(decoding: self.body.prefix(1_000), as: UTF8.self)
            return text.isEmpty ? "the backend answered \(self.status)" : text
        }

        /// A refusal's `message`, from its JSON body or its text.
        var refusalMessage: String? {
            struct Refusal: Decodable { var message: String? }
            if let refusal = try? JSONDecoder().decode(Refusal.self, from: self.body), let message = refusal.message { return message }
            return self.body.isEmpty ? nil : self.errorMessage
        }
    }

    /// POSTs to `URL/tether/PATH` in a slot, through the breaker.
    private func call(
        _ path: String,
        headers: [(String, String)],
        body: ByteBuffer,
        timeout: Duration
    ) async throws(BackendFailure) -> Answer {
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
        var request = HTTPClientRequest(url: self.configuration.url + "/tether/" + path)
        request.method = .POST
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let authorization = self.configuration.authorization { request.headers.add(name: "Authorization", value: authorization) }
        request.body = .bytes(body)
        do {
            let response = try await self.client.execute(request, timeout: .nanoseconds(timeout.nanoseconds))
            let bytes = try await response.body.collect(upTo: self.configuration.maxResponseBytes)
            let answer = Answer(status: Int(response.status.code), headers: response.headers, body: Data(buffer: bytes))
            // A 502/503/504 without Tether's own status is the backend (or its proxy) down.
            let down = [502, 503, 504].contains(answer.status) && answer.headers.first(name: "Tether-Status") == nil
            let later = self.clock.now
            self.breaker.withLockedValue { down ? $0.failed(now: later) : $0.succeeded() }
            return answer
        } catch {
            if Task.isCancelled {
                self.breaker.withLockedValue { $0.abandoned() }
                throw BackendFailure(status: .cancelled, message: "the call was cancelled")
            }
            let later = self.clock.now
            self.breaker.withLockedValue { $0.failed(now: later) }
            self.logger.warning("a call to the backend failed", metadata: ["path": "\(path)", "error": "\(error)"])
            if let error = error as? HTTPClientError {
                if error == .deadlineExceeded || error == .readTimeout {
                    throw BackendFailure(status: .deadlineExceeded, message: "the backend did not answer in time")
                }
                if error == .remoteConnectionClosed || error == .bodyLengthMismatch || error == .invalidProxyResponse {
                    // The call may have reached the backend: not `unavailable`, which tells the
                    // client nothing ran and invites it to send the request again.
                    throw BackendFailure(status: .internalError, message: "the backend closed the call without an answer")
                }
            }
            throw BackendFailure(status: .unavailable, message: "the backend could not be reached")
        }
    }

    // MARK: Encoding

    /// A method or topic as one URL path segment: unreserved bytes as they are, others
    /// percent-encoded.
    static func pathSegment(_ name: String) -> String {
        Self.percentEncoded(name) { byte in
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A) || byte == 0x2D
                || byte == 0x2E || byte == 0x5F || byte == 0x7E
        }
    }

    /// A client-chosen string as a header value: visible ASCII as it is (but `%`), other bytes
    /// percent-encoded, so that no value can end a header or start another.
    static func headerValue(_ value: String) -> String {
        Self.percentEncoded(value) { byte in byte >= 0x20 && byte < 0x7F && byte != 0x25 }
    }

    private static func percentEncoded(_ value: String, keeping keep: (UInt8) -> Bool) -> String {
        let hex: [UInt8] = Array("0123456789ABCDEF".utf8)
        var bytes: [UInt8] = []
        bytes.reserveCapacity(value.utf8.count)
        for byte in value.utf8 {
            if keep(byte) {
                bytes.append(byte)
            } else {
                bytes.append(0x25)
                bytes.append(hex[Int(byte >> 4)])
                bytes.append(hex[Int(byte & 0x0F)])
            }
        }
        return String(decoding: bytes, as: UTF8.self)
    }

}

/// A call that got no answer the gateway can use.
struct BackendFailure: Error, CustomStringConvertible {
    var status: StatusCode
    var message: String
    var description: String { self.message }
}

/// What `POST /tether/connect` sends.
struct ConnectEvent: Encodable {
    var client: String
    var token: String?
    var tokenBase64: String?
    var userAgent: String?
    var remoteAddress: String?

    enum CodingKeys: String, CodingKey {
        case client, token
        case tokenBase64 = "token_base64"
        case userAgent = "user_agent"
        case remoteAddress = "remote_address"
    }
}

/// What `POST /tether/connect` answers: an `Identity`.
struct IdentityAnswer: Decodable {
    var client: String
    var expiresAt: Int64?
    var rooms: [String]?
    var topics: [String]?
    var channels: [String]?
    var attributes: [String: String]?
    var info: String?

    enum CodingKeys: String, CodingKey {
        case client, rooms, topics, channels, attributes, info
        case expiresAt = "expires_at"
    }

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
            attributes: self.attributes ?? [:],
            info: self.info
        )
    }
}
