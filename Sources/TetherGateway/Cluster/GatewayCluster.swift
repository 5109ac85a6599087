public import NIOCore
public import TetherCore

/// What a gateway shares with the other gateways (nodes) of a cluster: pushes that reach every
/// node's connections, which node holds which client's connections, and the lanes of reliable
/// delivery, so that each outbox's messages are processed by one node at a time.
///
/// The nodes share one ``MessageStore`` too, which keeps the record: processed messages,
/// deliveries, claims. `PostgresCluster` (TetherPostgres) implements this protocol on
/// PostgreSQL; a single gateway has no cluster.
///
/// ```swift
/// let cluster = PostgresCluster(store: store, configuration: .init(url: url, name: "node-a"))
/// let gateway = try Gateway(configuration: configuration, messageStore: store, cluster: cluster)
/// ```
public protocol GatewayCluster: Sendable {
    /// Takes part in the cluster until cancelled: registers the node, hears the other nodes,
    /// and calls `node` to reach this gateway's connections. ``Gateway/run()`` runs it, and
    /// cancels it once the gateway has stopped.
    func run(_ node: ClusterNode) async throws

    /// A push made on this node (to a client, a room or everyone): the other nodes push it to
    /// their connections. Called on the pusher's thread: queue it, do not wait.
    func publish(_ push: ClusterPush)

    /// A connection of `client` that takes reliable deliveries is established on this node
    /// (each is matched by one ``clientLeft(_:)``).
    func clientArrived(_ client: String)

    /// A connection of `client` that took reliable deliveries ended.
    func clientLeft(_ client: String)

    /// Claims the lane of `outbox` for this node, waiting while another live node holds it
    /// (asking it to let go).
    /// - Returns: The claim, which the lane's writes carry as their ``StoreWrite/fence``.
    /// - Throws: If the lane could not be claimed in time, or the store is unreachable.
    func claimLane(_ outbox: OutboxID) async throws -> LaneFence

    /// This node no longer uses the lane it claimed with `fence`.
    func releaseLane(_ fence: LaneFence)

    /// Where this node's clients should go when it shuts down: another live node's endpoint
    /// (a URL such as `tether://10.0.0.6:7700`), named in the GOAWAY unless the gateway's
    /// configuration names one (``GatewayConfiguration/GoAway-swift.struct/alternateEndpoint``).
    var alternateEndpoint: String? { get }

    /// Hands an HTTP-stream POST for a session another node holds to that node, and returns
    /// its answer; `nil` when no live node has the key the session's token names (the client
    /// then gets `404`). A node that does not answer is a `502 Bad Gateway` answer.
    ///
    /// Any node may receive any POST (no sticky sessions): the gateway calls this for a
    /// session token it does not hold whose node key (``ClusterStreamPost/nodeKey``) is not
    /// its own. The answer comes once the holding node's connection read the body, so the
    /// client is paced as if it had posted to that node.
    func forwardStreamPost(_ post: ClusterStreamPost) async -> ClusterStreamAnswer?

    /// Whether the cluster sends every channel publication its store appended, this node's
    /// too, to this node's subscribers (``ClusterNode/channelPublications(_:)``): then a
    /// node does not send its own at once, so that every node sends a channel's publications
    /// in one order, the store's.
    var sendsChannelPublications: Bool { get }

    /// Whether the cluster shares the members of channels that keep presence between nodes
    /// (``channelMembersChanged(_:)``, ``ClusterNode/channelMembers(_:on:)``): then a channel's
    /// presence, its queries and its events are the cluster's, not each node's.
    var sharesChannelPresence: Bool { get }

    /// A client's connections subscribed to a channel that keeps presence changed on this
    /// node (`connections` 0: it has none left here): the other nodes learn it, in the order of
    /// the calls. Called under the gateway's channel lock: queue it, do not wait.
    func channelMembersChanged(_ member: ClusterChannelMember)

    /// The application ordered something about a client id's connections (disconnect them,
    /// change or end their credentials): the other nodes carry it out on theirs
    /// (``ClusterNode/apply(_:)``). Queue it, do not wait. By default, nothing: each node's
    /// orders reach its own connections only.
    func command(_ command: ClientCommand)

    /// Asks the other live nodes a question about their connections (a client id's, a room's
    /// members): their answers, and the nodes that did not answer in time. By default, none:
    /// each node answers for its own connections only.
    /// - Throws: When the question cannot be asked (the cluster's database is unreachable).
    func ask(_ question: ClusterQuestion) async throws -> ClusterAnswers

    /// This node's name among the nodes (in ``ClusterAnswers``); `nil` by default.
    var nodeName: String? { get }
}

