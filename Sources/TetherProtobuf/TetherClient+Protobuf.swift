import NIOCore
public import SwiftProtobuf
public import Tether

extension TetherClient {
    /// Calls a method with a protobuf request and decodes its protobuf response.
    ///
    /// ```swift
    /// let state: RoomState = try await client.request("room.enter", EnterRoom.with { $0.room = "lobby" })
    /// ```
    /// - Throws: ``TetherError``, including ``TetherError/Code/invalidResponse`` when the reply is
    ///   not a valid `Response`.
    public func request<Request: SwiftProtobuf.Message, Response: SwiftProtobuf.Message>(
        _ method: String,
        _ message: Request,
        as responseType: Response.Type = Response.self,
        timeout: Duration? = nil
    ) async throws(TetherError) -> Response {
        let body: ByteBuffer
        do {
            body = try message.serializedByteBuffer()
        } catch {
            throw TetherError(code: .invalidArgument, message: "cannot serialise \(Request.protoMessageName)", cause: error)
        }
        let reply = try await self.request(method, body: body, timeout: timeout)
        do {
            return try Response(decoding: reply)
        } catch {
            throw TetherError(
                code: .invalidResponse,
                message: "the response to '\(method)' is not a valid \(Response.protoMessageName)",
                cause: error
            )
        }
    }

    /// Calls a typed method.
    public func call<Request, Response>(
        _ method: ProtobufMethod<Request, Response>,
        _ message: Request,
        timeout: Duration? = nil
    ) async throws(TetherError) -> Response {
        try await self.request(method.name, message, as: Response.self, timeout: timeout)
    }
}

extension ChannelPublication {
    /// Decodes the publication's body as a protobuf message.
    /// - Throws: SwiftProtobuf's `BinaryDecodingError` if the body is not a valid `M`.
    public func decode<M: SwiftProtobuf.Message>(as type: M.Type = M.self) throws -> M {
        try M(decoding: self.body)
    }
}

extension Push {
    /// Decodes the push's body as a protobuf message.
    /// - Throws: SwiftProtobuf's `BinaryDecodingError` if the body is not a valid `M`.
    public func decode<M: SwiftProtobuf.Message>(as type: M.Type = M.self) throws -> M {
        try M(decoding: self.body)
    }
}
