public import NIOCore
import TetherCore

/// A message the gateway pushed on a topic.
public struct Push: Sendable, Hashable {
    /// The topic, for example `chat.message`.
    public var topic: String
    /// The push's content.
    public var body: ByteBuffer

    public init(topic: String, body: ByteBuffer) {
        self.topic = topic
        self.body = body
    }
}

extension TetherClient {
    /// The pushes on `topic` from now on, or on every topic if `topic` is `nil`.
    ///
    /// Each call is an independent subscription; the stream ends when the client stops. Pushes
    /// survive reconnects of the client (the subscription does not need renewing), but pushes
    /// the gateway sent while the client was disconnected are not replayed.
    ///
    /// ```swift
    /// for await message in client.pushes(topic: "chat.message") {
    ///     print(String(buffer: message.body))
    /// }
    /// ```
    /// - Important: A subscriber that falls more than ``ClientConfiguration/Pushes-swift.struct/bufferSize``
    ///   pushes behind loses the oldest ones; ``droppedPushes`` counts them.
    public func pushes(topic: String? = nil) -> AsyncStream<Push> {
        self.pushRouter.subscribe(topic: topic)
    }

    /// The connection events from now on (connecting, connected, disconnected, backing off,
    /// failed). Each access is an independent subscription; it ends when the client stops.
    public var events: AsyncStream<ConnectionEvent> {
        self.eventBroadcaster.subscribe()
    }

    func deliver(_ push: Frame.Push) {
        let dropped = self.pushRouter.route(Push(topic: push.topic, body: push.body))
        if dropped > 0 {
            self.droppedPushCount.wrappingIncrement(by: dropped, ordering: .relaxed)
            self.logger.warning("a push subscriber is too slow; dropped its oldest push", metadata: ["topic": "\(push.topic)"])
        }
    }
}
