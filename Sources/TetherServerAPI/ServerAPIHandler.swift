import Foundation
import NIOCore
import OpenAPIRuntime
import TetherCore
import TetherGateway

/// The server API's operations (generated from `openapi.yaml` as `APIProtocol`), each a call
/// to the gateway's public API.
///
/// The generated code decodes the JSON (refusing unknown properties) but checks none of the
/// document's limits; each operation checks them here, before anything happens, and answers a
/// 400 that names the field.
struct ServerAPIHandler: APIProtocol {
    let gateway: Gateway

    // MARK: Publishing

    func publish(_ input: Operations.Publish.Input) async throws -> Operations.Publish.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        let publication: Outgoing
        do {
            publication = try Outgoing(body)
        } catch {
            return .badRequest(.init(body: .json(error.schema)))
        }
        do {
            return .ok(.init(body: .json(try await publication.send(through: self.gateway))))
        } catch {
            let failure = APIFailure(error)
            if failure.status == 503 { return .serviceUnavailable(.init(body: .json(failure.schema))) }
            return .badRequest(.init(body: .json(failure.schema)))
        }
    }

    func publishBatch(_ input: Operations.PublishBatch.Input) async throws -> Operations.PublishBatch.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        guard (1...1_000).contains(body.publications.count) else {
            return .badRequest(
                .init(body: .json(APIFailure.invalid("a batch holds 1 to 1000 publications, got \(body.publications.count)").schema))
            )
        }
        var publications: [Outgoing] = []
        publications.reserveCapacity(body.publications.count)
        for (index, publication) in body.publications.enumerated() {
            do {
                publications.append(try Outgoing(publication))
            } catch {
                return .badRequest(.init(body: .json(APIFailure.invalid("publications[\(index)]: \(error.message)").schema)))
            }
        }
        var results: [Components.Schemas.BatchResult] = []
        results.reserveCapacity(publications.count)
        for publication in publications {
            do {
                results.append(.init(result: try await publication.send(through: self.gateway)))
            } catch {
                results.append(.init(error: APIFailure(error).schema))
            }
        }
        return .ok(.init(body: .json(.init(results: results))))
    }

    func sendMessage(_ input: Operations.SendMessage.Input) async throws -> Operations.SendMessage.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        let key = input.headers.idempotencyKey
        let payload: ByteBuffer
        do throws(APIFailure) {
            guard (1...255).contains(key.utf8.count) else { throw APIFailure.invalid("Idempotency-Key must be 1 to 255 bytes") }
            if let failure = APIFailure.length(of: body.client, "a client id") ?? APIFailure.length(of: body.topic, "a topic") {
                throw failure
            }
            payload = try Payload.decode(text: body.data, base64: body.dataBase64)
        } catch {
            return .badRequest(.init(body: .json(error.schema)))
        }
        do {
            switch try await self.gateway.deliver(to: body.client, topic: body.topic, body: payload, idempotencyKey: key) {
            case .delivered(let sequence):
                return .ok(.init(body: .json(.init(duplicate: false, sequence: Int64(clamping: sequence)))))
            case .duplicate:
                return .ok(.init(body: .json(.init(duplicate: true))))
            }
        } catch {
            let failure = APIFailure(error)
            switch failure.status {
            case 429: return .tooManyRequests(.init(body: .json(failure.schema)))
            case 503: return .serviceUnavailable(.init(body: .json(failure.schema)))
            default: return .badRequest(.init(body: .json(failure.schema)))
            }
        }
    }

    // MARK: Channels

    func channelHistory(_ input: Operations.ChannelHistory.Input) async throws -> Operations.ChannelHistory.Output {
        let query = input.query
        let limit = query.limit ?? 100
        var position: ChannelPosition?
        switch (query.epoch, query.offset) {
        case (nil, nil):
            position = nil
        case (let epoch?, let offset?):
            guard let epoch = UInt64(epoch), offset >= 0 else {
                return .badRequest(.init(body: .json(APIFailure.invalid("epoch must be a decimal UInt64 and offset at least 0").schema)))
            }
            position = ChannelPosition(epoch: epoch, offset: UInt64(offset))
        default:
            return .badRequest(.init(body: .json(APIFailure.invalid("a position needs both epoch and offset").schema)))
        }
        do {
            let page = try await self.gateway.history(of: input.path.channel, after: position, limit: limit)
            return .ok(
                .init(
                    body: .json(
                        .init(
                            epoch: String(page.epoch),
                            offset: Int64(clamping: page.top),
                            gap: page.gap != nil,
                            more: page.more,
                            publications: page.publications.map { publication in
                                let payload = Payload(publication.body)
                                return .init(
                                    offset: Int64(clamping: publication.position.offset),
                                    publisher: publication.publisher,
                                    data: payload.text,
                                    dataBase64: payload.base64
                                )
                            }
                        )
                    )
                )
            )
        } catch {
            let failure = APIFailure(error)
            if failure.status == 503 { return .serviceUnavailable(.init(body: .json(failure.schema))) }
            return .badRequest(.init(body: .json(failure.schema)))
        }
    }

    func channelPresence(_ input: Operations.ChannelPresence.Input) async throws -> Operations.ChannelPresence.Output {
        guard (input.query.after ?? "").utf8.count <= Int(UInt16.max) else {
            return .badRequest(.init(body: .json(APIFailure.invalid("after is a client id: at most 65535 bytes").schema)))
        }
        do {
            let page = try self.gateway.presence(of: input.path.channel, after: input.query.after ?? "", limit: input.query.limit ?? 1_000)
            return .ok(
                .init(
                    body: .json(
                        .init(
                            total: page.total,
                            members: page.members.map { .init(client: $0.clientID, connections: $0.connections, info: $0.info) }
                        )
                    )
                )
            )
        } catch {
            let failure = APIFailure(error)
            if failure.status == 503 { return .serviceUnavailable(.init(body: .json(failure.schema))) }
            return .badRequest(.init(body: .json(failure.schema)))
        }
    }

    // MARK: Clients

    func clientConnections(_ input: Operations.ClientConnections.Input) async throws -> Operations.ClientConnections.Output {
        let client = input.path.client
        if let failure = APIFailure.length(of: client, "a client id") { return .badRequest(.init(body: .json(failure.schema))) }
        return .ok(.init(body: .json(Self.connections(self.gateway.connections(of: client)))))
    }

    func roomMembers(_ input: Operations.RoomMembers.Input) async throws -> Operations.RoomMembers.Output {
        let room = input.path.room
        if let failure = APIFailure.length(of: room, "a room name") { return .badRequest(.init(body: .json(failure.schema))) }
        return .ok(.init(body: .json(Self.connections(self.gateway.members(of: room)))))
    }

    func disconnectClient(_ input: Operations.DisconnectClient.Input) async throws -> Operations.DisconnectClient.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        let client = input.path.client
        let message = body.message ?? ""
        let retryAfter = body.retryAfterMs ?? 0
        if let failure = APIFailure.length(of: client, "a client id") { return .badRequest(.init(body: .json(failure.schema))) }
        guard message.utf8.count <= 1_000 else {
            return .badRequest(.init(body: .json(APIFailure.invalid("message is at most 1000 bytes").schema)))
        }
        guard (0...86_400_000).contains(retryAfter) else {
            return .badRequest(.init(body: .json(APIFailure.invalid("retry_after_ms must be 0 to 86400000").schema)))
        }
        let count = self.gateway.disconnect(
            client: client,
            reconnect: body.reconnect ?? false,
            retryAfter: .milliseconds(retryAfter),
            message: message
        )
        return .ok(.init(body: .json(.init(disconnected: count))))
    }

    private static func connections(_ connections: [ConnectionInfo]) -> Components.Schemas.Connections {
        .init(
            connections: connections.sorted { $0.id < $1.id }.map {
                .init(id: Int64(clamping: $0.id), client: $0.clientID, userAgent: $0.userAgent, remoteAddress: $0.remoteAddress)
            }
        )
    }
}

