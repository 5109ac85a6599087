import Foundation
public import Logging
import NIOCore
import NIOPosix
public import PostgresNIO
import TetherCore
public import TetherGateway
import TetherNIO

/// Several gateways (nodes) sharing one PostgreSQL database: pushes reach every node's
/// connections, reliable deliveries reach a recipient on whichever node it is connected to,
/// and each outbox's messages are processed by one node at a time, across a node's death.
///
/// Tables are the record; notifications only wake nodes (see the design in
/// `TetherPostgres.docc`):
/// - **Nodes** register in `tether_nodes` and write `seen_at` every
///   ``Configuration-swift.struct/heartbeatInterval``. Each also holds an advisory lock on
///   its listening connection, which PostgreSQL releases the moment the node's process dies.
///   A node is alive while it holds its lock and was seen within
///   ``Configuration-swift.struct/nodeTimeout``.
/// - **Lanes**: before processing an outbox's messages a node claims its lane in
///   `tether_lanes`, taking it over from a node that is not alive; each claim increments the
///   lane's fence, which every commit of the lane carries (``StoreWrite/fence``): a node whose
///   claim was taken over cannot commit. A node that wants a lane a live node holds signals it;
///   that node closes its stale connections of the outbox and lets the lane go.
/// - **Presence**: `tether_presence` says which nodes hold a client's reliable connections; a
///   commit that appends deliveries signals those nodes (`tether_signals`) and notifies each
///   once, in the same transaction. A node that writes a presence then waits on the
///   recipient's stream row and reads its deliveries again: a commit that ran meanwhile either
///   saw the presence (it reads it once it holds that row) or is committed before the read.
/// - **Pushes** to clients, rooms and everyone go into `tether_pushes` in batches (one
///   transaction and one notification per batch); every node reads what follows its cursor.
/// - **Channel presence**: each node's members of channels that keep presence (a client's
///   connections subscribed there) are rows of `tether_channel_members`, and each change is
///   a row of `tether_pushes` too, written in the same transaction: a node reads the rows when
///   it joins and the changes after its cursor, and forgets the members of a node that is no
///   longer alive at its next heartbeat.
/// - **Questions** about the nodes' connections (a client's, a room's members): a row of
///   `tether_pushes`; each node answers with a row of `tether_answers` (``ask(_:)``).
/// - **HTTP streams**: a node's session tokens start with its stream key, which it registers
///   in `tether_nodes` with the URL of its HTTP listener; a POST for a session another node
///   holds is forwarded there over HTTP (async-http-client), and that node's answer is the
///   client's. A load balancer in front of the nodes needs no affinity.
///
/// ```swift
/// let store = try await PostgresMessageStore(client: postgres)
/// let cluster = try PostgresCluster(store: store, configuration: .init(url: url, name: "node-a"))
/// let gateway = try Gateway(configuration: configuration, messageStore: store, cluster: cluster)
/// ```
public final class PostgresCluster: GatewayCluster {
    /// How a node takes part in the cluster.
    public struct Configuration: Sendable {
        /// The node's name, in logs and in `tether_nodes` (the host name and process id by default).
        public var name: String
        /// Where the node's LISTEN connection goes: the database itself, not a pooler in
        /// transaction mode (PgBouncer drops LISTEN and session locks).
        public var listen: PostgresConnection.Configuration
        /// How often the node says it is alive.
        public var heartbeatInterval: Duration = .seconds(1)
        /// A node not seen for this long is dead, even if its lock seems held (its machine
        /// vanished and PostgreSQL has not noticed yet): its lanes are taken over, its presence
        /// ignored.
        public var nodeTimeout: Duration = .seconds(10)
        /// How long a batch waits for its lane while another live node holds it.
        public var claimTimeout: Duration = .seconds(20)
        /// How often the node reads its signals and the pushes without being notified: what
        /// bounds a delay if a notification is lost.
        public var pollInterval: Duration = .seconds(1)
        /// How long pushes stay in `tether_pushes` for nodes that fall behind.
        public var pushRetention: Duration = .seconds(60)
        /// How long a node waits for the other live nodes' answers to a question about their
        /// connections (``PostgresCluster/ask(_:)``); those that have not answered by then are
        /// named as such.
        public var queryTimeout: Duration = .seconds(2)
        /// Where clients reach this node (`tether://10.0.0.5:7700`, `wss://…`): when another
        /// node shuts down, its GOAWAY may send its clients here. `nil`: never named.
        public var address: String?
        /// Where the other nodes post to this node's HTTP streams
        /// (`http://10.0.0.5:7443/tether/stream`); `nil`: the gateway's HTTP listener as bound
        /// (``ClusterNode/streamURL``), named by the host's name if it listens on every interface.
        public var streamURL: String?
        /// How long a node waits for the node holding a stream to answer a POST it forwarded
        /// (that node holds its answer while it paces the client).
        public var streamForwardTimeout: Duration = .seconds(60)
        /// What sends an HTTP-stream POST to the node that holds its session (its owner shuts it
        /// down); `nil`: this node answers such POSTs `502`, and HTTP-stream clients behind a
        /// load balancer without affinity fail over and over. `tether serve --postgres` uses
        /// `TetherStreamForwarding`'s `HTTPStreamForwarder`.
        public var streamForwarder: (any ClusterStreamForwarder)?

