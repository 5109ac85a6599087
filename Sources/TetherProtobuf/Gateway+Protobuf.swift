public import SwiftProtobuf
import TetherCore
public import TetherGateway

extension Gateway {
    /// Registers a handler that takes and returns protobuf messages.
    ///
    /// A request body that is not a valid `Request` is answered with
    /// ``StatusCode/invalidRequest`` without calling the handler.
    public func handle<Request: SwiftProtobuf.Message, Response: SwiftProtobuf.Message>(
        _ method: String,
        as requestType: Request.Type = Request.self,
        _ handler: @escaping @Sendable (Request, RequestContext) async throws -> Response
    ) {
        self.handle(method) { request, context in
            let message: Request
            do {
                message = try Request(decoding: request.body)
            } catch {
                throw RequestError(.invalidRequest, "the body is not a valid \(Request.protoMessageName): \(error)")
            }
            return try await handler(message, context).serializedByteBuffer()
        }
    }

    /// Registers the handler of a typed method.
    public func handle<Request, Response>(
        _ method: ProtobufMethod<Request, Response>,
        _ handler: @escaping @Sendable (Request, RequestContext) async throws -> Response
    ) {
        self.handle(method.name, as: Request.self, handler)
    }

    /// Pushes a protobuf message.
    @discardableResult
    public func push<M: SwiftProtobuf.Message>(_ topic: String, _ message: M, to target: PushTarget) throws -> Int {
        try self.push(topic, try message.serializedByteBuffer(), to: target)
    }

    /// Publishes a protobuf message to a channel; see ``Gateway/publish(_:toChannel:publisher:)``.
    @discardableResult
    public func publish<M: SwiftProtobuf.Message>(
        _ message: M,
        toChannel channel: String,
        publisher: String = ""
    ) async throws -> ChannelPosition {
        try await self.publish(try message.serializedByteBuffer(), toChannel: channel, publisher: publisher)
    }
}
