import Foundation
import GRPCCore
import NIOCore
import SwiftProtobuf
import TetherCore
import TetherGRPCProtos
import TetherGateway

/// The gRPC form of the server API (`Protos/tether/v1/server_api.proto`): each call reads its
/// message, calls ``ServerAPIOperations`` — the same checks and outcomes as the JSON form — and
/// fails with the gRPC status of a refusal.
@available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *)
struct GRPCServerAPI: Tether_V1_ServerAPI.SimpleServiceProtocol {
    let operations: ServerAPIOperations
    let maxBodyBytes: Int

    /// - Parameter maxBodyBytes: The largest request, in bytes: a larger one is refused with
    ///   RESOURCE_EXHAUSTED (the transport resets one over twice the size before it is read).
    init(gateway: Gateway, maxBodyBytes: Int) {
        self.operations = ServerAPIOperations(gateway: gateway)
        self.maxBodyBytes = maxBodyBytes
    }

    /// Refuses a request larger than the API's maximum.
    private func checkSize(_ message: some SwiftProtobuf.Message) throws(APIFailure) {
        let size = (try? message.serializedBytes() as [UInt8])?.count ?? Int.max
        guard size <= self.maxBodyBytes else {
            throw APIFailure(
                status: 413,
                code: "too_large",
                message: "the request is larger than the API's maximum of \(self.maxBodyBytes) bytes"
            )
        }
    }

    func publish(request: Tether_V1_Publication, context: ServerContext) async throws -> Tether_V1_PublishResult {
        try await Self.answer { () throws(APIFailure) in
            try self.checkSize(request)
            return .init(try await self.operations.publish(try Outgoing(request)))
        }
    }

    func publishBatch(request: Tether_V1_PublishBatchRequest, context: ServerContext) async throws -> Tether_V1_PublishBatchResponse {
        let publications = try Self.answerNow { () throws(APIFailure) in
            try self.checkSize(request)
            try ServerAPIOperations.checkBatch(request.publications.count)
            var publications: [Outgoing] = []
            publications.reserveCapacity(request.publications.count)
            for (index, publication) in request.publications.enumerated() {
                do throws(APIFailure) {
                    publications.append(try Outgoing(publication))
                } catch {
                    throw .invalid("publications[\(index)]: \(error.message)")
                }
            }
            return publications
        }
        var response = Tether_V1_PublishBatchResponse()
        response.results = await self.operations.publishBatch(publications).map { result in
            var outcome = Tether_V1_BatchResult()
            switch result {
            case .success(let published):
                outcome.result = .init(published)
            case .failure(let failure):
                outcome.error = .with {
                    $0.code = failure.code
                    $0.message = failure.message
                }
            }
            return outcome
        }
        return response
    }

    func sendMessage(request: Tether_V1_SendMessageRequest, context: ServerContext) async throws -> Tether_V1_SendMessageResponse {
        try await Self.answer { () throws(APIFailure) in
            try self.checkSize(request)
            let delivery = try await self.operations.sendMessage(
                to: request.client,
                topic: request.topic,
                payload: ByteBuffer(bytes: request.data),
                key: request.idempotencyKey
            )
            var response = Tether_V1_SendMessageResponse()
            switch delivery {
            case .delivered(let sequence): response.sequence = sequence
            case .duplicate: response.duplicate = true
            }
            return response
        }
    }

    func channelHistory(request: Tether_V1_ChannelHistoryRequest, context: ServerContext) async throws -> Tether_V1_HistoryPage {
        try await Self.answer { () throws(APIFailure) in
            let page = try await self.operations.history(
                of: request.channel,
                after: request.hasAfter ? ChannelPosition(epoch: request.after.epoch, offset: request.after.offset) : nil,
                limit: request.limit == 0 ? 100 : Int(request.limit)
            )
            var response = Tether_V1_HistoryPage()
            response.epoch = page.epoch
            response.offset = page.top
            response.gap = page.gap != nil
            response.more = page.more
            response.publications = page.publications.map { publication in
                .with {
                    $0.offset = publication.position.offset
                    $0.publisher = publication.publisher
                    $0.data = Data(publication.body.readableBytesView)
                }
            }
            return response
        }
    }

    func channelPresence(request: Tether_V1_ChannelPresenceRequest, context: ServerContext) async throws -> Tether_V1_PresencePage {
        try Self.answerNow { () throws(APIFailure) in
            let page = try self.operations.presence(
                of: request.channel,
                after: request.after,
                limit: request.limit == 0 ? 1_000 : Int(request.limit)
            )
            var response = Tether_V1_PresencePage()
            response.total = UInt64(page.total)
            response.members = page.members.map { member in
                var entry = Tether_V1_PresenceMember()
                entry.client = member.clientID
                entry.connections = UInt64(member.connections)
                if !member.info.isEmpty { entry.info = member.info }
                return entry
            }
            return response
        }
    }

    func clientConnections(request: Tether_V1_ClientConnectionsRequest, context: ServerContext) async throws -> Tether_V1_Connections {
        try await Self.answer { () async throws(APIFailure) in .init(try await self.operations.connections(of: request.client)) }
    }