extension GatewayCluster {
    public var alternateEndpoint: String? { nil }

    public func forwardStreamPost(_ post: ClusterStreamPost) async -> ClusterStreamAnswer? { nil }

    /// Not by default: each node sends its own channel publications to its subscribers.
    public var sendsChannelPublications: Bool { false }

    /// Not by default: each node's presence is its own.
    public var sharesChannelPresence: Bool { false }

    public func channelMembersChanged(_ member: ClusterChannelMember) {}

    public func command(_ command: ClientCommand) {}

    public func ask(_ question: ClusterQuestion) async throws -> ClusterAnswers { ClusterAnswers() }

    public var nodeName: String? { nil }
}

/// A question a node asks the others about their connections (the server API's queries).
public enum ClusterQuestion: Sendable, Hashable {
    /// A client id's established connections.
    case connections(client: String)
    /// The connections joined to a room.
    case members(room: String)
}

/// What the other nodes answered to a ``ClusterQuestion``.
public struct ClusterAnswers: Sendable, Equatable {
    /// Each node's connections that answer the question, by the node's name.
    public var connections: [NodeConnection]
    /// The names of the live nodes that did not answer in time: without them, the answer may be
    /// incomplete.
    public var unanswered: [String]

    public init(connections: [NodeConnection] = [], unanswered: [String] = []) {
        self.connections = connections
        self.unanswered = unanswered
    }
}

/// A connection and the node that holds it (`nil`: a gateway without a cluster, or a cluster
/// that names no node).
public struct NodeConnection: Sendable, Equatable {
    public var node: String?
    public var connection: ConnectionInfo

    public init(node: String?, connection: ConnectionInfo) {
        self.node = node
        self.connection = connection
    }
}

/// What one node has of a client in a channel that keeps presence: its connections
/// subscribed there (0: none any more) and the info of the first.
public struct ClusterChannelMember: Sendable, Hashable {
    public var channel: String
    public var clientID: String
    public var connections: Int
    public var info: String

    public init(channel: String, clientID: String, connections: Int, info: String) {
        self.channel = channel
        self.clientID = clientID
        self.connections = connections
        self.info = info
    }
}

/// Sends HTTP-stream POSTs to the node that holds their session: what a cluster uses to
/// implement ``GatewayCluster/forwardStreamPost(_:)`` once it found that node's stream URL.
///
/// `TetherStreamForwarding`'s `HTTPStreamForwarder` is one, over a pool of kept-alive HTTP
/// connections (async-http-client):
///
/// ```swift
/// let forwarder = HTTPStreamForwarder()
/// clusterConfiguration.streamForwarder = forwarder
/// // … run the gateway …
/// try await forwarder.shutdown()
/// ```
public protocol ClusterStreamForwarder: Sendable {
    /// Posts `post` to `url` (the holding node's stream URL) and returns that node's answer: a
    /// `502` answer if it does not answer within `timeout`.
    func forward(_ post: ClusterStreamPost, to url: String, timeout: Duration) async -> ClusterStreamAnswer
}

/// An HTTP-stream POST that reached a node which does not hold its stream.
public struct ClusterStreamPost: Sendable {
    /// The session's token (`Tether-Session`).
    public var token: String
    /// Its proof that it comes from the stream's reader (`Tether-Proof`), checked by the node
    /// that holds the stream.
    public var proof: String
    /// The frames it carries.
    public var body: ByteBuffer
    /// The key of the node that made the token, which holds the stream (see ``ClusterNode/streamKey``).
    public var nodeKey: UInt64
    /// The key of the node that forwards it, sent along (`Tether-Forwarded`) so that the
    /// receiving node never forwards it again.
    public var forwardedBy: UInt64

    public init(token: String, proof: String, body: ByteBuffer, nodeKey: UInt64, forwardedBy: UInt64) {
        self.token = token
        self.proof = proof
        self.body = body
        self.nodeKey = nodeKey
        self.forwardedBy = forwardedBy
    }
}

/// What the node holding a stream answered to a forwarded POST: an HTTP status and its
/// one-line reason, passed back to the client.
public struct ClusterStreamAnswer: Sendable, Hashable {
    /// `204` when the stream's connection read the body; the statuses of PROTOCOL.md 11.5
    /// otherwise, or `502` when the node did not answer.
    public var status: Int
    public var message: String

    public init(status: Int, message: String) {
        self.status = status
        self.message = message
    }
}

/// A push shared between the nodes of a cluster.
public struct ClusterPush: Sendable, Hashable {
    public var topic: String
    public var body: ByteBuffer
    /// A client, a room or everyone (a connection is one node's own).
    public var target: PushTarget

