public import SwiftProtobuf

/// A method with typed protobuf request and response messages, shared by client and gateway.
///
/// ```swift
/// enum RoomAPI {
///     static let enter = ProtobufMethod<EnterRoom, RoomState>("room.enter")
/// }
/// // gateway
/// gateway.handle(RoomAPI.enter) { request, context in RoomState.with { $0.members = … } }
/// // client
/// let state = try await client.call(RoomAPI.enter, EnterRoom.with { $0.room = "lobby" })
/// ```
public struct ProtobufMethod<Request: SwiftProtobuf.Message, Response: SwiftProtobuf.Message>: Sendable, Hashable {
    /// The method name on the wire.
    public let name: String

    public init(_ name: String) {
        self.name = name
    }
}