/// A publication checked against the document's rules, ready to send.
struct Outgoing: Sendable {
    enum Target: Sendable {
        case push(topic: String, PushTarget)
        case channel(String, publisher: String)
    }

    var target: Target
    var payload: ByteBuffer

    init(_ publication: Components.Schemas.Publication) throws(APIFailure) {
        var targets: [String] = []
        if publication.client != nil { targets.append("client") }
        if publication.connection != nil { targets.append("connection") }
        if publication.room != nil { targets.append("room") }
        if publication.channel != nil { targets.append("channel") }
        if publication.everyone != nil { targets.append("everyone") }
        guard targets.count == 1 else {
            throw .invalid(
                targets.isEmpty
                    ? "a publication needs one target: client, connection, room, channel or everyone"
                    : "a publication has one target, got \(targets.joined(separator: ", "))"
            )
        }
        self.payload = try Payload.decode(text: publication.data, base64: publication.dataBase64)
        if let channel = publication.channel {
            guard publication.topic == nil else { throw .invalid("a channel publication has no topic (its channel says what it is)") }
            guard Frame.isValidChannelName(channel) else {
                throw .invalid("a channel name must be 1 to \(Frame.maxChannelLength) bytes long")
            }
            let publisher = publication.publisher ?? ""
            guard publisher.utf8.count <= 255 else { throw .invalid("publisher is at most 255 bytes") }
            self.target = .channel(channel, publisher: publisher)
            return
        }
        guard publication.publisher == nil else { throw .invalid("publisher is for channel publications only") }
        guard let topic = publication.topic else { throw .invalid("a push needs a topic") }
        if let failure = APIFailure.length(of: topic, "a topic") { throw failure }
        if let client = publication.client {
            if let failure = APIFailure.length(of: client, "a client id") { throw failure }
            self.target = .push(topic: topic, .client(client))
        } else if let connection = publication.connection {
            guard connection >= 0 else { throw .invalid("a connection id is at least 0") }
            self.target = .push(topic: topic, .connection(UInt64(connection)))
        } else if let room = publication.room {
            if let failure = APIFailure.length(of: room, "a room name") { throw failure }
            self.target = .push(topic: topic, .room(room))
        } else {
            guard publication.everyone == true else { throw .invalid("everyone must be true when it is the target") }
            self.target = .push(topic: topic, .all)
        }
    }