        /// - Parameters:
        ///   - url: The database, `postgres://user[:password]@host[:port]/database`.
        ///   - name: The node's name.
        /// - Throws: ``MessageStoreError`` for a URL that is not PostgreSQL's.
        public init(url: String, name: String? = nil) throws(MessageStoreError) {
            self.listen = try PostgresURL(url).connectionConfiguration
            self.name = name ?? "\(ProcessInfo.processInfo.hostName)-\(ProcessInfo.processInfo.processIdentifier)"
        }

        func validate() throws(MessageStoreError) {
            guard self.heartbeatInterval > .zero, self.nodeTimeout >= self.heartbeatInterval * 2 else {
                throw MessageStoreError(
                    code: .invalidArgument,
                    message:
                        "the node timeout (\(self.nodeTimeout)) must be at least twice the heartbeat interval (\(self.heartbeatInterval))"
                )
            }
            if let streamURL, URL(string: streamURL)?.host == nil || !(streamURL.hasPrefix("http://") || streamURL.hasPrefix("https://")) {
                throw MessageStoreError(
                    code: .invalidArgument,
                    message: "the stream URL '\(streamURL)' is not an http:// or https:// URL with a host"
                )
            }
            guard self.claimTimeout > .zero, self.pollInterval > .zero, self.pushRetention > .zero, self.streamForwardTimeout > .zero,
                self.queryTimeout > .zero
            else {
                throw MessageStoreError(code: .invalidArgument, message: "the cluster's timeouts and intervals must be positive")
            }
        }
    }

    public let configuration: Configuration
    let store: PostgresMessageStore
    var client: PostgresClient { self.store.client }
    let logger: Logger
    let state = TetherLock(State())
    /// Wakes the loop that writes presence, releases and pushes.
    let writes = Doorbell()
    /// Wakes the loop that reads this node's signals.
    let signals = Doorbell()
    /// Wakes the loop that reads the pushes.
    let pushes = Doorbell()
    /// Rung by a notification on `tether_channels`: a node appended channel publications.
    let channels = Doorbell()

