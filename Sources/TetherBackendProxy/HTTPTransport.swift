import AsyncHTTPClient
import Foundation
import Logging
import NIOCore
import NIOFoundationCompat
import NIOHTTP1
import TetherCore
import TetherGateway

/// The proxy's events over HTTP (`openapi.yaml`'s `webhooks`), with async-http-client and its
/// pool of keep-alive connections:
///
/// - **connect**: `POST /tether/connect` with the HELLO's credentials (JSON); a 2xx answer is
///   an `Identity`, 401 and 403 refuse the client.
/// - **requests**: `POST /tether/request/METHOD` with the body; a 2xx answer is the RESPONSE.
/// - **messages**: `POST /tether/message/TOPIC` with an `Idempotency-Key`; a 2xx is processed,
///   a 4xx (or `Tether-Status`) a refusal, anything else a retry. Or, with
///   ``BackendConfiguration/messageBatch`` above 1, several at once: `POST /tether/messages`
///   (JSON) answered with one result per message.
/// - **disconnect**: `POST /tether/disconnect` (JSON), whatever it answers.
/// - **channel access**: `POST /tether/authorize` (JSON); a 2xx allows, another status refuses.
struct HTTPTransport: BackendTransport {
    let client: HTTPClient
    let configuration: BackendConfiguration
    let logger: Logger

    func connect(_ hello: HandshakeInfo, timeout: Duration) async throws(BackendFailure) -> Answered<ConnectOutcome> {
        var event = ConnectEvent(client: hello.clientID, userAgent: hello.userAgent, remoteAddress: hello.remoteAddress)
        if let token = hello.authToken { (event.token, event.tokenBase64) = Self.textOrBase64(token) }
        let answer = try await self.post(event, to: "connect", timeout: timeout)
        switch answer.status {
        case 200..<300:
            let identity: IdentityAnswer
            do {
                identity = try JSONDecoder().decode(IdentityAnswer.self, from: answer.body)
            } catch {
                self.logger.error("the backend's connect answer is not an Identity", metadata: ["error": "\(error)"])
                throw BackendFailure(status: .unavailable, message: "the backend's answer could not be read")
            }
            do {
                return Answered(outcome: .identity(try identity.fields.identity()))
            } catch {
                return Answered(outcome: .refused(error))
            }
        case 401:
            return Answered(
                outcome: .refused(AuthenticationError(.unauthenticated, answer.refusalMessage ?? "the backend refused the credentials"))
            )
        case 403:
            return Answered(
                outcome: .refused(AuthenticationError(.permissionDenied, answer.refusalMessage ?? "the backend refused the client"))
            )
        default:
            return Answered(
                outcome: .refused(
                    AuthenticationError(.unavailable, "the backend could not check the credentials: it answered \(answer.status)")
                ),
                backendDown: answer.isDown
            )
        }
    }

    func request(
        _ request: GatewayRequest,
        _ connection: ConnectionInfo,
        timeout: Duration
    ) async throws(BackendFailure) -> Answered<RequestOutcome> {
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
        let answer = try await self.call(
            "request/" + Self.pathSegment(request.method),
            headers: headers,
            body: request.body,
            timeout: timeout
        )
        if (200..<300).contains(answer.status) { return Answered(outcome: .answered(ByteBuffer(data: answer.body))) }
        return Answered(outcome: .refused(answer.tetherStatus, answer.errorMessage), backendDown: answer.isDown)
    }