    public init(topic: String, body: ByteBuffer, target: PushTarget) {
        self.topic = topic
        self.body = body
        self.target = target
    }
}

/// What a gateway offers its ``GatewayCluster``: reaching this node's own connections.
public struct ClusterNode: Sendable {
    let registry: ConnectionRegistry
    let pushes: Pusher
    let lanes: ReliableLanes?
    /// The key that opens this node's HTTP-stream tokens: the cluster tells it to the other
    /// nodes with ``streamURL``, so that they forward POSTs for this node's streams here.
    public let streamKey: UInt64
    /// Where the other nodes post to this node's HTTP streams (`http://10.0.0.5:7443/tether/stream`):
    /// its HTTP listener as bound, `nil` if it has no HTTP stream. A listener on every
    /// interface is named by the host's name.
    public let streamURL: String?

    /// Pushes what another node published to this node's connections (not published again).
    /// - Returns: The number of connections reached.
    @discardableResult
    public func push(_ push: ClusterPush) -> Int {
        (try? self.pushes.push(push.topic, push.body, to: push.target, publish: false)) ?? 0
    }

    /// Carries out on this node's connections what another node's application ordered about
    /// a client id (not sent to the cluster again).
    /// - Returns: The number of connections.
    @discardableResult
    public func apply(_ command: ClientCommand) -> Int {
        command.apply(to: self.registry)
    }

    /// Sends channel publications the store appended (by this node or another), in the
    /// order the store appended them, to this node's subscribers (for a cluster whose
    /// ``GatewayCluster/sendsChannelPublications`` is `true`).
    public func channelPublications(_ publications: [ChannelPublication]) {
        _ = self.pushes.sendStored(
            publications.map {
                Frame.Publication(channel: $0.channel, position: $0.position, publisher: $0.publisher, body: $0.body)
            }
        )
    }

    /// What another node has of the members of channels that keep presence (each a client's
    /// connections there, 0 when it has none left), in the order they changed there: this
    /// node's subscribers see who joins and leaves the channel on any node.
    /// - Parameter node: The other node's id in the cluster.
    public func channelMembers(_ members: [ClusterChannelMember], on node: UInt64) {
        self.pushes.channels?.remoteMembers(members, on: node)
    }

    /// This node's members of channels that keep presence, each a client's connections here:
    /// what a cluster writes again after it lost them (a database that restarted).
    public var channelMembersHere: [ClusterChannelMember] {
        self.pushes.channels?.localMembers() ?? []
    }

    /// A mark of what this node heard of the other nodes' channel members so far: read it
    /// before asking which nodes are alive, and pass it to ``channelMemberNodes(alive:heardBy:)``.
    public var channelMembersHeard: UInt64 { self.pushes.channels?.heardMark ?? 0 }

    /// The other nodes alive, as found after `mark` (``channelMembersHeard``) was read: what
    /// the others had of channels' members is gone (a node that died, or left), and their
    /// members leave. A node heard from after the mark is kept until the next call: it may
    /// have joined after the question was asked.
    public func channelMemberNodes(alive: Set<UInt64>, heardBy mark: UInt64) {
        self.pushes.channels?.remoteNodes(alive: alive, heardBy: mark)
    }

    /// Another node appended deliveries for `recipients`: their connections here read them.
    public func deliveriesAppended(for recipients: some Sequence<String>) {
        for recipient in recipients {
            for group in self.registry.recipients(for: .client(recipient)) {
                let handlers = group.handlers
                group.loop.execute {
                    for handler in handlers { handler.value.deliveriesAppendedElsewhere() }
                }
            }
        }
    }

    /// Another node wants the lane of `outbox`: its client connected there. This node's
    /// connections of that outbox are stale: they are closed, and the lane is released once
    /// their last batch ended.
    /// - Returns: Whether the lane is in use here (then it is released when it is no longer).
    public func laneWanted(_ outbox: OutboxID) -> Bool {
        guard let lanes = self.lanes, lanes.isInUse(outbox) else { return false }
        for group in self.registry.recipients(for: .client(outbox.client)) {
            let handlers = group.handlers
            group.loop.execute {
                for handler in handlers where handler.value.lane?.outbox == outbox { handler.value.closeNow() }
            }
        }
        return true
    }

    /// This node's connections that answer `question` (another node asked it).
    public func answer(_ question: ClusterQuestion) -> [ConnectionInfo] {
        switch question {
        case .connections(let client): self.registry.established(ofClient: client)
        case .members(let room): self.registry.members(of: room)
        }
    }

    /// The client ids with a reliable connection on this node.
    public var clients: [String] {
        Array(Set(self.lanes?.inUse.map(\.client) ?? []))
    }
}
