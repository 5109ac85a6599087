import NIOCore
import TetherCore
import TetherNIO

/// The index of the gateway's live connections: by id, by client id and by room, so that a push
/// finds its recipients and a shutdown finds every connection.
///
/// It holds no connection's state: each connection's is its handler's machine. An entry is the
/// connection's handler (bound to its event loop) and, once the handshake completed, the
/// identity it proved (what ``Gateway/connections`` and rooms' members report).
final class ConnectionRegistry: Sendable {
    struct Entry: Sendable {
        /// The connection's handler, which pushes and drains go to.
        var handler: NIOLoopBound<GatewayConnectionHandler>
        /// Set once the handshake completed: only established connections get pushes.
        var info: ConnectionInfo?
    }

    /// The recipients of a push that share an event loop.
    ///
    /// A class: a room's recipients are cached until its membership changes, so two pushes
    /// with the identical object went to the same connections (see ``PushBatcher``).
    final class LoopRecipients: Sendable {
        let loop: any EventLoop
        let handlers: [NIOLoopBound<GatewayConnectionHandler>]

        init(loop: any EventLoop, handlers: [NIOLoopBound<GatewayConnectionHandler>]) {
            self.loop = loop
            self.handlers = handlers
        }

        /// `handlers` grouped by their event loop: a push's one hop per loop (rooms, clients,
        /// channels' subscribers).
        static func grouping(_ handlers: some Sequence<NIOLoopBound<GatewayConnectionHandler>>) -> [LoopRecipients] {
            var groups: [ObjectIdentifier: (loop: any EventLoop, handlers: [NIOLoopBound<GatewayConnectionHandler>])] = [:]
            for handler in handlers {
                let loop = handler.eventLoop
                groups[ObjectIdentifier(loop), default: (loop, [])].handlers.append(handler)
            }
            return groups.values.map { LoopRecipients(loop: $0.loop, handlers: $0.handlers) }
        }
    }

    private struct State {
        var connections: [UInt64: Entry] = [:]
        var byClient: [String: ClientConnections] = [:]
        var rooms: [String: Set<UInt64>] = [:]
        var roomsOf: [UInt64: Set<String>] = [:]
        /// Each room's recipients grouped by event loop, built at its first push after a change
        /// of membership: a room is pushed to far more often than its members change.
        var roomRecipients: [String: [LoopRecipients]] = [:]
        /// The same for a client's connections, built at its first push after one of them was
        /// established or closed (about 150 bytes per client pushed to).
        var clientRecipients: [String: [LoopRecipients]] = [:]
        var draining: Frame.GoAway?
    }

    /// A client's connections: most clients have one, which takes no set of its own.
    private enum ClientConnections {
        case one(UInt64)
        case many(Set<UInt64>)

        var ids: [UInt64] {
            switch self {
            case .one(let id): [id]
            case .many(let ids): Array(ids)
            }
        }

        mutating func insert(_ id: UInt64) {
            switch self {
            case .one(let existing): self = existing == id ? self : .many([existing, id])
            case .many(var ids):
                self = .one(id)  // releases the set: it is mutated in place, not copied
                ids.insert(id)
                self = .many(ids)
            }
        }

        /// - Returns: Whether no connection is left.
        mutating func remove(_ id: UInt64) -> Bool {
            switch self {
            case .one(let existing):
                return existing == id
            case .many(var ids):
                self = .one(id)  // releases the set: it is mutated in place, not copied
                ids.remove(id)
                if ids.count == 1, let last = ids.first {
                    self = .one(last)
                } else {
                    self = .many(ids)
                }
                return ids.isEmpty
            }
        }
    }

    private let state = TetherLock(State())
    private let limits: (roomsPerConnection: Int, membersPerRoom: Int)

    init(roomsPerConnection: Int = .max, membersPerRoom: Int = .max) {
        self.limits = (roomsPerConnection, membersPerRoom)
    }

    /// Adds a connection that was just accepted.
    /// - Returns: The GOAWAY to drain it with at once if the gateway is shutting down.
    func add(_ id: UInt64, handler: NIOLoopBound<GatewayConnectionHandler>) -> Frame.GoAway? {
        self.state.withLockedValue { state in
            state.connections[id] = Entry(handler: handler, info: nil)
            return state.draining
        }
    }

    /// Records the identity a connection proved in its completed handshake: from now on it
    /// gets pushes.
    func established(_ info: ConnectionInfo) {
        self.state.withLockedValue { state in
            guard state.connections[info.id] != nil else { return }
            state.connections[info.id]!.info = info
            if state.byClient[info.clientID]?.insert(info.id) == nil { state.byClient[info.clientID] = .one(info.id) }
            state.clientRecipients[info.clientID] = nil
        }
    }