    func message(
        _ message: ReliableMessage,
        _ connection: ConnectionInfo,
        timeout: Duration
    ) async throws(BackendFailure) -> Answered<MessageOutcome> {
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
            timeout: timeout
        )
        let header = answer.headers.first(name: "Tether-Status")
        let outcome = Self.messageOutcome(
            status: answer.status,
            ownStatus: header != nil,
            explicit: header.flatMap { UInt16($0) },
            message: answer.errorMessage
        )
        if case .retry = outcome { return Answered(outcome: outcome, backendDown: answer.isDown) }
        return Answered(outcome: outcome)
    }

    func messages(_ batch: [BatchedMessage], timeout: Duration) async throws(BackendFailure) -> Answered<[MessageOutcome]> {
        let event = MessagesEvent(
            messages: batch.map { entry in
                var item = MessagesEvent.Item(
                    topic: entry.message.topic,
                    idempotencyKey: entry.message.idempotencyKey,
                    client: entry.connection.clientID,
                    conversation: entry.message.conversation,
                    sequence: entry.message.sequence
                )
                (item.data, item.dataBase64) = Self.textOrBase64(entry.message.body)
                return item
            }
        )
        let answer = try await self.post(event, to: "messages", timeout: timeout)
        guard (200..<300).contains(answer.status) else {
            // The whole call failed: every message of it comes again, with its key.
            let outcome = MessageOutcome.retry("the backend answered \(answer.status) to the batch; its messages will come again")
            return Answered(outcome: Array(repeating: outcome, count: batch.count), backendDown: answer.isDown)
        }
        guard let results = try? JSONDecoder().decode(MessagesAnswer.self, from: answer.body).results, results.count == batch.count else {
            self.logger.error("the backend's messages answer is not one result per message", metadata: ["messages": "\(batch.count)"])
            let outcome = MessageOutcome.retry("the backend's answer to the batch could not be read; its messages will come again")
            return Answered(outcome: Array(repeating: outcome, count: batch.count))
        }
        return Answered(
            outcome: results.map { result in
                Self.messageOutcome(
                    status: result.status,
                    ownStatus: result.tetherStatus != nil,
                    explicit: result.tetherStatus,
                    message: result.message ?? "the backend answered \(result.status)"
                )
            }
        )
    }

    /// A message's outcome from its status: 2xx processed; a 4xx other than 408 and 429, or
    /// any status with Tether's own (`ownStatus`; `explicit` its value, if it is a number),
    /// refused for good; anything else retried.
    static func messageOutcome(status: Int, ownStatus: Bool, explicit: UInt16?, message: String) -> MessageOutcome {
        if (200..<300).contains(status) { return .processed }
        if ownStatus || (400..<500).contains(status) && ![408, 429].contains(status) {
            return .refused(Self.tetherStatus(status: status, explicit: explicit), message)
        }
        return .retry("the backend answered \(status); the message will come again")
    }

    /// The status a client sees for a backend's non-2xx answer: Tether's own (`Tether-Status`)
    /// if given, else mapped from the HTTP status.
    static func tetherStatus(status: Int, explicit: UInt16?) -> StatusCode {
        if let explicit, explicit != 0 { return StatusCode(rawValue: explicit) }
        switch status {
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

    // MARK: Calls

    /// What the backend answered.
    struct Answer {
        var status: Int
        var headers: HTTPHeaders
        var body: Data

        /// The status the client sees for a non-2xx answer.
        var tetherStatus: StatusCode {
            HTTPTransport.tetherStatus(status: self.status, explicit: self.headers.first(name: "Tether-Status").flatMap { UInt16($0) })
        }

        /// A 502/503/504 without Tether's own status: the backend (or its proxy) is down.
        var isDown: Bool { [502, 503, 504].contains(self.status) && self.headers.first(name: "Tether-Status") == nil }

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

    func disconnected(_ connection: ConnectionInfo, reason: String, timeout: Duration) async throws(BackendFailure) -> Answered<Void> {
        let event = DisconnectEvent(
            client: connection.clientID,
            connection: connection.id,
            reason: reason,
            userAgent: connection.userAgent,
            remoteAddress: connection.remoteAddress
        )
        let answer = try await self.post(event, to: "disconnect", timeout: timeout)
        return Answered(outcome: (), backendDown: answer.isDown)
    }

    func authorize(
        _ access: Access,
        channel: String,
        _ connection: ConnectionInfo,
        timeout: Duration
    ) async throws(BackendFailure) -> Answered<AuthorizeOutcome> {
        let event = AuthorizeEvent(client: connection.clientID, connection: connection.id, access: access.eventName, channel: channel)
        let answer = try await self.post(event, to: "authorize", timeout: timeout)
        if (200..<300).contains(answer.status) { return Answered(outcome: .allowed) }
        let message = answer.refusalMessage ?? "the backend refused: \(answer.status)"
        return Answered(outcome: .refused(answer.tetherStatus, message), backendDown: answer.isDown)
    }

    /// POSTs an event as JSON to `URL/tether/PATH`.
    private func post(_ event: some Encodable, to path: String, timeout: Duration) async throws(BackendFailure) -> Answer {
        let body: ByteBuffer
        do {
            body = ByteBuffer(data: try JSONEncoder().encode(event))
        } catch {
            throw BackendFailure(status: .internalError, message: "the \(path) event could not be encoded: \(error)")
        }
        return try await self.call(path, headers: [("Content-Type", "application/json")], body: body, timeout: timeout)
    }

    /// POSTs to `URL/tether/PATH`.
    private func call(
        _ path: String,
        headers: [(String, String)],
        body: ByteBuffer,
        timeout: Duration
    ) async throws(BackendFailure) -> Answer {
        var request = HTTPClientRequest(url: self.configuration.url + "/tether/" + path)
        request.method = .POST
        for (name, value) in headers { request.headers.add(name: name, value: value) }
        if let authorization = self.configuration.authorization { request.headers.add(name: "Authorization", value: authorization) }
        request.body = .bytes(body)
        do {
            let response = try await self.client.execute(request, timeout: .nanoseconds(timeout.nanoseconds))
            let bytes = try await response.body.collect(upTo: self.configuration.maxResponseBytes)
            return Answer(status: Int(response.status.code), headers: response.headers, body: Data(buffer: bytes))
        } catch {
            if Task.isCancelled { throw BackendFailure(status: .cancelled, message: "the call was cancelled") }
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

    /// Bytes for a JSON event: as text when they are UTF-8, else as base64 (one of the two).
    static func textOrBase64(_ buffer: ByteBuffer) -> (text: String?, base64: String?) {
        let bytes = buffer.readableBytesView
        if let text = String(validating: bytes, as: UTF8.self) { return (text, nil) }
        return (nil, Data(bytes).base64EncodedString())
    }

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

/// What `POST /tether/messages` sends: reliable messages, in the order they were taken.
struct MessagesEvent: Encodable {
    var messages: [Item]

    struct Item: Encodable {
        var topic: String
        var idempotencyKey: String
        var client: String
        var conversation: String
        var sequence: UInt64
        var data: String?
        var dataBase64: String?

        enum CodingKeys: String, CodingKey {
            case topic, client, conversation, sequence, data
            case idempotencyKey = "idempotency_key"
            case dataBase64 = "data_base64"
        }
    }
}

/// What `POST /tether/messages` answers: one result per message, in order.
struct MessagesAnswer: Decodable {
    var results: [Result]

    struct Result: Decodable {
        var status: Int
        var tetherStatus: UInt16?
        var message: String?

        enum CodingKeys: String, CodingKey {
            case status, message
            case tetherStatus = "tether_status"
        }
    }
}

/// What `POST /tether/authorize` sends.
struct AuthorizeEvent: Encodable {
    var client: String
    var connection: UInt64
    var access: String
    var channel: String
}

/// What `POST /tether/disconnect` sends.
struct DisconnectEvent: Encodable {
    var client: String
    var connection: UInt64
    var reason: String
    var userAgent: String?
    var remoteAddress: String?

    enum CodingKeys: String, CodingKey {
        case client, connection, reason
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

    var fields: IdentityFields {
        IdentityFields(
            client: self.client,
            expiresAt: self.expiresAt,
            rooms: self.rooms,
            topics: self.topics,
            channels: self.channels,
            attributes: self.attributes ?? [:],
            info: self.info
        )
    }
}
