/// Who is in each channel: its members by client id, each with the connections it is there
/// on (a user on a phone and a laptop is one member with two connections), and the join and
/// leave events that changes in it make. No I/O.
///
/// A client **joins** a channel when its first connection subscribes and **leaves** when its
/// last one goes (unsubscribed, closed, or lost with its node), so a second device or a
/// reconnect that overlaps the old connection makes no event: what Phoenix.Presence calls a
/// key with several metas.
///
/// ```swift
/// var presence = PresenceTable<String>()
/// presence.join("room.lobby", client: "alice", on: key, info: "iPhone")   // .joined("alice", "iPhone")
/// presence.removeConnection(key)                                         // [("room.lobby", .left("alice"))]
/// ```
package struct PresenceTable<Info: Sendable & Hashable>: Sendable {
    /// One connection, on one node of a cluster (`node` 0 on a single gateway).
    package struct ConnectionKey: Sendable, Hashable {
        package var node: UInt64
        package var connection: UInt64

        package init(node: UInt64 = 0, connection: UInt64) {
            self.node = node
            self.connection = connection
        }
    }

    /// A member of a channel: a client id and what it attached on each of its connections.
    package struct Member: Sendable, Hashable {
        package var clientID: String
        package var connections: [ConnectionKey: Info]
    }

    /// A change of a channel's members.
    package enum Change: Sendable, Hashable {
        /// The client's first connection joined, with what it attached.
        case joined(String, Info)
        /// The client's last connection left.
        case left(String)
    }

    /// Members of each channel, by client id.
    private var channels: [String: [String: [ConnectionKey: Info]]] = [:]
    /// Each connection's channels and client id, to remove it in one step.
    private var byConnection: [ConnectionKey: (clientID: String, channels: Set<String>)] = [:]

    package init() {}

    /// A connection of `clientID` joined `channel` (a second join of the same connection
    /// replaces its info).
    /// - Returns: `.joined` when it is the client's first connection in the channel.
    @discardableResult
    package mutating func join(_ channel: String, client clientID: String, on connection: ConnectionKey, info: Info) -> Change? {
        assert(self.byConnection[connection].map { $0.clientID == clientID } ?? true, "a connection has one client id")
        let first = self.channels[channel]?[clientID] == nil
        self.channels[channel, default: [:]][clientID, default: [:]][connection] = info
        self.byConnection[connection, default: (clientID, [])].channels.insert(channel)
        return first ? .joined(clientID, info) : nil
    }

    /// A connection left `channel`.
    /// - Returns: `.left` when it was its client's last connection in the channel.
    @discardableResult
    package mutating func leave(_ channel: String, on connection: ConnectionKey) -> Change? {
        guard let entry = self.byConnection[connection], entry.channels.contains(channel) else { return nil }
        self.byConnection[connection]!.channels.remove(channel)
        if self.byConnection[connection]!.channels.isEmpty { self.byConnection[connection] = nil }
        return self.remove(connection, of: entry.clientID, from: channel)
    }

    /// A connection closed: it leaves every channel it was in.
    /// - Returns: The channels its client left, with the change in each.
    package mutating func removeConnection(_ connection: ConnectionKey) -> [(channel: String, change: Change)] {
        guard let entry = self.byConnection.removeValue(forKey: connection) else { return [] }
        return entry.channels.sorted().compactMap { channel in
            self.remove(connection, of: entry.clientID, from: channel).map { (channel, $0) }
        }
    }

    /// A node is gone: every connection it held leaves.
    package mutating func removeNode(_ node: UInt64) -> [(channel: String, change: Change)] {
        let gone = self.byConnection.keys.filter { $0.node == node }.sorted { $0.connection < $1.connection }
        return gone.flatMap { self.removeConnection($0) }
    }

    private mutating func remove(_ connection: ConnectionKey, of clientID: String, from channel: String) -> Change? {
        // In place: a copy of a large channel's members per removal would make a node's
        // departure quadratic.
        guard self.channels[channel]?[clientID]?.removeValue(forKey: connection) != nil else { return nil }
        guard self.channels[channel]![clientID]!.isEmpty else { return nil }
        self.channels[channel]![clientID] = nil
        if self.channels[channel]!.isEmpty { self.channels[channel] = nil }
        return .left(clientID)
    }

    /// The members of `channel`, by client id.
    package func members(of channel: String) -> [Member] {
        (self.channels[channel] ?? [:]).map { Member(clientID: $0.key, connections: $0.value) }.sorted { $0.clientID < $1.clientID }
    }

    /// How many clients, and connections, are in `channel`.
    package func count(of channel: String) -> (clients: Int, connections: Int) {
        let members = self.channels[channel] ?? [:]
        return (members.count, members.values.reduce(0) { $0 + $1.count })
    }

    /// Whether `channel` has any member.
    package func isOccupied(_ channel: String) -> Bool { self.channels[channel] != nil }
}
