import NIOConcurrencyHelpers
import NIOCore
import TetherCore

/// The gateway's live connections, indexed by id, client id and room.
final class ConnectionRegistry: Sendable {
    struct Entry: Sendable {
        var info: ConnectionInfo
        var channel: any Channel
        /// The connection's protocol handler, which pushes go to.
        var handler: NIOLoopBound<GatewayConnectionHandler>
        /// Whether the handshake completed (pushes go only to established connections).
        var established: Bool
    }

    private struct State {
        var connections: [UInt64: Entry] = [:]
        var byClient: [String: Set<UInt64>] = [:]
        var rooms: [String: Set<UInt64>] = [:]
        var roomsOf: [UInt64: Set<String>] = [:]
        var draining: Frame.GoAway?
    }

    private let state = NIOLockedValueBox(State())

    /// Adds a connection that was just accepted.
    /// - Returns: The GOAWAY to drain it with at once if the gateway is shutting down.
    func add(
        _ id: UInt64,
        channel: any Channel,
        handler: NIOLoopBound<GatewayConnectionHandler>,
        remoteAddress: String?
    ) -> Frame.GoAway? {
        self.state.withLockedValue { state in
            state.connections[id] = Entry(
                info: ConnectionInfo(id: id, clientID: "", userAgent: nil, remoteAddress: remoteAddress),
                channel: channel,
                handler: handler,
                established: false
            )
            return state.draining
        }
    }

    /// Records the identity a connection presented in its completed handshake.
    func established(_ id: UInt64, clientID: String, userAgent: String?) -> ConnectionInfo? {
        self.state.withLockedValue { state in
            guard var entry = state.connections[id] else { return nil }
            entry.info.clientID = clientID
            entry.info.userAgent = userAgent
            entry.established = true
            state.connections[id] = entry
            state.byClient[clientID, default: []].insert(id)
            return entry.info
        }
    }

    /// Forgets a closed connection and its room memberships.
    func remove(_ id: UInt64) {
        self.state.withLockedValue { state in
            guard let entry = state.connections.removeValue(forKey: id) else { return }
            if entry.established {
                state.byClient[entry.info.clientID]?.remove(id)
                if state.byClient[entry.info.clientID]?.isEmpty == true { state.byClient[entry.info.clientID] = nil }
            }
            for room in state.roomsOf.removeValue(forKey: id) ?? [] {
                state.rooms[room]?.remove(id)
                if state.rooms[room]?.isEmpty == true { state.rooms[room] = nil }
            }
        }
    }

    /// Puts a connection in a room. Returns `false` if the connection is gone.
    func join(_ room: String, connection id: UInt64) -> Bool {
        self.state.withLockedValue { state in
            guard state.connections[id]?.established == true else { return false }
            state.rooms[room, default: []].insert(id)
            state.roomsOf[id, default: []].insert(room)
            return true
        }
    }

    /// Takes a connection out of a room.
    func leave(_ room: String, connection id: UInt64) {
        self.state.withLockedValue { state in
            state.rooms[room]?.remove(id)
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

    /// The protocol handlers of the established connections a push to `target` reaches.
    func recipients(for target: PushTarget) -> [NIOLoopBound<GatewayConnectionHandler>] {
        self.state.withLockedValue { state in
            let ids: [UInt64]
            switch target {
            case .connection(let id): ids = [id]
            case .client(let clientID): ids = Array(state.byClient[clientID] ?? [])
            case .room(let room): ids = Array(state.rooms[room] ?? [])
            case .all: ids = Array(state.connections.keys)
            }
            return ids.compactMap { id in
                guard let entry = state.connections[id], entry.established else { return nil }
                return entry.handler
            }
        }
    }

    /// Information about established connections.
    var established: [ConnectionInfo] {
        self.state.withLockedValue { state in state.connections.values.filter(\.established).map(\.info) }
    }

    /// Marks the registry as draining and returns every channel, established or not.
    func beginDraining(with goAway: Frame.GoAway) -> [any Channel] {
        self.state.withLockedValue { state in
            state.draining = goAway
            return state.connections.values.map(\.channel)
        }
    }
}
