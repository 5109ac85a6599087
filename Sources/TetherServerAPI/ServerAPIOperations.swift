import Foundation
import NIOCore
import TetherCore
import TetherGateway

/// The server API's calls, whichever form they come in (JSON over HTTP, gRPC): each checks
/// what the form's decoder does not, acts on the gateway, and throws ``APIFailure`` — the same
/// checks, the same messages, the same outcomes in both forms.
struct ServerAPIOperations: Sendable {
    let gateway: Gateway

    /// The most publications a batch holds.
    static let maxBatch = 1_000

    /// What a publication did.
    struct Published: Sendable {
        /// How many connections a push was written to (0 for a channel).
        var delivered: Int
        /// A channel publication's place in its history, when its rule keeps one.
        var position: ChannelPosition?
    }

    func publish(_ publication: Outgoing) async throws(APIFailure) -> Published {
        do {
            return try await publication.send(through: self.gateway)
        } catch {
            throw APIFailure(error)
        }
    }

    /// Checks a batch's size; its publications were each checked when made.
    static func checkBatch(_ count: Int) throws(APIFailure) {
        guard (1...Self.maxBatch).contains(count) else {
            throw .invalid("a batch holds 1 to \(Self.maxBatch) publications, got \(count)")
        }
    }

    /// Sends a checked batch in order: one failure does not stop the ones after it.
    func publishBatch(_ publications: [Outgoing]) async -> [Result<Published, APIFailure>] {
        var results: [Result<Published, APIFailure>] = []
        results.reserveCapacity(publications.count)
        for publication in publications {
            do {
                results.append(.success(try await publication.send(through: self.gateway)))
            } catch {
                results.append(.failure(APIFailure(error)))
            }
        }
        return results
    }

    func sendMessage(to client: String, topic: String, payload: ByteBuffer, key: String) async throws(APIFailure) -> Gateway.KeyedDelivery {
        guard (1...255).contains(key.utf8.count) else { throw .invalid("Idempotency-Key must be 1 to 255 bytes") }
        if let failure = APIFailure.length(of: client, "a client id") ?? APIFailure.length(of: topic, "a topic") { throw failure }
        do {
            return try await self.gateway.deliver(to: client, topic: topic, body: payload, idempotencyKey: key)
        } catch {
            throw APIFailure(error)
        }
    }

    func history(of channel: String, after position: ChannelPosition?, limit: Int) async throws(APIFailure) -> ChannelHistoryPage {
        do {
            return try await self.gateway.history(of: channel, after: position, limit: limit)
        } catch {
            throw APIFailure(error)
        }
    }

    func presence(of channel: String, after: String, limit: Int) throws(APIFailure) -> ChannelPresencePage {
        guard after.utf8.count <= Int(UInt16.max) else { throw .invalid("after is a client id: at most 65535 bytes") }
        do {
            return try self.gateway.presence(of: channel, after: after, limit: limit)
        } catch {
            throw APIFailure(error)
        }
    }

    /// A client id's connections on every node: this node's first, each node's sorted by id.
    func connections(of client: String) async throws(APIFailure) -> ClusterAnswers {
        if let failure = APIFailure.length(of: client, "a client id") { throw failure }
        return try await self.inCluster(.connections(client: client))
    }

    /// A room's members on every node: this node's first, each node's sorted by connection id.
    func members(of room: String) async throws(APIFailure) -> ClusterAnswers {
        if let failure = APIFailure.length(of: room, "a room name") { throw failure }
        return try await self.inCluster(.members(room: room))
    }

    private func inCluster(_ question: ClusterQuestion) async throws(APIFailure) -> ClusterAnswers {
        do {
            return try await self.gateway.connectionsInCluster(question)
        } catch {
            let reason = (error as? MessageStoreError)?.message ?? "\(error)"
            throw APIFailure(status: 503, code: "unavailable", message: "the other nodes cannot be asked: \(reason)")
        }
    }

    /// Closes a client id's connections; how many.
    func disconnect(client: String, reconnect: Bool, retryAfterMs: Int, message: String) throws(APIFailure) -> Int {
        if let failure = APIFailure.length(of: client, "a client id") { throw failure }
        guard message.utf8.count <= 1_000 else { throw .invalid("message is at most 1000 bytes") }
        guard (0...86_400_000).contains(retryAfterMs) else { throw .invalid("retry_after_ms must be 0 to 86400000") }
        return self.gateway.disconnect(client: client, reconnect: reconnect, retryAfter: .milliseconds(retryAfterMs), message: message)
    }

