public import NIOCore
public import TetherCore

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
        try self.pushes.push(topic, body, to: target)
    }

    /// Publishes to a channel: the publication is appended to the channel's history (when its
    /// rule in ``GatewayConfiguration/Channels-swift.struct`` keeps one) and sent to its
    /// subscribers. A subscriber that was away gets it when it subscribes again from its
    /// position, while the history keeps it; after that, it is told of the gap.
    ///
    /// ```swift
    /// try await gateway.publish(ByteBuffer(string: "hi all"), toChannel: "room.lobby", publisher: "alice")
    /// ```
    /// - Parameters:
    ///   - body: The publication's content.
    ///   - channel: The channel, 1 to 255 bytes of UTF-8.
    ///   - publisher: Who published it, as subscribers see it (a client id); empty for the
    ///     gateway or the backend.
    /// - Returns: The publication's position in the channel (both 0 in a channel without
    ///   history). This node's subscribers only: channels are not shared in a cluster yet.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for a bad
    ///   channel name or publisher, ``GatewayError/Code/disabled`` when channels are off.
    @discardableResult
    public func publish(_ body: ByteBuffer, toChannel channel: String, publisher: String = "") async throws(GatewayError) -> ChannelPosition
    {
        try await self.pushes.publish(body, to: channel, publisher: publisher).0
    }

    /// A page of a channel's history: the publications after `position`, or, without one, its
    /// latest `limit` publications; oldest first.
    ///
    /// ```swift
    /// let page = try await gateway.history(of: "room.lobby", limit: 50)   // the last 50
    /// ```
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for a bad
    ///   channel name or a limit outside 1...1,000, ``GatewayError/Code/disabled`` when channels
    ///   are off.
    public func history(
        of channel: String,
        after position: ChannelPosition? = nil,
        limit: Int = 100
    ) async throws(GatewayError) -> ChannelHistoryPage {
        try await self.pushes.history(of: channel, after: position, limit: limit)
    }

    /// Who is subscribed to a channel whose rule keeps presence, on this node (and on the
    /// others of a cluster that shares presence): its members by client id (bytewise), each
    /// with its connections and its ``ClientIdentity/info``.
    ///
    /// ```swift
    /// let online = try gateway.presence(of: "room.lobby").members.map(\.clientID)
    /// ```
    /// - Parameters:
    ///   - after: The members after this client id; empty: from the first.
    ///   - limit: The most members, 1 to 1,000.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for a bad
    ///   channel name or limit, or a channel that keeps no presence;
    ///   ``GatewayError/Code/disabled`` when channels are off.
    public func presence(of channel: String, after: String = "", limit: Int = 1_000) throws(GatewayError) -> ChannelPresencePage {
        guard let hub = self.pushes.channels else {
            throw GatewayError(code: .disabled, message: "this gateway has no channels (its configuration's channels is nil)")
        }
        guard Frame.isValidChannelName(channel) else {
            throw GatewayError(code: .invalidArgument, message: "a channel name must be 1 to \(Frame.maxChannelLength) bytes long")
        }
        guard (1...ChannelPresenceQuery.maxLimit).contains(limit) else {
            throw GatewayError(code: .invalidArgument, message: "the limit must be 1 to \(ChannelPresenceQuery.maxLimit), got \(limit)")
        }
        guard hub.configuration.rule(for: channel)?.presence == true else {
            throw GatewayError(code: .invalidArgument, message: "\(channel) keeps no presence (its rule's presence is off)")
        }
        return hub.presence(of: channel, after: after, limit: limit)
    }

    /// What ``onChannelOccupancy(_:)`` calls: `occupied` is `true` when `channel` gained its
    /// first subscriber on this gateway, `false` when it lost its last.
    public typealias ChannelOccupancyHook = @Sendable (_ channel: String, _ occupied: Bool) -> Void

    /// Calls `hook` when a channel gains its first subscriber on this gateway (a connection
    /// subscribed, none was) or loses its last one (unsubscribed, refused, or closed): to start
    /// producing a feed only while someone reads it. In a cluster, each node calls its own.
    /// Calls come one at a time, in the order the changes happened, on the event loop of a
    /// connection that made one: keep it short (hand the work to a task). Set it before
    /// ``run()``.
    ///
    /// ```swift
    /// gateway.onChannelOccupancy { channel, occupied in
    ///     Task { occupied ? await feeds.start(channel) : await feeds.stop(channel) }
    /// }
    /// ```
    public func onChannelOccupancy(_ hook: @escaping ChannelOccupancyHook) {
        self.register("onChannelOccupancy") { $0.occupancy = hook }
    }

    /// What ``onDisconnect(_:)`` calls: the connection that closed, and why, as the
    /// `tether_connections_closed_total` metric's `code` says it: `none` (it ended
    /// without a goodbye: the client closed it or the network failed), `goaway_REASON` (the
    /// gateway sent GOAWAY: `goaway_revoked`, `goaway_shutdown`, …), an error's code the gateway
    /// sent, or `client_CODE` for one the client sent.
    public typealias DisconnectHook = @Sendable (_ connection: ConnectionInfo, _ reason: String) -> Void

    /// Calls `hook` when an established connection closes (once per connection, after it left
    /// its rooms and channels), on its event loop: keep it short (hand the work to a task).
    /// Set it before ``run()``.
    ///
    /// ```swift
    /// gateway.onDisconnect { connection, reason in
    ///     Task { await sessions.ended(connection.clientID, reason) }
    /// }
    /// ```
    public func onDisconnect(_ hook: @escaping DisconnectHook) {
        self.register("onDisconnect") { $0.disconnected = hook }
    }

    /// Puts a connection in a room.
    /// - Returns: `false` if no established connection has this id, or its client may not be in
    ///   that room (its credentials' rooms, or the ``authorize(_:)`` hook).
    @discardableResult
    public func join(room: String, connection: UInt64) -> Bool {
        Rooms.join(room, connection: connection, registry: self.registry, router: self.router)
    }

    /// Takes a connection out of a room.
    public func leave(room: String, connection: UInt64) {
        self.registry.leave(room, connection: connection)
    }

    /// The connections in a room.
    public func members(of room: String) -> [ConnectionInfo] {
        self.registry.members(of: room)
    }

    /// A client id's established connections to this gateway (a phone and a laptop: two).
    public func connections(of clientID: String) -> [ConnectionInfo] {
        self.registry.established(ofClient: clientID)
    }

    /// The connections that answer `question` on every node of the gateway's cluster: this
    /// node's, then the other nodes' (``GatewayCluster/ask(_:)``); this gateway's alone without
    /// a cluster. Each is named by its node; each node's are sorted by connection id.
    ///
    /// ```swift
    /// let found = try await gateway.connectionsInCluster(.connections(client: "alice"))
    /// for entry in found.connections { print(entry.node ?? "-", entry.connection.id) }
    /// if !found.unanswered.isEmpty { print("incomplete: \(found.unanswered) did not answer") }
    /// ```
    /// - Throws: When the cluster cannot ask the other nodes (its database is unreachable).
    public func connectionsInCluster(_ question: ClusterQuestion) async throws -> ClusterAnswers {
        var local: [ConnectionInfo]
        switch question {
        case .connections(let client): local = self.connections(of: client)
        case .members(let room): local = self.members(of: room)
        }
        local.sort { $0.id < $1.id }
        guard let cluster = self.cluster else {
            return ClusterAnswers(connections: local.map { NodeConnection(node: nil, connection: $0) })
        }
        var answers = try await cluster.ask(question)
        answers.connections = local.map { NodeConnection(node: cluster.nodeName, connection: $0) } + answers.connections
        return answers
    }

}

/// Joining a room: what ``Gateway/join(room:connection:)`` and a handler's
/// ``RequestContext/join(_:)`` share.
enum Rooms {
    static func join(_ room: String, connection: UInt64, registry: ConnectionRegistry, router: Router) -> Bool {
        // The check runs outside the registry's lock: the application's hook may call the gateway.
        guard let info = registry.info(of: connection), router.permits(.join(room: room), info) else { return false }
        return registry.join(room, connection: connection)
    }
}
