public import Foundation
import NIOCore
import NIOFoundationCompat
public import TetherCore

// `Data` and `Codable` beside `ByteBuffer`: the same calls, for code that works in Foundation
// types or sends JSON.

extension TetherClient {
    /// Calls `method` with a `Data` body and returns the response body as `Data`; see
    /// ``request(_:body:timeout:)``.
    public func request(_ method: String, data: Data, timeout: Duration? = nil) async throws(TetherError) -> Data {
        Data(buffer: try await self.request(method, body: ByteBuffer(data: data), timeout: timeout))
    }

    /// Calls `method` with `value` encoded as JSON and decodes the response as `Response`; see
    /// ``request(_:body:timeout:)``.
    ///
    /// ```swift
    /// struct Enter: Codable { var room: String }
    /// struct Entered: Codable { var members: Int }
    /// let entered = try await client.request("room.enter", json: Enter(room: "lobby"), as: Entered.self)
    /// ```
    /// - Parameters:
    ///   - method: The route to call.
    ///   - value: The request, encoded with `encoder`.
    ///   - type: The response's type, decoded with `decoder`.
    ///   - timeout: As in ``request(_:body:timeout:)``.
    ///   - encoder: Encodes the request (a `JSONEncoder` by default).
    ///   - decoder: Decodes the response (a `JSONDecoder` by default).
    /// - Throws: ``TetherError``: those of ``request(_:body:timeout:)``; ``TetherError/Code/invalidArgument``
    ///   if `value` cannot be encoded; ``TetherError/Code/invalidResponse`` if the response cannot
    ///   be decoded (the cause says why).
    public func request<Request: Encodable, Response: Decodable>(
        _ method: String,
        json value: Request,
        as type: Response.Type = Response.self,
        timeout: Duration? = nil,
        encoder: JSONEncoder = JSONEncoder(),
        decoder: JSONDecoder = JSONDecoder()
    ) async throws(TetherError) -> Response {
        let body = try Self.encode(value, with: encoder, for: "the request to '\(method)'")
        let reply = try await self.request(method, body: body, timeout: timeout)
        do {
            return try decoder.decode(Response.self, from: reply)
        } catch {
            throw TetherError(
                code: .invalidResponse,
                message: "the response to '\(method)' is not a \(Response.self): \(error)",
                cause: error
            )
        }
    }

    /// Sends a message with a `Data` body reliably; see ``send(_:body:conversation:priority:ttl:)``.
    public func send(
        _ topic: String,
        data: Data,
        conversation: String = "",
        priority: MessagePriority = .normal,
        ttl: Duration? = nil
    ) async throws(TetherError) -> MessageReceipt {
        try await self.send(topic, body: ByteBuffer(data: data), conversation: conversation, priority: priority, ttl: ttl)
    }

    /// Sends `value`, encoded as JSON, reliably; see ``send(_:body:conversation:priority:ttl:)``.
    /// - Throws: ``TetherError``: those of ``send(_:body:conversation:priority:ttl:)``, or
    ///   ``TetherError/Code/invalidArgument`` if `value` cannot be encoded.
    public func send(
        _ topic: String,
        json value: some Encodable,
        conversation: String = "",
        priority: MessagePriority = .normal,
        ttl: Duration? = nil,
        encoder: JSONEncoder = JSONEncoder()
    ) async throws(TetherError) -> MessageReceipt {
        let body = try Self.encode(value, with: encoder, for: "the message on '\(topic)'")
        return try await self.send(topic, body: body, conversation: conversation, priority: priority, ttl: ttl)
    }

    /// Publishes `value`, encoded as JSON, to a channel; see ``publish(_:toChannel:timeout:)``.
    /// - Throws: ``TetherError``: those of ``publish(_:toChannel:timeout:)``, or
    ///   ``TetherError/Code/invalidArgument`` if `value` cannot be encoded.
    @discardableResult
    public func publish(
        json value: some Encodable,
        toChannel channel: String,
        timeout: Duration? = nil,
        encoder: JSONEncoder = JSONEncoder()
    ) async throws(TetherError) -> ChannelPosition {
        let body = try Self.encode(value, with: encoder, for: "the publication to '\(channel)'")
        return try await self.publish(body, toChannel: channel, timeout: timeout)
    }

    static func encode(_ value: some Encodable, with encoder: JSONEncoder, for what: String) throws(TetherError) -> ByteBuffer {
        do {
            return ByteBuffer(data: try encoder.encode(value))
        } catch {
            throw TetherError(code: .invalidArgument, message: "cannot encode \(what): \(error)", cause: error)
        }
    }
}

extension Push {
    /// The body as `Data`.
    public var data: Data { Data(buffer: self.body) }

    /// The body decoded from JSON.
    /// - Throws: The decoder's error.
    public func decode<Value: Decodable>(_ type: Value.Type = Value.self, decoder: JSONDecoder = JSONDecoder()) throws -> Value {
        try decoder.decode(Value.self, from: self.body)
    }
}

extension ChannelPublication {
    /// The body as `Data`.
    public var data: Data { Data(buffer: self.body) }

    /// The body decoded from JSON.
    /// - Throws: The decoder's error.
    public func decode<Value: Decodable>(_ type: Value.Type = Value.self, decoder: JSONDecoder = JSONDecoder()) throws -> Value {
        try decoder.decode(Value.self, from: self.body)
    }
}

extension Delivery {
    /// The body as `Data`.
    public var data: Data { Data(buffer: self.body) }

    /// The body decoded from JSON.
    /// - Throws: The decoder's error.
    public func decode<Value: Decodable>(_ type: Value.Type = Value.self, decoder: JSONDecoder = JSONDecoder()) throws -> Value {
        try decoder.decode(Value.self, from: self.body)
    }
}
