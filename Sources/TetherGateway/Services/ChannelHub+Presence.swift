import NIOCore
import TetherCore

/// Presence: who is in each channel that keeps it, on this node and (in a cluster that shares
/// it) on the others, and the joined and left events of its subscribers.
///
/// A client is in a channel while it has a connection subscribed on any node. This node counts
/// its own connections (``Channel/clients``) and tells the cluster each change
/// (``GatewayCluster/channelMembersChanged(_:)``); what the other nodes have comes from the
/// cluster (``remoteMembers(_:on:)``, ``remoteNodes(alive:)``). A client that enters or leaves
/// the union makes an event, handed in the same step to the subscribers that asked for them.
extension ChannelHub {
    /// A client's connections subscribed on one node, and the info of the first.
    typealias MemberState = (connections: Int, info: String)

    /// A connection of `member` subscribed to channel `name`: counted, told to the cluster, and
    /// if the client was in the channel on no node, its joined event.
    func joined(_ member: Member, _ name: String, channel: inout Channel, remote: [String: [UInt64: MemberState]]?) {
        guard channel.clients != nil else { return }
        let present = channel.clients![member.clientID] != nil || remote?[member.clientID] != nil
        channel.clients![member.clientID, default: (0, member.info)].connections += 1
        let mine = channel.clients![member.clientID]!
        self.cluster?.channelMembersChanged(
            ClusterChannelMember(channel: name, clientID: member.clientID, connections: mine.connections, info: mine.info)
        )
        if !present {
            Self.announce(Frame.Presence(channel: name, kind: .joined, clientID: member.clientID, info: mine.info), in: channel)
        }
    }

    /// A connection of `clientID` left channel `name`: counted, told to the cluster, and if it
    /// was the client's last on every node, its left event.
    func left(_ clientID: String, _ name: String, channel: inout Channel, remote: [String: [UInt64: MemberState]]?) {
        guard let mine = channel.clients?[clientID] else { return }
        if mine.connections > 1 {
            channel.clients![clientID]!.connections -= 1
        } else {
            channel.clients![clientID] = nil
        }
        self.cluster?.channelMembersChanged(
            ClusterChannelMember(channel: name, clientID: clientID, connections: mine.connections - 1, info: mine.info)
        )
        if channel.clients![clientID] == nil, remote?[clientID] == nil {
            Self.announce(Frame.Presence(channel: name, kind: .left, clientID: clientID), in: channel)
        }
    }

    /// What another node has of channels' members, in the order it changed there.
    func remoteMembers(_ members: [ClusterChannelMember], on node: UInt64) {
        self.state.withLockedValue { state in
            state.heard += 1
            state.heardFrom[node] = state.heard
            for member in members where self.configuration.rule(for: member.channel)?.presence == true {
                let before = Self.isPresent(member.clientID, in: member.channel, state)
                if member.connections > 0 {
                    state.remoteMembers[member.channel, default: [:]][member.clientID, default: [:]][node] = (
                        member.connections, member.info
                    )
                } else {
                    Self.forget(member.clientID, of: member.channel, on: [node], &state)
                }
                let after = Self.isPresent(member.clientID, in: member.channel, state)
                guard before != after, let channel = state.channels[member.channel] else { continue }
                let kind: Frame.Presence.Kind = after ? .joined : .left
                Self.announce(
                    Frame.Presence(channel: member.channel, kind: kind, clientID: member.clientID, info: after ? member.info : ""),
                    in: channel
                )
            }
        }
    }

    /// What this node heard of the others' members so far: read before asking which nodes
    /// are alive (``remoteNodes(alive:heardBy:)``).
    var heardMark: UInt64 { self.state.withLockedValue { $0.heard } }

    /// The other nodes alive now, as asked after `mark` was read: the members of the others
    /// leave, but for a node heard from after the mark (it may have joined after the question).
    func remoteNodes(alive: Set<UInt64>, heardBy mark: UInt64) {
        self.state.withLockedValue { state in
            let dead = Set(state.heardFrom.filter { !alive.contains($0.key) && $0.value <= mark }.keys)
            guard !dead.isEmpty else { return }
            for node in dead { state.heardFrom[node] = nil }
            for (name, clients) in state.remoteMembers {
                for (clientID, nodes) in clients {
                    let gone = nodes.keys.filter { dead.contains($0) }
                    guard !gone.isEmpty else { continue }
                    Self.forget(clientID, of: name, on: gone, &state)
                    guard !Self.isPresent(clientID, in: name, state), let channel = state.channels[name] else { continue }
                    Self.announce(Frame.Presence(channel: name, kind: .left, clientID: clientID), in: channel)
                }
            }
        }
    }

    /// This node's members of the channels that keep presence.
    func localMembers() -> [ClusterChannelMember] {
        self.state.withLockedValue { state in
            state.channels.flatMap { name, channel in
                (channel.clients ?? [:]).map {
                    ClusterChannelMember(channel: name, clientID: $0.key, connections: $0.value.connections, info: $0.value.info)
                }
            }
        }
    }