    func send(through gateway: Gateway) async throws(GatewayError) -> Components.Schemas.PublishResult {
        switch self.target {
        case .push(let topic, let target):
            return .init(delivered: try gateway.push(topic, self.payload, to: target))
        case .channel(let channel, let publisher):
            let position = try await gateway.publish(self.payload, toChannel: channel, publisher: publisher)
            guard position.epoch != 0 else { return .init(delivered: 0) }
            return .init(delivered: 0, epoch: String(position.epoch), offset: Int64(clamping: position.offset))
        }
    }
}

/// A payload as the API hands it back: text when it is UTF-8, base64 otherwise.
struct Payload {
    /// A payload as a call gives it: exactly one of `data` and `data_base64`.
    static func decode(text: String?, base64: String?) throws(APIFailure) -> ByteBuffer {
        switch (text, base64) {
        case (let text?, nil):
            return ByteBuffer(string: text)
        case (nil, let base64?):
            guard let data = Data(base64Encoded: base64) else { throw .invalid("data_base64 is not valid base64") }
            return ByteBuffer(bytes: data)
        case (nil, nil):
            throw .invalid("a payload needs data or data_base64")
        case (.some, .some):
            throw .invalid("a payload has data or data_base64, not both")
        }
    }

    var text: String?
    var base64: String?

    init(_ body: ByteBuffer) {
        let bytes = body.readableBytesView
        if let text = String(validating: bytes, as: UTF8.self) {
            self.text = text
        } else {
            self.base64 = Data(bytes).base64EncodedString()
        }
    }
}

/// A refusal of the API, with the status and the `Error` body it is answered with.
struct APIFailure: Error, Sendable {
    var status: Int
    var code: String
    var message: String

    static func invalid(_ message: String) -> APIFailure {
        APIFailure(status: 400, code: "invalid_argument", message: message)
    }

    /// The refusal of `value` (a client id, a topic, a room) unless it is 1 to 65,535 bytes
    /// long, as the protocol's fields are; `what` names it.
    static func length(of value: String, _ what: String) -> APIFailure? {
        (1...Int(UInt16.max)).contains(value.utf8.count) ? nil : .invalid("\(what) must be 1 to 65535 bytes long")
    }

    init(status: Int, code: String, message: String) {
        self.status = status
        self.code = code
        self.message = message
    }

    init(_ error: GatewayError) {
        switch error.code {
        case .invalidArgument: self.init(status: 400, code: "invalid_argument", message: error.message)
        case .disabled: self.init(status: 400, code: "disabled", message: error.message)
        case .quotaExceeded: self.init(status: 429, code: "quota_exceeded", message: error.message)
        case .storage, .notRunning, .notListening: self.init(status: 503, code: "unavailable", message: error.message)
        default: self.init(status: 500, code: "internal", message: error.message)
        }
    }

    var schema: Components.Schemas._Error { .init(code: self.code, message: self.message) }
}
