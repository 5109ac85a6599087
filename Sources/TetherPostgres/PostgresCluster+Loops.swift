import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import TetherCore
import TetherGateway
import TetherNIO

// What a node does while it is in the cluster: the loops `run()` starts, each until cancelled.
extension PostgresCluster {
    /// Keeps a connection that holds the node's liveness lock and hears its notifications;
    /// connects again when it drops.
    func listen(_ id: Int64) async {
        var failures = 0
        while !Task.isCancelled {
            do {
                let connection = try await PostgresConnection.connect(
                    on: MultiThreadedEventLoopGroup.singleton.any(),
                    configuration: self.configuration.listen,
                    id: Int(truncatingIfNeeded: id),
                    logger: self.logger
                )
                // Once cancelled (the node leaves), the connection is closed and this loop ends at
                // once: PostgresNIO does not always answer a query (the lock, LISTEN) on a
                // connection closed under it, so the session runs in a task of its own, left to
                // end on its own if it does not.
                let (failed, established) = (failures, TetherLock(false))
                let session: @Sendable () async throws -> Void = {
                    try await connection.rows(
                        "SELECT pg_advisory_lock(\(PostgresSchema.lockSpace), \(Int32(truncatingIfNeeded: id)))",
                        logger: self.logger
                    )
                    try await connection.listen(on: "tether_node_\(id)") { signals in
                        try await connection.listen(on: "tether_pushes") { pushes in
                            try await connection.listen(on: "tether_channels") { channels in
                                established.withLockedValue { $0 = true }
                                self.reachable(after: failed)
                                // Closing the connection ends every sequence, whichever way this
                                // ends (a dropped connection, or the node leaving).
                                try await withThrowingTaskGroup { group in
                                    group.addTask { for try await _ in signals { self.signals.ring() } }
                                    group.addTask { for try await _ in pushes { self.pushes.ring() } }
                                    group.addTask { for try await _ in channels { self.channels.ring() } }
                                    defer {
                                        group.cancelAll()
                                        connection.close().whenComplete { _ in }  // ends the others
                                    }
                                    try await group.next()
                                }
                            }
                        }
                    }
                }
                // Holds the connection until it is closed (PostgresNIO asserts that it is); the
                // session is over or abandoned by then, whichever way it ended.
                defer { Task { try? await connection.close() } }
                defer { if established.withLockedValue({ $0 }) { failures = 0 } }  // a later loss is logged again
                try await withTaskCancellationHandler {
                    try await abandonable(session)
                } onCancel: {
                    connection.close().whenComplete { _ in }
                }
                throw MessageStoreError(code: .storage, message: "the listening connection ended")
            } catch {
                if Task.isCancelled { return }
                if failures == 0 {
                    self.logger.error(
                        "lost PostgreSQL: pushes from other nodes and cross-node deliveries pause until it is back",
                        metadata: ["error": "\(PostgresMessageStore.describe(error))"]
                    )
                }
                failures += 1
                try? await Task.sleep(for: .milliseconds(min(100 * (1 << min(failures, 5)), 2000)))
            }
        }
    }

    /// The listening connection is up (again): what was missed while away is read.
    private func reachable(after failures: Int) {
        if failures > 0 { self.logger.notice("PostgreSQL is reachable again; the cluster resumes") }
        self.state.withLockedValue { state in
            state.resyncPresence = true
            state.resyncChannelMembers = true
        }
        self.writes.ring()
        self.signals.ring()
        self.pushes.ring()
    }