    /// Forgets a closed connection and its room memberships.
    /// - Returns: The connection's info, if it was established.
    @discardableResult
    func remove(_ id: UInt64) -> ConnectionInfo? {
        self.state.withLockedValue { state in
            guard let entry = state.connections.removeValue(forKey: id) else { return nil }
            if let info = entry.info {
                if state.byClient[info.clientID]?.remove(id) == true { state.byClient[info.clientID] = nil }
                state.clientRecipients[info.clientID] = nil
            }
            for room in state.roomsOf.removeValue(forKey: id) ?? [] {
                state.roomRecipients[room] = nil
                state.rooms[room]?.remove(id)
                if state.rooms[room]?.isEmpty == true { state.rooms[room] = nil }
            }
            return entry.info
        }
    }

    /// Puts a connection in a room. Returns `false` if the connection is gone.
    func join(_ room: String, connection id: UInt64) -> Bool {
        self.state.withLockedValue { state in
            guard state.connections[id]?.info != nil else { return false }
            if state.rooms[room]?.contains(id) == true { return true }
            guard (state.roomsOf[id]?.count ?? 0) < self.limits.roomsPerConnection,
                (state.rooms[room]?.count ?? 0) < self.limits.membersPerRoom
            else { return false }
            if state.rooms[room, default: []].insert(id).inserted { state.roomRecipients[room] = nil }
            state.roomsOf[id, default: []].insert(room)
            return true
        }
    }

    /// Takes a connection out of a room.
    func leave(_ room: String, connection id: UInt64) {
        self.state.withLockedValue { state in
            if state.rooms[room]?.remove(id) != nil { state.roomRecipients[room] = nil }
            if state.rooms[room]?.isEmpty == true { state.rooms[room] = nil }
            state.roomsOf[id]?.remove(room)
        }
    }

    /// The members of a room.
    func members(of room: String) -> [ConnectionInfo] {
        self.state.withLockedValue { state in
            (state.rooms[room] ?? []).compactMap { state.connections[$0]?.info }
        }
    }

    /// The handlers of the established connections a push to `target` reaches, grouped by
    /// event loop.
    func recipients(for target: PushTarget) -> [LoopRecipients] {
        self.state.withLockedValue { state in
            let connections = state.connections
            switch target {
            case .connection(let id):
                guard let entry = connections[id], entry.info != nil else { return [] }
                return [LoopRecipients(loop: entry.handler.eventLoop, handlers: [entry.handler])]
            case .client(let clientID):
                if let cached = state.clientRecipients[clientID] { return cached }
                guard let ids = state.byClient[clientID]?.ids else { return [] }
                let recipients = Self.group(ids.lazy.compactMap { connections[$0] })
                state.clientRecipients[clientID] = recipients
                return recipients
            case .room(let room):
                if let cached = state.roomRecipients[room] { return cached }
                guard let members = state.rooms[room] else { return [] }
                let recipients = Self.group(members.lazy.compactMap { connections[$0] })
                state.roomRecipients[room] = recipients
                return recipients
            case .all:
                return Self.group(connections.values)
            }
        }
    }

    /// The established connections among `entries`, grouped by event loop.
    private static func group(_ entries: some Sequence<Entry>) -> [LoopRecipients] {
        LoopRecipients.grouping(entries.lazy.filter { $0.info != nil }.map(\.handler))
    }

    /// Hands deliveries just committed to the connections of their recipients, whose pumps send
    /// them without reading the store when they follow what was sent. One hop per loop.
    func offer(_ stored: [String: [StoredDelivery]]) {
        for (recipient, deliveries) in stored {
            for group in self.recipients(for: .client(recipient)) {
                let handlers = group.handlers
                group.loop.execute {
                    for handler in handlers { handler.value.deliveriesOffered(deliveries) }
                }
            }
        }
    }

    /// Replaces a connection's identity after its client refreshed its credentials.
    func replaceIdentity(of id: UInt64, with identity: ClientIdentity) {
        self.state.withLockedValue { state in state.connections[id]?.info?.identity = identity }
    }

    /// An established connection.
    func info(of id: UInt64) -> ConnectionInfo? {
        self.state.withLockedValue { state in state.connections[id]?.info }
    }

    /// The handler of connection `id`, if it is open.
    func handler(of id: UInt64) -> NIOLoopBound<GatewayConnectionHandler>? {
        self.state.withLockedValue { $0.connections[id]?.handler }
    }

    /// The established connections of a client id.
    func established(ofClient clientID: String) -> [ConnectionInfo] {
        self.state.withLockedValue { state in
            guard let ids = state.byClient[clientID]?.ids else { return [] }
            return ids.compactMap { state.connections[$0]?.info }
        }
    }

    /// Information about established connections.
    var established: [ConnectionInfo] {
        self.state.withLockedValue { state in state.connections.values.compactMap(\.info) }
    }

    /// Every connection's handler, established or not.
    var handlers: [NIOLoopBound<GatewayConnectionHandler>] {
        self.state.withLockedValue { state in state.connections.values.map(\.handler) }
    }

    /// Marks the registry as draining and returns every connection's handler, established or not.
    func beginDraining(with goAway: Frame.GoAway) -> [NIOLoopBound<GatewayConnectionHandler>] {
        self.state.withLockedValue { state in
            state.draining = goAway
            return state.connections.values.map(\.handler)
        }
    }
}