    struct State {
        var node: Int64?
        /// Reliable connections per client on this node.
        var connections: [String: Int] = [:]
        /// Presence to write: `true` arrived, `false` left.
        var presence: [String: Bool] = [:]
        /// Write every client's presence again (after reconnecting to PostgreSQL).
        var resyncPresence = false
        var releases: [LaneFence] = []
        /// Lanes another node wants that no connection here uses.
        var unusedLanes: [OutboxID] = []
        /// Pushes and client commands to write, in order, as rows of `tether_pushes`.
        var pushes: [StoredPush] = []
        /// Changes of this node's channel members to write, in order.
        var channelMembers: [ClusterChannelMember] = []
        /// Write every channel member of this node again (after reconnecting to PostgreSQL).
        var resyncChannelMembers = false
        var running = false
        /// The addresses of the other live nodes, as of the last heartbeat.
        var others: [String] = []
        /// The other live nodes' names by id, as of the last heartbeat.
        var alive: [Int64: String] = [:]
        /// The stream URLs of the other live nodes by stream key, as of the last heartbeat.
        var streamURLs: [UInt64: String] = [:]
    }

    /// - Parameters:
    ///   - store: The nodes' shared store (its client runs the cluster's queries too).
    ///   - configuration: The node's name, its LISTEN connection, its timings.
    ///   - logger: Where the node logs.
    /// - Throws: ``MessageStoreError`` with ``MessageStoreError/Code/invalidArgument`` for a
    ///   configuration that does not hold together.
    public init(
        store: PostgresMessageStore,
        configuration: Configuration,
        logger: Logger = Logger(label: "tether.cluster")
    ) throws(MessageStoreError) {
        try configuration.validate()
        self.store = store
        self.configuration = configuration
        var logger = logger
        logger[metadataKey: "tether.node"] = "\(configuration.name)"
        self.logger = logger
    }

    /// Another live node's address, for the GOAWAY of this node's shutdown.
    public var alternateEndpoint: String? { self.state.withLockedValue { $0.others.randomElement() } }

    /// The node's id in `tether_nodes`, once it registered.
    public var nodeID: Int64? { self.state.withLockedValue { $0.node } }

    // MARK: GatewayCluster

    /// Every node sends the channel publications the database holds (``channelLoop(_:after:)``).
    public var sendsChannelPublications: Bool { true }

    /// Every node shares its channels' members (``channelMembersChanged(_:)``).
    public var sharesChannelPresence: Bool { true }

    public func channelMembersChanged(_ member: ClusterChannelMember) {
        self.state.withLockedValue { $0.channelMembers.append(member) }
        self.writes.ring()
    }

    public func publish(_ push: ClusterPush) {
        let (kind, target) = StoredPushTarget.encode(push.target)
        self.state.withLockedValue { $0.pushes.append(StoredPush(kind: kind, target: target, topic: push.topic, body: push.body)) }
        self.writes.ring()
    }

    /// Written with the pushes, in the same order: every node reads it with them
    /// (``pushLoop(_:_:after:)``) and carries it out on its connections.
    public func command(_ command: ClientCommand) {
        self.state.withLockedValue { $0.pushes.append(StoredClientCommand.row(command)) }
        self.writes.ring()
    }

    public var nodeName: String? { self.configuration.name }

    /// Writes the question as a row of `tether_pushes`; every other node answers with a row of
    /// `tether_answers` (``pushLoop(_:_:after:)``), which this node reads until every node
    /// alive at the last heartbeat answered, or ``Configuration-swift.struct/queryTimeout``
    /// passed.
    public func ask(_ question: ClusterQuestion) async throws -> ClusterAnswers {
        guard let id = self.nodeID else {
            throw MessageStoreError(code: .storage, message: "the node has not joined its cluster yet")
        }
        let expected = self.state.withLockedValue { $0.alive }
        guard !expected.isEmpty else { return ClusterAnswers() }
        let query = Int64.random(in: 1...Int64.max)
        try await self.insert([StoredQuestion.row(question, id: query)], from: id)
        var answered: [Int64: [ConnectionInfo]] = [:]
        let start = ContinuousClock.now
        var pause = Duration.milliseconds(5)
        do {
            while true {
                for (node, body) in try await self.query("SELECT node, body FROM tether_answers WHERE query = \(query)").map({
                    try $0.decode((Int64, ByteBuffer).self)
                }) {
                    answered[node] = StoredQuestion.connections(in: body)
                }
                if expected.keys.allSatisfy({ answered[$0] != nil }) || ContinuousClock.now - start >= self.configuration.queryTimeout {
                    break
                }
                try await Task.sleep(for: pause)
                pause = min(pause * 2, .milliseconds(50))
            }
        } catch {
            _ = try? await self.query("DELETE FROM tether_answers WHERE query = \(query)")
            throw error
        }
        _ = try? await self.query("DELETE FROM tether_answers WHERE query = \(query)")
        let names = answered.keys.map { ($0, expected[$0] ?? "node \($0)") }.sorted { $0.1 < $1.1 }
        return ClusterAnswers(
            connections: names.flatMap { node, name in
                (answered[node] ?? []).sorted { $0.id < $1.id }.map { NodeConnection(node: name, connection: $0) }
            },
            unanswered: expected.filter { answered[$0.key] == nil }.map(\.value).sorted()
        )
    }