    /// Says the node is alive, and clears what dead nodes left behind.
    func heartbeat(_ id: Int64, _ node: ClusterNode) async {
        var beats = 0
        while !Task.isCancelled {
            do {
                _ = try await self.query("UPDATE tether_nodes SET seen_at = now() WHERE id = \(id)")
                var others: [String] = []
                var streamURLs: [UInt64: String] = [:]
                var alive: Set<UInt64> = []
                var names: [Int64: String] = [:]
                let heard = node.channelMembersHeard
                for (other, name, address, leaving, key, url) in try await self.query(
                    """
                    SELECT id, name, address, leaving, stream_key, stream_url FROM tether_nodes
                    WHERE id <> \(id) AND seen_at > now() - make_interval(secs => \(Self.seconds(self.configuration.nodeTimeout)))
                    """
                ).map({ try $0.decode((Int64, String, String?, Bool, Int64?, String?).self) }) {
                    alive.insert(UInt64(bitPattern: other))
                    names[other] = name
                    if let address, !leaving { others.append(address) }
                    // A leaving node still holds its streams until it has closed them.
                    if let key, let url { streamURLs[UInt64(bitPattern: key)] = url }
                }
                self.state.withLockedValue { state in
                    state.others = others
                    state.streamURLs = streamURLs
                    state.alive = names
                }
                // The members of a node that died (or left) leave its channels.
                node.channelMemberNodes(alive: alive, heardBy: heard)
                if beats % 10 == 0 { try await self.clearDeadNodes() }
            } catch {
                self.logger.warning("cannot write the node's heartbeat", metadata: ["error": "\(PostgresMessageStore.describe(error))"])
            }
            beats += 1
            try? await Task.sleep(for: self.configuration.heartbeatInterval)
        }
    }

    func clearDeadNodes() async throws {
        let timeout = Self.seconds(self.configuration.nodeTimeout)
        let dead = "SELECT id FROM tether_nodes WHERE seen_at < now() - make_interval(secs => $1)"
        var bindings = PostgresBindings()
        bindings.append(timeout)
        for table in ["tether_presence", "tether_signals", "tether_channel_members"] {
            _ = try await self.query(
                PostgresQuery(unsafeSQL: "DELETE FROM \(table) WHERE node IN (\(dead))", binds: bindings)
            )
        }
        _ = try await self.query(
            "DELETE FROM tether_pushes WHERE created_at < now() - make_interval(secs => \(Self.seconds(self.configuration.pushRetention)))"
        )
        _ = try await self.query("DELETE FROM tether_nodes WHERE seen_at < now() - interval '1 day'")
        // Answers whose asker stopped before it read them.
        _ = try await self.query("DELETE FROM tether_answers WHERE created_at < now() - interval '1 minute'")
    }

    /// Writes presence, lane releases and pushes, each kind in one statement per round.
    func writeLoop(_ id: Int64, _ node: ClusterNode) async {
        while !Task.isCancelled {
            await self.writes.wait(upTo: .seconds(5))
            await self.flushWrites(id, node)
        }
    }