    func roomMembers(request: Tether_V1_RoomMembersRequest, context: ServerContext) async throws -> Tether_V1_Connections {
        try await Self.answer { () async throws(APIFailure) in .init(try await self.operations.members(of: request.room)) }
    }

    func disconnectClient(
        request: Tether_V1_DisconnectClientRequest,
        context: ServerContext
    ) async throws -> Tether_V1_DisconnectClientResponse {
        try Self.answerNow { () throws(APIFailure) in
            let count = try self.operations.disconnect(
                client: request.client,
                reconnect: request.reconnect,
                retryAfterMs: Int(request.retryAfterMs),
                message: request.message
            )
            return .with { $0.disconnected = UInt64(count) }
        }
    }

    func refreshClient(request: Tether_V1_RefreshClientRequest, context: ServerContext) async throws -> Tether_V1_ClientConnectionCount {
        try Self.answerNow { () throws(APIFailure) in
            let count = try self.operations.refreshCredentials(client: request.client, expiresAt: request.expiresAt)
            return .with { $0.connections = UInt64(count) }
        }
    }

    func expireClient(request: Tether_V1_ExpireClientRequest, context: ServerContext) async throws -> Tether_V1_ClientConnectionCount {
        try Self.answerNow { () throws(APIFailure) in
            let count = try self.operations.expireCredentials(client: request.client, message: request.message)
            return .with { $0.connections = UInt64(count) }
        }
    }

    // MARK: Refusals

    private static func answer<T>(_ body: () async throws(APIFailure) -> T) async throws(RPCError) -> T {
        do {
            return try await body()
        } catch {
            throw error.rpcError
        }
    }

    private static func answerNow<T>(_ body: () throws(APIFailure) -> T) throws(RPCError) -> T {
        do {
            return try body()
        } catch {
            throw error.rpcError
        }
    }
}

extension APIFailure {
    /// The gRPC status of the refusal (`server_api.proto` says which).
    var rpcError: RPCError {
        let code: RPCError.Code =
            switch (self.status, self.code) {
            case (_, "disabled"): .failedPrecondition
            case (400, _): .invalidArgument
            case (401, _): .unauthenticated
            case (413, _): .resourceExhausted
            case (429, _): .resourceExhausted
            case (503, _): .unavailable
            default: .internalError
            }
        return RPCError(code: code, message: self.message)
    }
}

@available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *)
extension Outgoing {
    /// A gRPC publication: its target is a `oneof`, its payload bytes.
    init(_ publication: Tether_V1_Publication) throws(APIFailure) {
        var client: String?
        var connection: Int64?
        var room: String?
        var channel: String?
        var everyone: Bool?
        switch publication.target {
        case .client(let value): client = value
        case .connection(let value):
            guard let id = Int64(exactly: value) else { throw .invalid("a connection id is at most \(Int64.max)") }
            connection = id
        case .room(let value): room = value
        case .channel(let value): channel = value
        case .everyone(let value): everyone = value
        case nil: break
        }
        try self.init(
            client: client,
            connection: connection,
            room: room,
            channel: channel,
            everyone: everyone,
            topic: publication.topic.isEmpty ? nil : publication.topic,
            publisher: publication.publisher.isEmpty ? nil : publication.publisher,
            payload: .success(ByteBuffer(bytes: publication.data))
        )
    }
}

@available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *)
extension Tether_V1_PublishResult {
    init(_ published: ServerAPIOperations.Published) {
        self.init()
        self.delivered = UInt64(published.delivered)
        if let position = published.position {
            self.position = .with {
                $0.epoch = position.epoch
                $0.offset = position.offset
            }
        }
    }
}

@available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *)
extension Tether_V1_Connections {
    init(_ answers: ClusterAnswers) {
        self.init()
        self.connections = answers.connections.map { entry in
            let info = entry.connection
            var connection = Tether_V1_Connection()
            connection.id = info.id
            connection.client = info.clientID
            if let userAgent = info.userAgent { connection.userAgent = userAgent }
            if let address = info.remoteAddress { connection.remoteAddress = address }
            if let node = entry.node { connection.node = node }
            return connection
        }
        self.unansweredNodes = answers.unanswered
    }
}

/// Refuses every call that does not carry one of the API keys (`authorization: Bearer KEY`)
/// with UNAUTHENTICATED, before its handler runs.
@available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *)
struct APIKeyInterceptor: ServerInterceptor {
    let keys: APIKeys

    func intercept<Input: Sendable, Output: Sendable>(
        request: StreamingServerRequest<Input>,
        context: ServerContext,
        next: @Sendable (StreamingServerRequest<Input>, ServerContext) async throws -> StreamingServerResponse<Output>
    ) async throws -> StreamingServerResponse<Output> {
        let header = request.metadata[stringValues: "authorization"].first(where: { _ in true })
        guard self.keys.authorizes(header) else {
            throw RPCError(code: .unauthenticated, message: "an API key is needed: authorization: Bearer KEY")
        }
        return try await next(request, context)
    }
}
