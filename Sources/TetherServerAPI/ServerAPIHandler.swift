import Foundation
import NIOCore
import OpenAPIRuntime
import TetherCore
import TetherGateway

/// The JSON form of the server API (generated from `openapi.yaml` as `APIProtocol`): each
/// operation reads its input, calls ``ServerAPIOperations``, and answers with its status.
///
/// The generated code decodes the JSON (refusing unknown properties) but checks none of the
/// document's limits; the operations check them, before anything happens, and a refusal is a
/// 400 that names the field.
struct ServerAPIHandler: APIProtocol {
    let operations: ServerAPIOperations

    init(gateway: Gateway) {
        self.operations = ServerAPIOperations(gateway: gateway)
    }

    // MARK: Publishing

    func publish(_ input: Operations.Publish.Input) async throws -> Operations.Publish.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        do throws(APIFailure) {
            return .ok(.init(body: .json(.init(try await self.operations.publish(try Outgoing(body))))))
        } catch {
            if error.status == 503 { return .serviceUnavailable(.init(body: .json(error.schema))) }
            return .badRequest(.init(body: .json(error.schema)))
        }
    }

    func publishBatch(_ input: Operations.PublishBatch.Input) async throws -> Operations.PublishBatch.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        var publications: [Outgoing] = []
        do throws(APIFailure) {
            try ServerAPIOperations.checkBatch(body.publications.count)
            publications.reserveCapacity(body.publications.count)
            for (index, publication) in body.publications.enumerated() {
                do {
                    publications.append(try Outgoing(publication))
                } catch {
                    throw .invalid("publications[\(index)]: \(error.message)")
                }
            }
        } catch {
            return .badRequest(.init(body: .json(error.schema)))
        }
        let results = await self.operations.publishBatch(publications).map { result -> Components.Schemas.BatchResult in
            switch result {
            case .success(let published): return .init(result: .init(published))
            case .failure(let failure): return .init(error: failure.schema)
            }
        }
        return .ok(.init(body: .json(.init(results: results))))
    }

    func sendMessage(_ input: Operations.SendMessage.Input) async throws -> Operations.SendMessage.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        do throws(APIFailure) {
            let payload = try Payload.decode(text: body.data, base64: body.dataBase64)
            switch try await self.operations.sendMessage(
                to: body.client,
                topic: body.topic,
                payload: payload,
                key: input.headers.idempotencyKey
            ) {
            case .delivered(let sequence):
                return .ok(.init(body: .json(.init(duplicate: false, sequence: Int64(clamping: sequence)))))
            case .duplicate:
                return .ok(.init(body: .json(.init(duplicate: true))))
            }
        } catch {
            switch error.status {
            case 429: return .tooManyRequests(.init(body: .json(error.schema)))
            case 503: return .serviceUnavailable(.init(body: .json(error.schema)))
            default: return .badRequest(.init(body: .json(error.schema)))
            }
        }
    }

    // MARK: Channels

    func channelHistory(_ input: Operations.ChannelHistory.Input) async throws -> Operations.ChannelHistory.Output {
        let query = input.query
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
        do throws(APIFailure) {
            let page = try await self.operations.history(of: input.path.channel, after: position, limit: query.limit ?? 100)
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
            if error.status == 503 { return .serviceUnavailable(.init(body: .json(error.schema))) }
            return .badRequest(.init(body: .json(error.schema)))
        }
    }

    func channelPresence(_ input: Operations.ChannelPresence.Input) async throws -> Operations.ChannelPresence.Output {
        do throws(APIFailure) {
            let page = try self.operations.presence(
                of: input.path.channel,
                after: input.query.after ?? "",
                limit: input.query.limit ?? 1_000
            )
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
            if error.status == 503 { return .serviceUnavailable(.init(body: .json(error.schema))) }
            return .badRequest(.init(body: .json(error.schema)))
        }
    }

    // MARK: Clients

    func clientConnections(_ input: Operations.ClientConnections.Input) async throws -> Operations.ClientConnections.Output {
        do throws(APIFailure) {
            return .ok(.init(body: .json(Self.connections(try await self.operations.connections(of: input.path.client)))))
        } catch {
            return error.status == 503
                ? .serviceUnavailable(.init(body: .json(error.schema))) : .badRequest(.init(body: .json(error.schema)))
        }
    }

    func roomMembers(_ input: Operations.RoomMembers.Input) async throws -> Operations.RoomMembers.Output {
        do throws(APIFailure) {
            return .ok(.init(body: .json(Self.connections(try await self.operations.members(of: input.path.room)))))
        } catch {
            return error.status == 503
                ? .serviceUnavailable(.init(body: .json(error.schema))) : .badRequest(.init(body: .json(error.schema)))
        }
    }

    func disconnectClient(_ input: Operations.DisconnectClient.Input) async throws -> Operations.DisconnectClient.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        do throws(APIFailure) {
            let count = try self.operations.disconnect(
                client: input.path.client,
                reconnect: body.reconnect ?? false,
                retryAfterMs: body.retryAfterMs ?? 0,
                message: body.message ?? ""
            )
            return .ok(.init(body: .json(.init(disconnected: count))))
        } catch {
            return .badRequest(.init(body: .json(error.schema)))
        }
    }

    func refreshClient(_ input: Operations.RefreshClient.Input) async throws -> Operations.RefreshClient.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        do throws(APIFailure) {
            let count = try self.operations.refreshCredentials(client: input.path.client, expiresAt: body.expiresAt)
            return .ok(.init(body: .json(.init(connections: count))))
        } catch {
            return .badRequest(.init(body: .json(error.schema)))
        }
    }

    func expireClient(_ input: Operations.ExpireClient.Input) async throws -> Operations.ExpireClient.Output {
        guard case .json(let body) = input.body else { throw APIFailure.invalid("the body must be JSON") }
        do throws(APIFailure) {
            let count = try self.operations.expireCredentials(client: input.path.client, message: body.message ?? "")
            return .ok(.init(body: .json(.init(connections: count))))
        } catch {
            return .badRequest(.init(body: .json(error.schema)))
        }
    }

    private static func connections(_ answers: ClusterAnswers) -> Components.Schemas.Connections {
        .init(
            connections: answers.connections.map {
                .init(
                    id: Int64(clamping: $0.connection.id),
                    client: $0.connection.clientID,
                    userAgent: $0.connection.userAgent,
                    remoteAddress: $0.connection.remoteAddress,
                    node: $0.node
                )
            },
            unansweredNodes: answers.unanswered
        )
    }
}

extension Outgoing {
    /// A JSON publication: its payload is `data` (text) or `data_base64`.
    init(_ publication: Components.Schemas.Publication) throws(APIFailure) {
        let payload: Result<ByteBuffer, APIFailure>
        do {
            payload = .success(try Payload.decode(text: publication.data, base64: publication.dataBase64))
        } catch {
            payload = .failure(error)
        }
        try self.init(
            client: publication.client,
            connection: publication.connection,
            room: publication.room,
            channel: publication.channel,
            everyone: publication.everyone,
            topic: publication.topic,
            publisher: publication.publisher,
            payload: payload
        )
    }
}

extension Components.Schemas.PublishResult {
    init(_ published: ServerAPIOperations.Published) {
        if let position = published.position {
            self.init(delivered: published.delivered, epoch: String(position.epoch), offset: Int64(clamping: position.offset))
        } else {
            self.init(delivered: published.delivered)
        }
    }
}

/// A payload as the JSON API hands it back: text when it is UTF-8, base64 otherwise.
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

extension APIFailure {
    /// The JSON `Error` body.
    var schema: Components.Schemas._Error { .init(code: self.code, message: self.message) }
}
