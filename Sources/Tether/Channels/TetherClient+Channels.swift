public import TetherCore

extension TetherClient {
    /// Subscribes to a channel: its publications, in order and each once, across reconnects,
    /// transport switches and node changes.
    ///
    /// The subscription is made on every connection the client establishes, from the position
    /// of the last publication it delivered: the gateway sends what it missed meanwhile, then
    /// the live publications, or says, with a ``SubscriptionEvent/gap(_:)``, what it can no longer
    /// get. Made while offline, it waits for a connection. It ends when the task reading it
    /// stops, when the client stops, or with a ``TetherError`` (code
    /// ``TetherError/Code/serverError``, the gateway's status) when the gateway refuses it
    /// (`permission denied`, `resource exhausted`, `invalid request`).
    ///
    /// ```swift
    /// for try await event in client.subscribe("room.lobby") {
    ///     if case .publication(let message) = event { print(message.publisher, String(buffer: message.body)) }
    /// }
    /// ```
    /// - Parameters:
    ///   - channel: The channel, 1 to 255 bytes of UTF-8.
    ///   - position: Where the app stopped last time (the ``ChannelPublication/position`` of the
    ///     last publication it handled, kept across launches): what followed it is recovered.
    ///     `nil` starts with what is published next.
    ///   - recover: Whether a reconnect recovers what was missed (`true`), or starts again
    ///     from what is published next (`false`, reported as `.subscribed(recovered: false)`).
    ///   - bufferSize: How many events may wait for the reader. A reader that falls further
    ///     behind makes the subscription subscribe again from the last publication it took (the
    ///     channel's history has the rest), or, without history, gets a gap.
    /// - Returns: The events; a second subscription to the same channel while one runs ends at
    ///   once with ``TetherError/Code/invalidArgument``.
    public func subscribe(
        _ channel: String,
        from position: ChannelPosition? = nil,
        recover: Bool = true,
        bufferSize: Int = 1_024
    ) -> ChannelSubscription {
        self.channels.subscribe(channel, from: position, recover: recover, bufferSize: bufferSize)
    }
}