    func flushWrites(_ id: Int64, _ node: ClusterNode) async {
        let (presence, resync, releases, unused, pushes) = self.state.withLockedValue { state in
            defer {
                state.presence = [:]
                state.resyncPresence = false
                state.releases = []
                state.unusedLanes = []
                state.pushes = []
            }
            return (state.presence, state.resyncPresence, state.releases, state.unusedLanes, state.pushes)
        }
        var (members, resyncMembers) = self.state.withLockedValue { state in
            defer {
                state.channelMembers = []
                state.resyncChannelMembers = false
            }
            return (state.channelMembers, state.resyncChannelMembers)
        }
        // Read after the changes were taken: it holds each of them, and what changes next is
        // written in the next round.
        if resyncMembers { members = node.channelMembersHere }
        do {
            var arrived = presence.filter(\.value).map(\.key)
            let left = presence.filter { !$0.value }.map(\.key)
            if resync {
                arrived = node.clients
                _ = try await self.query("DELETE FROM tether_presence WHERE node = \(id)")
            }
            if !left.isEmpty && !resync {
                _ = try await self.query(
                    "DELETE FROM tether_presence WHERE node = \(id) AND client = ANY(\(left))"
                )
            }
            if !arrived.isEmpty {
                _ = try await self.query(
                    """
                    INSERT INTO tether_presence (client, node) SELECT c, \(id) FROM unnest(\(arrived)) AS c
                    ON CONFLICT DO NOTHING
                    """
                )
                // A group commit on another node whose statement began before this presence
                // was committed may not have seen it, and signals nobody. Such a commit holds
                // the recipient's stream row from its upsert to its commit: touching the rows
                // (in the order group commits lock them, creating a missing one) waits for it.
                // A commit that reaches the row after this reads the presence afresh and
                // signals (GroupWriteStatement).
                _ = try await self.query(
                    """
                    INSERT INTO tether_streams AS s (recipient, next_sequence)
                    SELECT c, 1 FROM unnest(\(arrived)) AS c ORDER BY c
                    ON CONFLICT (recipient) DO UPDATE SET next_sequence = s.next_sequence
                    """
                )
                // Deliveries committed before the presence was visible woke nobody: read them.
                node.deliveriesAppended(for: arrived)
            }
            if !releases.isEmpty {
                _ = try await self.query(
                    """
                    UPDATE tether_lanes l SET node = NULL
                    FROM unnest(\(releases.map(\.outbox.client)), \(releases.map { Int64(bitPattern: $0.outbox.epoch) }),
                        \(releases.map { Int64(bitPattern: $0.token) })) AS r(client, epoch, fence)
                    WHERE l.client = r.client AND l.epoch = r.epoch AND l.fence = r.fence AND l.node = \(id)
                    """
                )
            }
            if !unused.isEmpty {
                _ = try await self.query(
                    """
                    UPDATE tether_lanes l SET node = NULL
                    FROM unnest(\(unused.map(\.client)), \(unused.map { Int64(bitPattern: $0.epoch) })) AS r(client, epoch)
                    WHERE l.client = r.client AND l.epoch = r.epoch AND l.node = \(id)
                    """
                )
            }
            if !pushes.isEmpty {
                try await self.insert(pushes, from: id)
                self.logger.debug("published pushes", metadata: ["pushes": "\(pushes.count)"])
            }
            if !members.isEmpty || resyncMembers {
                try await self.insert(members, from: id, replacing: resyncMembers)
            }
        } catch {
            self.logger.warning(
                "cannot write to PostgreSQL; trying again",
                metadata: ["error": "\(PostgresMessageStore.describe(error))", "pushes": "\(pushes.count)"]
            )
            // Kept for the next round (pushes too: they are at most once per node, not lost for a hiccup).
            self.state.withLockedValue { state in
                for (client, arrived) in presence where state.presence[client] == nil { state.presence[client] = arrived }
                state.resyncPresence = state.resyncPresence || resync
                state.releases = releases + state.releases
                state.unusedLanes = unused + state.unusedLanes
                state.pushes = pushes + state.pushes
                state.channelMembers = (resyncMembers ? [] : members) + state.channelMembers
                state.resyncChannelMembers = state.resyncChannelMembers || resyncMembers
            }
            try? await Task.sleep(for: .milliseconds(200))
            self.writes.ring()
        }
    }

    /// One batch of pushes (and client commands): one transaction, one notification. The
    /// advisory lock makes the batches of all nodes commit in the order of their ids, so a
    /// reader's cursor skips none.
    func insert(_ pushes: [StoredPush], from id: Int64) async throws {
        let (kinds, targets) = (pushes.map(\.kind), pushes.map(\.target))
        try await self.store.withDeadline { [client = self.client, logger = self.logger] in
            try await client.withTransaction(logger: logger) { connection in
                try await connection.rows(
                    "SELECT pg_advisory_xact_lock(\(PostgresSchema.otherLocks), \(PostgresSchema.pushLock))",
                    logger: self.logger
                )
                try await connection.rows(
                    """
                    INSERT INTO tether_pushes (origin, kind, target, topic, body)
                    SELECT \(id), kind, target, topic, body
                    FROM unnest(\(kinds), \(targets), \(pushes.map(\.topic)), \(pushes.map(\.body))) WITH ORDINALITY AS p(kind, target, topic, body, n)
                    ORDER BY n
                    """,
                    logger: self.logger
                )
                try await connection.rows("SELECT pg_notify('tether_pushes', '')", logger: self.logger)
            }
        }
    }