    public func clientArrived(_ client: String) {
        let first = self.state.withLockedValue { state -> Bool in
            state.connections[client, default: 0] += 1
            guard state.connections[client] == 1 else { return false }
            state.presence[client] = true
            return true
        }
        if first { self.writes.ring() }
    }

    public func clientLeft(_ client: String) {
        let last = self.state.withLockedValue { state -> Bool in
            guard let count = state.connections[client] else { return false }
            guard count == 1 else {
                state.connections[client] = count - 1
                return false
            }
            state.connections[client] = nil
            state.presence[client] = false
            return true
        }
        if last { self.writes.ring() }
    }

    // MARK: Running

    public func run(_ node: ClusterNode) async throws {
        let alreadyRunning = self.state.withLockedValue { state -> Bool in
            defer { state.running = true }
            return state.running
        }
        guard !alreadyRunning else {
            throw MessageStoreError(code: .invalidArgument, message: "PostgresCluster.run() was already called")
        }
        // Where this node starts reading the pushes: read before it says it joined, so that a
        // push another node makes once this node is in the cluster is never skipped.
        // Until PostgreSQL answers: without a node id no lane can be claimed, and the reliable
        // path waits (its batches fail as storage errors, and clients send again).
        var joined: (cursor: Int64, channels: Int64, id: Int64)?
        var attempts = 0
        while joined == nil {
            do {
                var cursor: Int64 = 0
                for last in try await self.query("SELECT coalesce(max(id), 0) FROM tether_pushes").map({ try $0.decode(Int64.self) }) {
                    cursor = last
                }
                var channels: Int64 = 0
                for last in try await self.query("SELECT coalesce(max(id), 0) FROM tether_channel_publications").map({
                    try $0.decode(Int64.self)
                }) {
                    channels = last
                }
                joined = (cursor, channels, try await self.register(node))
            } catch {
                try Task.checkCancellation()
                if attempts == 0 {
                    self.logger.error(
                        "cannot join the cluster: PostgreSQL does not answer; trying again",
                        metadata: ["error": "\(PostgresMessageStore.describe(error))"]
                    )
                }
                attempts += 1
                try await Task.sleep(for: .seconds(1))
            }
        }
        let (pushesAfter, channelsAfter, id) = (joined!.cursor, joined!.channels, joined!.id)
        self.logger.info("joined the cluster", metadata: ["node-id": "\(id)"])
        await self.readChannelMembers(id, node)
        await withTaskGroup { group in
            group.addTask { await self.listen(id) }
            group.addTask { await self.heartbeat(id, node) }
            group.addTask { await self.writeLoop(id, node) }
            group.addTask { await self.signalLoop(id, node) }
            group.addTask { await self.pushLoop(id, node, after: pushesAfter) }
            group.addTask { await self.channelLoop(node, after: channelsAfter) }
            await group.waitForAll()
        }
        // In a task of its own: this one is cancelled (that is how the gateway stops the
        // cluster), and leaving must still reach PostgreSQL (bounded by the operation timeout).
        await Task { await self.leave(id, node) }.value
    }