    private static func isPresent(_ clientID: String, in channel: String, _ state: State) -> Bool {
        state.channels[channel]?.clients?[clientID] != nil || state.remoteMembers[channel]?[clientID] != nil
    }

    private static func forget(_ clientID: String, of channel: String, on nodes: some Sequence<UInt64>, _ state: inout State) {
        guard state.remoteMembers[channel]?[clientID] != nil else { return }
        for node in nodes { state.remoteMembers[channel]![clientID]!.removeValue(forKey: node) }
        if state.remoteMembers[channel]![clientID]!.isEmpty { state.remoteMembers[channel]![clientID] = nil }
        if state.remoteMembers[channel]!.isEmpty { state.remoteMembers[channel] = nil }
    }

    /// Hands a presence event to the subscribers of `channel` that asked for them: one
    /// `execute` per loop, made under the hub's lock so that each loop gets the channel's
    /// events in the order the hub made them.
    static func announce(_ event: Frame.Presence, in channel: Channel) {
        var byLoop: [ObjectIdentifier: (loop: any EventLoop, recipients: [(NIOLoopBound<GatewayConnectionHandler>, UInt64)])] = [:]
        for subscriber in channel.subscribers.values where subscriber.presenceEvents {
            let loop = subscriber.handler.eventLoop
            byLoop[ObjectIdentifier(loop), default: (loop, [])].recipients.append((subscriber.handler, subscriber.generation))
        }
        for (loop, recipients) in byLoop.values {
            loop.execute {
                for (handler, generation) in recipients { handler.value.presenceEvent(event, generation: generation) }
            }
        }
    }

    /// A page of `channel`'s members for a subscriber's presence events: each as a joined
    /// event, in bytewise order of client id after `after` (`nil`: from the first), at most
    /// `limit`, and whether it is the last page. `nil` if the subscription made at
    /// `generation` is gone or replaced.
    func presenceSnapshot(
        of channel: String,
        connection id: UInt64,
        generation: UInt64,
        after: String?,
        limit: Int
    ) -> (members: [Frame.Presence], done: Bool)? {
        let read = self.state.withLockedValue { state -> Members? in
            guard state.channels[channel]?.subscribers[id]?.generation == generation else { return nil }
            return Self.members(of: channel, in: state)
        }
        guard let read else { return nil }
        // Merged and sorted outside the lock, from the members as they were in the step that
        // read them.
        let members = Self.page(of: read.merged, after: after ?? "", limit: limit)
        return (
            members.map { Frame.Presence(channel: channel, kind: .joined, clientID: $0.clientID, info: $0.info) },
            members.count < limit
        )
    }

    /// Who is subscribed to `channel`: its members after client id `after` (bytewise; empty:
    /// from the first), at most `limit`, and how many there are in all; on every node of a
    /// cluster that shares presence, else on this one.
    func presence(of channel: String, after: String, limit: Int) -> ChannelPresencePage {
        // Merged and sorted outside the lock: a channel of many subscribers is asked rarely.
        let members = self.state.withLockedValue { Self.members(of: channel, in: $0) }.merged
        return ChannelPresencePage(channel: channel, total: members.count, members: Self.page(of: members, after: after, limit: limit))
    }

    /// A channel's members as read under the lock: this node's and the other nodes'.
    private struct Members {
        var local: [String: MemberState]
        var remote: [String: [UInt64: MemberState]]

        /// Each client's connections on every node, with the info of this node's first (or of
        /// the lowest node's).
        var merged: [String: MemberState] {
            guard !self.remote.isEmpty else { return self.local }
            var members = self.local
            for (clientID, nodes) in self.remote {
                let connections = nodes.values.reduce(0) { $0 + $1.connections }
                if let mine = members[clientID] {
                    members[clientID]!.connections = mine.connections + connections
                } else if let first = nodes.keys.min() {
                    members[clientID] = (connections, nodes[first]!.info)
                }
            }
            return members
        }
    }

    private static func members(of channel: String, in state: State) -> Members {
        Members(local: state.channels[channel]?.clients ?? [:], remote: state.remoteMembers[channel] ?? [:])
    }

    /// The members of `clients` after client id `after` (bytewise; empty: from the first), at most `limit`.
    private static func page(of clients: [String: MemberState], after: String, limit: Int) -> [ChannelPresenceMember] {
        let after = Array(after.utf8)
        return clients.keys
            .filter { after.isEmpty || after.lexicographicallyPrecedes($0.utf8) }
            .sorted { $0.utf8.lexicographicallyPrecedes($1.utf8) }
            .prefix(limit)
            .map { ChannelPresenceMember(clientID: $0, connections: clients[$0]!.connections, info: clients[$0]!.info) }
    }
}
