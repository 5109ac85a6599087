public import NIOCore
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
    ///     `nil` starts where the client's kept position says
    ///     (``ClientConfiguration/Channels-swift.struct/positions``), or with what is published next.
    ///   - recover: Whether a reconnect recovers what was missed (`true`), or starts again
    ///     from what is published next (`false`, reported as `.subscribed(recovered: false)`).
    ///   - presence: Whether it gets the channel's presence: after each
    ///     ``SubscriptionEvent/subscribed(recovered:)``, its members (``SubscriptionEvent/joined(clientID:info:)``),
    ///     then who joins and leaves. For a channel whose rule on the gateway keeps presence,
    ///     and a client that may see it (else the gateway refuses the subscription).
    ///   - bufferSize: How many events may wait for the reader. A reader that falls further
    ///     behind makes the subscription subscribe again from the last publication it took (the
    ///     channel's history has the rest), or, without history, gets a gap; a presence event
    ///     it could not take makes it subscribe again, to get the members afresh.
    /// - Returns: The events; a second subscription to the same channel while one runs ends at
    ///   once with ``TetherError/Code/invalidArgument``.
    public func subscribe(
        _ channel: String,
        from position: ChannelPosition? = nil,
        recover: Bool = true,
        presence: Bool = false,
        bufferSize: Int = 1_024
    ) -> ChannelSubscription {
        // Without a position, one the client kept is where it resumes (if it keeps them).
        let kept = self.configuration.channels.positions.map {
            ChannelPositionSaver(store: $0, channel: channel, interval: self.configuration.channels.saveInterval, clock: self.clock)
        }
        return self.channels.subscribe(
            channel,
            from: position,
            recover: recover,
            presence: presence,
            bufferSize: bufferSize,
            positions: kept,
            loadsPosition: position == nil && recover
        )
    }
}

extension TetherClient {
    /// A page of a channel's history, from the gateway: the publications after `position`,
    /// or, without one, the latest `limit`; oldest first.
    ///
    /// ```swift
    /// let page = try await client.history(of: "room.lobby", limit: 50)   // the last 50, to show on opening
    /// for message in page.publications { show(message) }
    /// ```
    /// - Parameters:
    ///   - channel: The channel, 1 to 255 bytes of UTF-8.
    ///   - position: Where to read after; with ``ChannelHistoryPage/more``, ask again after the
    ///     last publication of the page. A position the history no longer reaches back to gets
    ///     the ``ChannelHistoryPage/gap`` and what is kept after it.
    ///   - limit: The most publications, 1 to 1,000.
    ///   - timeout: As for a request.
    /// - Throws: ``TetherError``: ``TetherError/Code/invalidArgument`` for a bad channel or limit,
    ///   ``TetherError/Code/serverError`` with the gateway's status (`permission denied`:
    ///   the client may not subscribe to this channel; `unknown method`: the gateway has no
    ///   channels), and the errors of a request.
    public func history(
        of channel: String,
        after position: ChannelPosition? = nil,
        limit: Int = 100,
        timeout: Duration? = nil
    ) async throws(TetherError) -> ChannelHistoryPage {
        let query = ChannelHistoryQuery(channel: channel, after: position, limit: limit)
        let body: ByteBuffer
        do {
            body = try query.encoded()
        } catch {
            throw TetherError(code: .invalidArgument, message: error.message)
        }
        let reply = try await self.request(ChannelHistoryQuery.method, body: body, timeout: timeout)
        do {
            return try query.page(decoding: reply)
        } catch {
            throw TetherError(code: .invalidResponse, message: "the gateway's history page is malformed: \(error.message)")
        }
    }
}

extension TetherClient {
    /// Who is subscribed to a channel, from the gateway: its members by client id, each with
    /// how many connections it has there and the `info` its credentials carry.
    ///
    /// The gateway answers for channels whose rule keeps presence, to clients its credentials
    /// and authorization allow; in a cluster on PostgreSQL, for every node's connections.
    ///
    /// ```swift
    /// let page = try await client.presence(of: "room.lobby")
    /// print("\(page.total) online:", page.members.map(\.clientID))
    /// ```
    /// - Parameters:
    ///   - after: The members after this client id (bytewise); empty: from the first. Ask
    ///     again after the last one while fewer than ``ChannelPresencePage/total`` were read.
    ///   - limit: The most members, 1 to 1,000.
    /// - Throws: ``TetherError``: ``TetherError/Code/invalidArgument`` for a bad channel or
    ///   limit, ``TetherError/Code/serverError`` with the gateway's status (`permission
    ///   denied`; `invalid request` for a channel that keeps no presence), and the errors of a
    ///   request.
    public func presence(
        of channel: String,
        after: String = "",
        limit: Int = 1_000,
        timeout: Duration? = nil
    ) async throws(TetherError) -> ChannelPresencePage {
        let query = ChannelPresenceQuery(channel: channel, after: after, limit: limit)
        let body: ByteBuffer
        do {
            body = try query.encoded()
        } catch {
            throw TetherError(code: .invalidArgument, message: error.message)
        }
        let reply = try await self.request(ChannelPresenceQuery.method, body: body, timeout: timeout)
        do {
            return try query.page(decoding: reply)
        } catch {
            throw TetherError(code: .invalidResponse, message: "the gateway's presence page is malformed: \(error.message)")
        }
    }
}

extension TetherClient {
    /// Publishes to a channel, as this client: its subscribers get the publication with this
    /// client's id as publisher, and its history keeps it.
    ///
    /// The gateway lets clients publish only to the channels whose rule says so
    /// (`clientsMayPublish`), and that the client's credentials allow.
    ///
    /// ```swift
    /// let position = try await client.publish(ByteBuffer(string: "hi all"), toChannel: "room.lobby")
    /// ```
    /// - Returns: The publication's position in the channel (both 0 in a channel without history).
    /// - Throws: ``TetherError``: ``TetherError/Code/invalidArgument`` for a bad channel name,
    ///   ``TetherError/Code/serverError`` with `permission denied` where the client may not
    ///   publish, and the errors of a request. Like a request, a publication that timed out may
    ///   still have been published; so may one the gateway answered with `internal error` (its
    ///   store failed while committing, as a disk does).
    @discardableResult
    public func publish(
        _ body: ByteBuffer,
        toChannel channel: String,
        timeout: Duration? = nil
    ) async throws(TetherError) -> ChannelPosition {
        let request: ByteBuffer
        do {
            request = try ChannelPublishRequest(channel: channel, body: body).encoded()
        } catch {
            throw TetherError(code: .invalidArgument, message: error.message)
        }
        let reply = try await self.request(ChannelPublishRequest.method, body: request, timeout: timeout)
        do {
            return try ChannelPublishRequest.position(decoding: reply)
        } catch {
            throw TetherError(code: .invalidResponse, message: "the gateway's answer to a publication is malformed: \(error.message)")
        }
    }
}
