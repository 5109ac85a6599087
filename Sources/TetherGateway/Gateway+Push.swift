public import NIOCore
import TetherCore

extension Gateway {
    /// Pushes a message to the connections `target` names.
    ///
    /// Pushes are fire-and-forget: not stored, not acknowledged, not replayed to clients that
    /// are disconnected. A push larger than a recipient's maximum body size is not sent to that
    /// recipient (and logged).
    ///
    /// ```swift
    /// try gateway.push("chat.message", ByteBuffer(string: "hi all"), to: .room("lobby"))
    /// ```
    /// - Parameters:
    ///   - topic: What the push is about; 1 to 65,535 bytes of UTF-8.
    ///   - body: The push's content.
    ///   - target: A connection, a client id, a room, or everyone.
    /// - Returns: The number of connections the push was sent to.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for a bad topic.
    @discardableResult
    public func push(_ topic: String, _ body: ByteBuffer, to target: PushTarget) throws(GatewayError) -> Int {
        guard !topic.isEmpty, topic.utf8.count <= Int(UInt16.max) else {
            throw GatewayError(code: .invalidArgument, message: "a push topic must be 1 to 65535 bytes long")
        }
        let frame = Frame(.push(.init(topic: topic, body: body)))
        let channels = self.registry.channels(for: target)
        if channels.count == 1 {
            channels[0].writeAndFlush(frame, promise: nil)
            return 1
        }
        // One hop per event loop, not one per recipient; each connection's handler flushes once
        // at the end of the loop's batch, so a burst of pushes leaves in few writes.
        var byLoop: [ObjectIdentifier: (loop: any EventLoop, channels: [any Channel])] = [:]
        for channel in channels {
            byLoop[ObjectIdentifier(channel.eventLoop), default: (channel.eventLoop, [])].channels.append(channel)
        }
        for (loop, members) in byLoop.values {
            if loop.inEventLoop {
                for channel in members { channel.writeAndFlush(frame, promise: nil) }
            } else {
                loop.execute {
                    for channel in members { channel.writeAndFlush(frame, promise: nil) }
                }
            }
        }
        return channels.count
    }

    /// Puts a connection in a room.
    /// - Returns: `false` if no established connection has this id.
    @discardableResult
    public func join(room: String, connection: UInt64) -> Bool {
        self.registry.join(room, connection: connection)
    }

    /// Takes a connection out of a room.
    public func leave(room: String, connection: UInt64) {
        self.registry.leave(room, connection: connection)
    }

    /// The connections in a room.
    public func members(of room: String) -> [ConnectionInfo] {
        self.registry.members(of: room)
    }
}