    /// The other nodes' channel members, as the node joins: the changes after the push cursor
    /// it read before follow (applying one the rows showed already changes nothing).
    private func readChannelMembers(_ id: Int64, _ node: ClusterNode) async {
        do {
            var byNode: [Int64: [ClusterChannelMember]] = [:]
            for (member, channel, client, connections, info) in try await self.query(
                "SELECT node, channel, client, connections, info FROM tether_channel_members WHERE node <> \(id)"
            ).map({ try $0.decode((Int64, String, String, Int32, String).self) }) {
                byNode[member, default: []].append(
                    ClusterChannelMember(channel: channel, clientID: client, connections: Int(connections), info: info)
                )
            }
            for (member, members) in byNode { node.channelMembers(members, on: UInt64(bitPattern: member)) }
        } catch {
            self.logger.warning(
                "cannot read the other nodes' channel members; their changes from now on are seen",
                metadata: ["error": "\(PostgresMessageStore.describe(error))"]
            )
        }
    }

    private func register(_ node: ClusterNode) async throws -> Int64 {
        var id: Int64?
        let streamKey = Int64(bitPattern: node.streamKey)
        let streamURL = self.configuration.streamURL ?? node.streamURL
        for value in try await self.query(
            """
            INSERT INTO tether_nodes (name, address, stream_key, stream_url)
            VALUES (\(self.configuration.name), \(self.configuration.address), \(streamKey), \(streamURL)) RETURNING id
            """
        ).map({ try $0.decode(Int64.self) }) {
            id = value
        }
        guard let id else { throw MessageStoreError(code: .storage, message: "registering the node returned no id") }
        self.state.withLockedValue { $0.node = id }
        self.store.node.withLockedValue { $0 = id }
        return id
    }

    /// Leaves gracefully: the node's presence is removed and its lanes let go, so that other
    /// nodes need not wait for it to time out.
    private func leave(_ id: Int64, _ node: ClusterNode) async {
        do {
            // Bounded: a node that cannot reach PostgreSQL as it stops must still stop.
            let bound = self.configuration.heartbeatInterval * 3
            try await withTimeout(
                bound,
                failure: { MessageStoreError(code: .storage, message: "PostgreSQL did not answer within \(bound)") }
            ) {
                _ = try await self.query("UPDATE tether_nodes SET leaving = true WHERE id = \(id)")
                _ = try await self.query("DELETE FROM tether_presence WHERE node = \(id)")
                _ = try await self.query("DELETE FROM tether_channel_members WHERE node = \(id)")
                _ = try await self.query("UPDATE tether_lanes SET node = NULL WHERE node = \(id)")
                _ = try await self.query("DELETE FROM tether_nodes WHERE id = \(id)")
            }
            self.logger.info("left the cluster")
        } catch {
            self.logger.warning(
                "could not leave the cluster cleanly; the other nodes take over after the node timeout",
                metadata: ["error": "\(PostgresMessageStore.describe(error))"]
            )
        }
    }

    // MARK: Helpers

    /// Runs a query under the store's operation timeout (see
    /// ``PostgresMessageStore/withDeadline(_:)``) and collects its rows.
    @discardableResult
    func query(_ query: PostgresQuery) async throws -> [PostgresRow] {
        try await self.store.withDeadline { [client = self.client, logger = self.logger] in
            try await client.rows(query, logger: logger)
        }
    }

    static func key(of outbox: OutboxID) -> String { "\(outbox.client)\t\(outbox.epoch)" }

    static func outbox(from key: String) -> OutboxID? {
        guard let tab = key.lastIndex(of: "\t"), let epoch = UInt64(key[key.index(after: tab)...]) else { return nil }
        return OutboxID(client: String(key[..<tab]), epoch: epoch)
    }

    static func seconds(_ duration: Duration) -> Double {
        Double(duration.components.seconds) + Double(duration.components.attoseconds) / 1e18
    }
}