    /// Writes changes of this node's channel members (each client's last one in the round) to
    /// `tether_channel_members`, and each as a row of `tether_pushes` for the other nodes, in
    /// one transaction. `replacing`: the members are all of this node's (after reconnecting).
    func insert(_ changes: [ClusterChannelMember], from id: Int64, replacing: Bool) async throws {
        var last: [String: Int] = [:]  // by channel and client: the index of its last change
        for (index, change) in changes.enumerated() { last[change.channel + "\u{0}" + change.clientID] = index }
        let members = changes.enumerated().filter { last[$0.element.channel + "\u{0}" + $0.element.clientID] == $0.offset }.map(\.element)
        let (channels, clients) = (members.map(\.channel), members.map(\.clientID))
        let (connections, infos) = (members.map { Int32(clamping: $0.connections) }, members.map(\.info))
        let bodies = members.map(StoredChannelMember.body(of:))
        try await self.store.withDeadline { [client = self.client, logger = self.logger] in
            try await client.withTransaction(logger: logger) { connection in
                try await connection.rows(
                    "SELECT pg_advisory_xact_lock(\(PostgresSchema.otherLocks), \(PostgresSchema.pushLock))",
                    logger: self.logger
                )
                if replacing {
                    try await connection.rows("DELETE FROM tether_channel_members WHERE node = \(id)", logger: self.logger)
                } else {
                    try await connection.rows(
                        """
                        DELETE FROM tether_channel_members m USING unnest(\(channels), \(clients)) AS d(channel, client)
                        WHERE m.node = \(id) AND m.channel = d.channel AND m.client = d.client
                        """,
                        logger: self.logger
                    )
                }
                try await connection.rows(
                    """
                    INSERT INTO tether_channel_members (channel, client, node, connections, info)
                    SELECT channel, client, \(id), connections, info
                    FROM unnest(\(channels), \(clients), \(connections), \(infos)) AS r(channel, client, connections, info)
                    WHERE connections > 0
                    """,
                    logger: self.logger
                )
                try await connection.rows(
                    """
                    INSERT INTO tether_pushes (origin, kind, target, topic, body)
                    SELECT \(id), \(StoredChannelMember.kind), channel, client, body
                    FROM unnest(\(channels), \(clients), \(bodies)) WITH ORDINALITY AS p(channel, client, body, n)
                    ORDER BY n
                    """,
                    logger: self.logger
                )
                try await connection.rows("SELECT pg_notify('tether_pushes', '')", logger: self.logger)
            }
        }
    }

    /// Reads the node's signals when notified (or every poll interval).
    func signalLoop(_ id: Int64, _ node: ClusterNode) async {
        while !Task.isCancelled {
            await self.signals.wait(upTo: self.configuration.pollInterval)
            if Task.isCancelled { return }
            do {
                var recipients: Set<String> = []
                var wanted: Set<OutboxID> = []
                for (kind, key) in try await self.query(
                    "DELETE FROM tether_signals WHERE node = \(id) RETURNING kind, key"
                ).map({ try $0.decode((Int16, String).self) }) {
                    switch ClusterSignal.Kind(rawValue: kind) {
                    case .deliveries: recipients.insert(key)
                    case .releaseLane: if let outbox = Self.outbox(from: key) { wanted.insert(outbox) }
                    case nil: self.logger.warning("unknown cluster signal", metadata: ["kind": "\(kind)"])
                    }
                }
                if !recipients.isEmpty { node.deliveriesAppended(for: recipients) }
                let unused = wanted.filter { !node.laneWanted($0) }
                if !unused.isEmpty {
                    self.state.withLockedValue { $0.unusedLanes += unused }
                    self.writes.ring()
                }
            } catch {
                self.logger.warning("cannot read the node's signals", metadata: ["error": "\(PostgresMessageStore.describe(error))"])
            }
        }
    }

