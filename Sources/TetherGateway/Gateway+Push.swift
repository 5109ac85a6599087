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
        let recipients = self.registry.recipients(for: target)
        guard !recipients.isEmpty else { return 0 }
        // Encoded once, whatever the number of recipients: each gets the same bytes.
        let push: EncodedPush
        do {
            push = try EncodedPush(Frame.Push(topic: topic, body: body), allocator: Self.pushAllocator)
        } catch {
            throw GatewayError(code: .invalidArgument, message: "the push cannot be encoded: \(error.message)")
        }
        // One hop per event loop, not one per recipient. Each loop's batcher joins the pushes
        // made during its current batch of work and writes them to each member at once.
        var count = 0
        for (index, recipients) in recipients.enumerated() {
            count += recipients.handlers.count
            let push = index == 0 ? push : push.copy(allocator: Self.pushAllocator)
            let loop = recipients.loop
            let batcher = self.pushBatchers[ObjectIdentifier(loop)]
            if loop.inEventLoop {
                Self.deliver(push, to: recipients, batcher: batcher)
            } else {
                loop.execute { Self.deliver(push, to: recipients, batcher: batcher) }
            }
        }
        return count
    }

    private static let pushAllocator = ByteBufferAllocator()

    /// Queues `push` in the batcher of the recipients' loop, or writes it at once for
    /// connections on a loop outside the gateway's group (see ``accept(_:)``).
    private static func deliver(_ push: EncodedPush, to recipients: ConnectionRegistry.LoopRecipients, batcher: PushBatcher?) {
        if let batcher {
            batcher.add(push, to: recipients)
        } else {
            PushBatcher.writeNow(push, to: recipients)
        }
    }

    /// Puts a connection in a room.
    /// - Returns: `false` if no established connection has this id, or its client may not be in
    ///   that room (its credentials' rooms, or the ``authorize(_:)`` hook).
    @discardableResult
    public func join(room: String, connection: UInt64) -> Bool {
        // The check runs outside the registry's lock: the application's hook may call the gateway.
        guard let info = self.registry.info(of: connection), self.services.router.permits(.join(room: room), info) else {
            return false
        }
        return self.registry.join(room, connection: connection)
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