    /// Sets when a client id's credentials expire (Unix seconds); how many connections.
    func refreshCredentials(client: String, expiresAt: Int64) throws(APIFailure) -> Int {
        if let failure = APIFailure.length(of: client, "a client id") { throw failure }
        guard (1...253_402_300_799).contains(expiresAt) else {
            throw .invalid("expires_at is Unix time in seconds, 1 to 253402300799, got \(expiresAt)")
        }
        return self.gateway.refreshCredentials(client: client, expiresAt: Date(timeIntervalSince1970: TimeInterval(expiresAt)))
    }

    /// Ends a client id's credentials now; how many connections.
    func expireCredentials(client: String, message: String) throws(APIFailure) -> Int {
        if let failure = APIFailure.length(of: client, "a client id") { throw failure }
        guard message.utf8.count <= 1_000 else { throw .invalid("message is at most 1000 bytes") }
        return self.gateway.expireCredentials(client: client, message: message)
    }
}

/// A publication checked against the API's rules, ready to send.
struct Outgoing: Sendable {
    enum Target: Sendable {
        case push(topic: String, PushTarget)
        case channel(String, publisher: String)
    }

    var target: Target
    var payload: ByteBuffer

    /// Checks a publication as either form gives it: one target (`client`, `connection`,
    /// `room`, `channel` or `everyone`), a topic for a push, a publisher for a channel only.
    /// - Parameter payload: The payload, or why the form could not read it (thrown after the
    ///   target is checked).
    init(
        client: String?,
        connection: Int64?,
        room: String?,
        channel: String?,
        everyone: Bool?,
        topic: String?,
        publisher: String?,
        payload: Result<ByteBuffer, APIFailure>
    ) throws(APIFailure) {
        var targets: [String] = []
        if client != nil { targets.append("client") }
        if connection != nil { targets.append("connection") }
        if room != nil { targets.append("room") }
        if channel != nil { targets.append("channel") }
        if everyone != nil { targets.append("everyone") }
        guard targets.count == 1 else {
            throw .invalid(
                targets.isEmpty
                    ? "a publication needs one target: client, connection, room, channel or everyone"
                    : "a publication has one target, got \(targets.joined(separator: ", "))"
            )
        }
        self.payload = try payload.get()
        if let channel {
            guard topic == nil else { throw .invalid("a channel publication has no topic (its channel says what it is)") }
            guard Frame.isValidChannelName(channel) else {
                throw .invalid("a channel name must be 1 to \(Frame.maxChannelLength) bytes long")
            }
            let publisher = publisher ?? ""
            guard publisher.utf8.count <= 255 else { throw .invalid("publisher is at most 255 bytes") }
            self.target = .channel(channel, publisher: publisher)
            return
        }
        guard publisher == nil else { throw .invalid("publisher is for channel publications only") }
        guard let topic else { throw .invalid("a push needs a topic") }
        if let failure = APIFailure.length(of: topic, "a topic") { throw failure }
        if let client {
            if let failure = APIFailure.length(of: client, "a client id") { throw failure }
            self.target = .push(topic: topic, .client(client))
        } else if let connection {
            guard connection >= 0 else { throw .invalid("a connection id is at least 0") }
            self.target = .push(topic: topic, .connection(UInt64(connection)))
        } else if let room {
            if let failure = APIFailure.length(of: room, "a room name") { throw failure }
            self.target = .push(topic: topic, .room(room))
        } else {
            guard everyone == true else { throw .invalid("everyone must be true when it is the target") }
            self.target = .push(topic: topic, .all)
        }
    }

    func send(through gateway: Gateway) async throws(GatewayError) -> ServerAPIOperations.Published {
        switch self.target {
        case .push(let topic, let target):
            return .init(delivered: try gateway.push(topic, self.payload, to: target))
        case .channel(let channel, let publisher):
            let position = try await gateway.publish(self.payload, toChannel: channel, publisher: publisher)
            return .init(delivered: 0, position: position.epoch == 0 ? nil : position)
        }
    }
}

/// A refusal of the API: its HTTP status, its code (the JSON `Error`'s `code`) and message.
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
}
