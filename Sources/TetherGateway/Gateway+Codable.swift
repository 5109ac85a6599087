public import Foundation
import NIOCore
import NIOFoundationCompat

// `Data` and `Codable` beside `ByteBuffer`: the same calls, for code that works in Foundation
// types or speaks JSON.

extension Gateway {
    /// Pushes a `Data` body; see ``push(_:_:to:)``.
    @discardableResult
    public func push(_ topic: String, data: Data, to target: PushTarget) throws(GatewayError) -> Int {
        try self.push(topic, ByteBuffer(data: data), to: target)
    }

    /// Pushes `value` encoded as JSON; see ``push(_:_:to:)``.
    ///
    /// ```swift
    /// try gateway.push("score", json: Score(home: 2, away: 1), to: .room("match-7"))
    /// ```
    /// - Throws: ``GatewayError`` with ``GatewayError/Code/invalidArgument`` for a bad topic or a
    ///   value that cannot be encoded.
    @discardableResult
    public func push(
        _ topic: String,
        json value: some Encodable,
        to target: PushTarget,
        encoder: JSONEncoder = JSONEncoder()
    ) throws(GatewayError)
        -> Int
    {
        let body: ByteBuffer
        do {
            body = ByteBuffer(data: try encoder.encode(value))
        } catch {
            throw GatewayError(code: .invalidArgument, message: "cannot encode the push on '\(topic)': \(error)")
        }
        return try self.push(topic, body, to: target)
    }

    /// Publishes `value` encoded as JSON to a channel; see ``publish(_:toChannel:publisher:)``.
    ///
    /// ```swift
    /// try await gateway.publish(json: ChatLine(from: "alice", text: "hi"), toChannel: "room.lobby")
    /// ```
    /// - Throws: ``GatewayError`` with ``GatewayError/Code/invalidArgument`` for a value that
    ///   cannot be encoded, and as ``publish(_:toChannel:publisher:)`` does.
    @discardableResult
    public func publish(
        json value: some Encodable,
        toChannel channel: String,
        publisher: String = "",
        encoder: JSONEncoder = JSONEncoder()
    ) async throws(GatewayError) -> ChannelPosition {
        let body: ByteBuffer
        do {
            body = ByteBuffer(data: try encoder.encode(value))
        } catch {
            throw GatewayError(code: .invalidArgument, message: "cannot encode the publication to '\(channel)': \(error)")
        }
        return try await self.publish(body, toChannel: channel, publisher: publisher)
    }

    /// Registers a handler of `method` that takes and returns JSON; see ``handle(_:_:)``.
    ///
    /// A body that does not decode as `Request` is answered with ``StatusCode/invalidRequest``
    /// without running the handler.
    ///
    /// ```swift
    /// gateway.handle("room.enter", json: Enter.self) { enter, context in
    ///     context.join(enter.room)
    ///     return Entered(members: gateway.members(of: enter.room).count)
    /// }
    /// ```
    public func handle<Request: Decodable & Sendable, Response: Encodable & Sendable>(
        _ method: String,
        json type: Request.Type,
        decoder: JSONDecoder = JSONDecoder(),
        encoder: JSONEncoder = JSONEncoder(),
        _ handler: @escaping @Sendable (Request, RequestContext) async throws -> Response
    ) {
        let decoder = SendableCoder(decoder)
        let encoder = SendableCoder(encoder)
        self.handle(method) { request, context in
            let value: Request
            do {
                value = try decoder.coder.decode(Request.self, from: request.body)
            } catch {
                throw RequestError(.invalidRequest, "the body is not a \(Request.self): \(error)")
            }
            let response = try await handler(value, context)
            return ByteBuffer(data: try encoder.coder.encode(response))
        }
    }
}

extension GatewayRequest {
    /// The body as `Data`.
    public var data: Data { Data(buffer: self.body) }
}

/// A JSON coder captured by a handler that runs on many threads. `JSONEncoder` and
/// `JSONDecoder` are not `Sendable` on every platform, but encoding and decoding with a coder
/// whose options are no longer changed is safe, and the gateway changes none.
private struct SendableCoder<Coder>: @unchecked Sendable {
    let coder: Coder
    init(_ coder: Coder) { self.coder = coder }
}