    /// Sends every channel publication appended to the database (by any node, this one too) to
    /// this node's subscribers, in the order of their ids: the order their appends committed
    /// (``PostgresSchema/channelLock``). A publication trimmed before it was read makes an
    /// offset that does not follow, and its subscribers subscribe again (to be told of the gap).
    func channelLoop(_ node: ClusterNode, after start: Int64) async {
        var cursor = start
        while !Task.isCancelled {
            do {
                while true {
                    var read: [ChannelPublication] = []
                    for (publicationID, channel, position, publisher, body, epoch) in try await self.query(
                        """
                        SELECT p.id, p.channel, p.position, p.publisher, p.body, s.epoch
                        FROM tether_channel_publications p JOIN tether_channel_streams s ON s.channel = p.channel
                        WHERE p.id > \(cursor) ORDER BY p.id LIMIT 1000
                        """
                    ).map({ try $0.decode((Int64, String, Int64, String, ByteBuffer, Int64).self) }) {
                        cursor = publicationID
                        read.append(
                            ChannelPublication(
                                channel: channel,
                                position: ChannelPosition(epoch: UInt64(bitPattern: epoch), offset: UInt64(bitPattern: position)),
                                publisher: publisher,
                                body: body
                            )
                        )
                    }
                    if !read.isEmpty { node.channelPublications(read) }
                    if read.count < 1000 { break }
                }
            } catch {
                self.logger.warning(
                    "cannot read the channels' publications",
                    metadata: ["error": "\(PostgresMessageStore.describe(error))"]
                )
            }
            await self.channels.wait(upTo: self.configuration.pollInterval)
        }
    }

    /// Pushes what the other nodes published to this node's connections.
    func pushLoop(_ id: Int64, _ node: ClusterNode, after start: Int64) async {
        var cursor = start
        while !Task.isCancelled {
            do {
                while true {
                    let after = cursor
                    var read = 0
                    var members: [(node: Int64, ClusterChannelMember)] = []
                    var questions: [(id: Int64, question: ClusterQuestion)] = []
                    for (pushID, origin, kind, name, topic, body) in try await self.query(
                        """
                        SELECT id, origin, kind, target, topic, body FROM tether_pushes
                        WHERE id > \(after) ORDER BY id LIMIT 1000
                        """
                    ).map({ try $0.decode((Int64, Int64, Int16, String, String, ByteBuffer).self) }) {
                        read += 1
                        cursor = pushID
                        guard origin != id else { continue }
                        if kind == StoredChannelMember.kind {
                            if let member = StoredChannelMember.decode(channel: name, client: topic, body: body) {
                                members.append((origin, member))
                            }
                            continue
                        }
                        if kind == StoredQuestion.kind {
                            if let question = StoredQuestion.decode(target: name, topic: topic, body: body) { questions.append(question) }
                            continue
                        }
                        if kind == StoredClientCommand.kind {
                            if let command = StoredClientCommand.decode(client: name, topic: topic, body: body) { node.apply(command) }
                            continue
                        }
                        guard let target = StoredPushTarget.decode(kind: kind, name: name) else { continue }
                        node.push(ClusterPush(topic: topic, body: body, target: target))
                    }
                    // Each node's changes in the order it made them.
                    var start = members.startIndex
                    while start < members.endIndex {
                        let origin = members[start].node
                        let end = members[start...].firstIndex { $0.node != origin } ?? members.endIndex
                        node.channelMembers(members[start..<end].map(\.1), on: UInt64(bitPattern: origin))
                        start = end
                    }
                    if !questions.isEmpty { await self.answer(questions, from: id, node) }
                    if read > 0 { self.logger.debug("read pushes", metadata: ["pushes": "\(read)", "cursor": "\(cursor)"]) }
                    if read < 1000 { break }
                }
            } catch {
                self.logger.warning("cannot read the pushes of other nodes", metadata: ["error": "\(PostgresMessageStore.describe(error))"])
            }
            await self.pushes.wait(upTo: self.configuration.pollInterval)
        }
    }

    /// Answers other nodes' questions about this node's connections, in one statement.
    private func answer(_ questions: [(id: Int64, question: ClusterQuestion)], from id: Int64, _ node: ClusterNode) async {
        let bodies = questions.map { StoredQuestion.answer(node.answer($0.question)) }
        do {
            _ = try await self.query(
                """
                INSERT INTO tether_answers (query, node, body)
                SELECT query, \(id), body FROM unnest(\(questions.map(\.id)), \(bodies)) AS a(query, body)
                ON CONFLICT DO NOTHING
                """
            )
        } catch {
            self.logger.warning(
                "cannot answer other nodes' questions about this node's connections",
                metadata: ["error": "\(PostgresMessageStore.describe(error))"]
            )
        }
    }
}
