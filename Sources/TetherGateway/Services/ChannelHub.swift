import NIOCore
import TetherCore
import TetherNIO

/// The gateway's channels: each channel's subscribers, grouped by event loop as rooms' members
/// are in ``ConnectionRegistry``, and its history in memory (``ChannelHistory``).
///
/// A publication is appended and its recipients are read in one step under the hub's lock;
/// a subscription is registered and its recovery read in one step too. So every offset reaches
/// a subscriber once: a publication appended before the subscriber was registered is in its
/// recovery, one appended after goes to it live, and the live one is written after the
/// recovery (it reaches the subscriber's loop after the step that wrote the recovery).
///
/// A recovery longer than ``GatewayConfiguration/Channels-swift.struct/recoveryPageSize``
/// goes in pages: the subscriber is registered as *recovering* (it gets no live publication)
/// until the page that reaches the top, read in the same step that makes it live.
///
/// Each publication of a channel also gets a *sequence* on this node (history or not), and a
/// subscription that goes live is told the sequence it goes live after: its connection writes
/// only the publications after it. A publication whose recipients were read before a
/// resubscription (and that is still on its way to the connection's loop) is not written
/// after the new SUBSCRIBED, nor one that arrives after an UNSUBSCRIBE.
///
/// In a channel that keeps presence, the hub counts each client's connections, and a client's
/// first one makes a *joined* event, its last one leaving a *left* event: handed to each
/// subscriber's loop that asked for them in the step that made them (an `execute` under the
/// lock, so that every loop gets a channel's events in the order they happened). A subscriber
/// first gets the channel's members in pages (``presenceSnapshot(of:connection:generation:after:limit:)``),
/// then the changes; its connection writes an event about a client its pages have not reached
/// yet only when a page does (see ``GatewayConnectionHandler/presenceEvent(_:generation:)``).
final class ChannelHub: Sendable {
    /// A publication kept in a channel's history.
    struct Kept: Sendable {
        var publisher: String
        var body: ByteBuffer
    }

    /// What a subscription gets: SUBSCRIBED and the first publications it recovers, or a refusal.
    enum Subscription: Sendable {
        case subscribed(Frame.Subscribed, Page)
        case refused(StatusCode, String)
    }

    /// Publications of a recovery, oldest first, and where it continues if it is not over.
    struct Page: Sendable {
        var publications: [Frame.Publication]
        var next: Continuation?
        /// When the subscription went live with this page: the sequence of the channel's last
        /// publication, after which the connection writes the live ones.
        var liveAfter: UInt64?
        /// With ``liveAfter``, for a channel in the store: the live publications up to this
        /// position are left out — the subscriber had them from another node before this one
        /// sent them (its tail of the shared stream behind the store's head).
        var skipThrough: ChannelPosition?
        /// Whether the subscription is the channel's first on this node (none was before it).
        var occupied = false
        /// The subscription's generation: its presence events carry it.
        var generation: UInt64 = 0
    }

    /// Where a recovery continues: after `position`, for the subscription made at `generation`
    /// (a later SUBSCRIBE to the channel replaces it, and its continuation is void).
    struct Continuation: Sendable {
        var channel: String
        var after: ChannelPosition
        var generation: UInt64
        /// Whether its pages are read from the gateway's store (a channel whose rule says
        /// ``GatewayConfiguration/Channels-swift.struct/Storage/store``), not from memory.
        var fromStore = false
    }

    struct Subscriber {
        var handler: NIOLoopBound<GatewayConnectionHandler>
        /// Whether it gets live publications (its recovery is over).
        var live: Bool
        var generation: UInt64
        /// Who it is, in the channel's presence.
        var member: Member
        /// Whether it gets the channel's presence events.
        var presenceEvents = false
    }

    /// A subscriber's client id and what it shows others (``ClientIdentity/info``).
    struct Member: Sendable {
        var clientID: String
        var info: String
    }

    struct Channel {
        var history: ChannelHistory<Kept>?
        /// A channel whose history is in the store: its stream's epoch, and the offset of its
        /// last publication sent from this node (its publications are sent in the order the
        /// store appended them, see ``ChannelWriter``).
        var stream: ChannelPosition?
        var subscribers: [UInt64: Subscriber] = [:]
        /// The live subscribers grouped by loop, built at the first publication after a change.
        var recipients: [ConnectionRegistry.LoopRecipients]?
        /// The sequence of the last publication on this node.
        var sequence: UInt64 = 0
        /// In a channel that keeps presence: each client's connections subscribed on this
        /// node, and the info of the first.
        var clients: [String: MemberState]?

        /// Nothing to keep it for: no subscriber, no publication kept.
        func isIdle(at now: TetherInstant) -> Bool {
            self.subscribers.isEmpty && self.history?.isEmpty(at: now) != false
        }
    }

    struct State {
        var channels: [String: Channel] = [:]
        var channelsOf: [UInt64: Set<String>] = [:]
        var historyBytes = 0
        var generation: UInt64 = 0
        /// Channels that gained their first subscriber (`true`) or lost their last, in the
        /// order of the steps that did it, until ``drainOccupancy(to:)`` hands them on.
        var occupancy: [(channel: String, occupied: Bool)] = []
        /// Whether a caller of ``drainOccupancy(to:)`` is handing them on.
        var drainingOccupancy = false
        /// In a cluster that shares presence: what the other nodes have of each channel's
        /// members, by channel, client and node.
        var remoteMembers: [String: [String: [UInt64: MemberState]]] = [:]
        /// The mark of each other node's last change heard (``heardMark``).
        var heardFrom: [UInt64: UInt64] = [:]
        /// Counts the rounds of changes heard from other nodes.
        var heard: UInt64 = 0
    }

    let configuration: GatewayConfiguration.Channels
    private let clock: any TetherClock
    let state = TetherLock(State())

    /// The cluster the members of channels that keep presence are shared with, if they are.
    let cluster: (any GatewayCluster)?

    init(configuration: GatewayConfiguration.Channels, clock: any TetherClock, cluster: (any GatewayCluster)? = nil) {
        self.configuration = configuration
        self.clock = clock
        self.cluster = cluster?.sharesChannelPresence == true ? cluster : nil
    }

    /// Subscribes a connection to `channel` (replacing its subscription there), and reads what
    /// it recovers after `position` (`nil`: from the top, nothing recovered).
    /// - Parameter head: For a channel whose history is in the store, its stream's head as the
    ///   store answered it just before: where the recovery starts, and what it can still get.
    func subscribe(
        connection id: UInt64,
        handler: NIOLoopBound<GatewayConnectionHandler>,
        member: Member,
        to request: Frame.Subscribe,
        head: ChannelStreamHead? = nil
    ) -> Subscription {
        let now = self.clock.now
        return self.state.withLockedValue { state -> Subscription in
            let already = state.channelsOf[id]?.contains(request.channel) == true
            if !already, (state.channelsOf[id]?.count ?? 0) >= self.configuration.maxSubscriptionsPerConnection {
                return .refused(
                    .resourceExhausted,
                    "this connection is subscribed to \(self.configuration.maxSubscriptionsPerConnection) channels, the most it may be"
                )
            }
            if state.channels[request.channel] == nil {
                if state.channels.count >= self.configuration.maxChannels { Self.sweep(&state, now: now) }
                guard state.channels.count < self.configuration.maxChannels else {
                    return .refused(.resourceExhausted, "the gateway has \(self.configuration.maxChannels) channels, the most it keeps")
                }
                state.channels[request.channel] = self.newChannel(request.channel)
            }
            state.generation += 1
            let generation = state.generation
            var channel = state.channels.removeValue(forKey: request.channel)!
            defer { state.channels[request.channel] = channel }
            var subscribed = Frame.Subscribed(id: request.id)
            var page = Page(publications: [], next: nil)
            if let head {
                page.next = Self.storedRecovery(
                    from: request,
                    head: head,
                    channel: &channel,
                    subscribed: &subscribed,
                    generation: generation
                )
            } else if var history = channel.history {
                channel.history = nil  // trimmed in place, not copied
                let before = history.keptWeight
                history.trim(at: now)
                state.historyBytes += history.keptWeight - before
                channel.history = history
                // Only where the recovery starts, and whether there is one: its pages are read as
                // the connection drains (`continueRecovery`), never here, so that a burst of
                // SUBSCRIBEs in one read cannot make the gateway write their recoveries at once.
                let recovery = history.recover(after: request.recoverFrom, limit: 1, at: now)
                subscribed.epoch = history.epoch
                if let gap = recovery.gap {
                    subscribed.gap = true
                    subscribed.startingAfter = gap.resumesAt.offset - 1
                } else {
                    subscribed.startingAfter = request.recoverFrom?.offset ?? history.topOffset
                }
                if !recovery.publications.isEmpty {
                    let start = ChannelPosition(epoch: history.epoch, offset: subscribed.startingAfter)
                    page.next = Continuation(channel: request.channel, after: start, generation: generation)
                }
            } else {
                // Live publications only: nothing recovered, and a subscriber that asked knows it.
                subscribed.gap = request.recoverFrom != nil
            }
            if page.next == nil {
                page.liveAfter = channel.sequence
                // A subscriber past what this node sent (within the store's head): live now,
                // without what it has, which is still on its way here.
                if head != nil, let stream = channel.stream, subscribed.startingAfter > stream.offset {
                    page.skipThrough = ChannelPosition(epoch: stream.epoch, offset: subscribed.startingAfter)
                }
            }
            page.occupied = channel.subscribers.isEmpty
            page.generation = generation
            if page.occupied { state.occupancy.append((request.channel, true)) }
            let replaced = channel.subscribers[id] != nil
            channel.subscribers[id] = Subscriber(
                handler: handler,
                live: page.next == nil,
                generation: generation,
                member: member,
                presenceEvents: request.presenceEvents && channel.clients != nil
            )
            channel.recipients = nil
            if !replaced {
                self.joined(member, request.channel, channel: &channel, remote: state.remoteMembers[request.channel])
            }
            if !already { state.channelsOf[id, default: []].insert(request.channel) }
            return .subscribed(subscribed, page)
        }
    }

    /// The next page of a recovery; `nil` if the subscription it was for is gone or replaced.
    /// The page that reaches the top makes the subscriber live.
    func continueRecovery(connection id: UInt64, _ continuation: Continuation) -> Page? {
        let now = self.clock.now
        let pageSize = self.configuration.recoveryPageSize
        return self.state.withLockedValue { state -> Page? in
            guard let subscriber = state.channels[continuation.channel]?.subscribers[id],
                subscriber.generation == continuation.generation, !subscriber.live,
                let history = state.channels[continuation.channel]?.history
            else { return nil }
            // Should the history have been trimmed past the position meanwhile, the page starts
            // at what is kept: the subscriber sees an offset that does not follow, and subscribes
            // again from its position (to be told of the gap).
            let recovery = history.recover(after: continuation.after, limit: pageSize, at: now)
            let (kept, cut) = Self.capped(recovery.publications)
            var page = Page(publications: kept.map { Self.frame($0, of: continuation.channel, epoch: history.epoch) })
            if recovery.more || cut, let last = page.publications.last {
                page.next = Continuation(channel: continuation.channel, after: last.position, generation: continuation.generation)
            } else {
                state.channels[continuation.channel]!.subscribers[id]!.live = true
                state.channels[continuation.channel]!.recipients = nil
                page.liveAfter = state.channels[continuation.channel]!.sequence
            }
            return page
        }
    }

    /// Takes a connection out of `channel`.
    /// - Returns: Whether the channel lost its last subscriber on this node.
    @discardableResult
    func unsubscribe(connection id: UInt64, from channel: String) -> Bool {
        self.state.withLockedValue { state in
            guard state.channelsOf[id]?.remove(channel) != nil else { return false }
            if state.channelsOf[id]?.isEmpty == true { state.channelsOf[id] = nil }
            return self.remove(id, from: channel, &state)
        }
    }

    /// Takes a closed connection out of every channel.
    /// - Returns: The channels that lost their last subscriber on this node.
    @discardableResult
    func remove(connection id: UInt64) -> [String] {
        self.state.withLockedValue { state in
            (state.channelsOf.removeValue(forKey: id) ?? []).sorted().filter { self.remove(id, from: $0, &state) }
        }
    }

    /// Appends a publication to `channel`'s history (if it keeps one) and returns it with its
    /// sequence and the live subscribers to send it to.
    func publish(
        _ body: ByteBuffer,
        to channel: String,
        publisher: String
    ) -> (Frame.Publication, sequence: UInt64, [ConnectionRegistry.LoopRecipients]) {
        let now = self.clock.now
        // A slice of a larger buffer (a request's body is a slice of what was read) would hold
        // all of it for as long as the history keeps the publication: kept in a buffer of its
        // own (copied outside the lock), the bytes counted are the bytes held.
        let keeps = self.configuration.history(of: channel) != nil
        var body = body
        if keeps, body.storageCapacity > 2 * body.readableBytes + 64 {
            body = ByteBuffer(buffer: body)
        }
        return self.state.withLockedValue { state in
            var publication = Frame.Publication(channel: channel, publisher: publisher, body: body)
            if state.channels[channel] == nil {
                guard keeps, state.channels.count < self.configuration.maxChannels else {
                    return (publication, 0, [])  // no subscriber, and nothing to keep it in
                }
                state.channels[channel] = self.newChannel(channel)
            }
            var entry = state.channels.removeValue(forKey: channel)!
            defer { state.channels[channel] = entry }
            entry.sequence += 1
            if var history = entry.history {
                entry.history = nil  // appended in place, not copied
                let before = history.keptWeight
                publication.position = history.append(Kept(publisher: publisher, body: body), weight: body.readableBytes, at: now)
                state.historyBytes += history.keptWeight - before
                // Over the gateway's total, this channel gives up its oldest.
                while state.historyBytes > self.configuration.maxHistoryBytes, history.count > 0 {
                    let weight = history.keptWeight
                    history.dropOldest()
                    state.historyBytes -= weight - history.keptWeight
                }
                entry.history = history
            }
            if entry.recipients == nil { entry.recipients = Self.group(entry.subscribers.values) }
            return (publication, entry.sequence, entry.recipients!)
        }
    }

    /// A page of `channel`'s history: what follows `after`, or (`nil`) its latest `limit`
    /// publications, oldest first.
    func history(of channel: String, after: ChannelPosition?, limit: Int) -> ChannelHistoryPage {
        let now = self.clock.now
        return self.state.withLockedValue { state in
            guard let history = state.channels[channel]?.history else {
                // No stream (no history, or none yet): a position of some epoch lost its history.
                let gap = after.flatMap { $0.epoch == 0 ? nil : ChannelGap(after: $0, resumesAt: ChannelPosition(epoch: 0, offset: 1)) }
                return ChannelHistoryPage(channel: channel, epoch: 0, top: 0, gap: gap, more: false, publications: [])
            }
            let top = history.topOffset
            let from = after ?? ChannelPosition(epoch: history.epoch, offset: top - min(top, UInt64(limit)))
            let recovery = history.recover(after: from, limit: limit, at: now)
            let (kept, cut) = Self.capped(recovery.publications)
            return ChannelHistoryPage(
                channel: channel,
                epoch: history.epoch,
                top: top,
                gap: after == nil ? nil : recovery.gap,  // the latest ones: nothing was asked before them
                more: recovery.more || cut,
                publications: kept.map {
                    ChannelPublication(
                        channel: channel,
                        position: ChannelPosition(epoch: history.epoch, offset: $0.offset),
                        publisher: $0.payload.publisher,
                        body: $0.payload.body
                    )
                }
            )
        }
    }

    /// Hands the channels' changes of occupancy to `hook`, in the order they happened, one
    /// caller at a time: a caller that finds another handing them on leaves its changes to it.
    /// Called after a step reported a change (``Page/occupied``, a vacated channel).
    func drainOccupancy(to hook: Gateway.ChannelOccupancyHook?) {
        while true {
            let batch = self.state.withLockedValue { state -> [(channel: String, occupied: Bool)]? in
                guard !state.drainingOccupancy, !state.occupancy.isEmpty else { return nil }
                state.drainingOccupancy = true
                defer { state.occupancy.removeAll() }
                return state.occupancy
            }
            guard let batch else { return }
            if let hook { for change in batch { hook(change.channel, change.occupied) } }
            let more = self.state.withLockedValue { state -> Bool in
                state.drainingOccupancy = false
                return !state.occupancy.isEmpty
            }
            if !more { return }
        }
    }

    /// The number of channels kept, and the bytes their histories hold.
    var counts: (channels: Int, historyBytes: Int) {
        self.state.withLockedValue { ($0.channels.count, $0.historyBytes) }
    }

    private func newChannel(_ name: String) -> Channel {
        let rule = self.configuration.rule(for: name)
        return Channel(
            history: self.configuration.history(of: name).map { ChannelHistory(epoch: .random(in: 1...(.max)), retention: $0) },
            clients: rule?.presence == true ? [:] : nil
        )
    }

    /// - Returns: Whether the channel lost its last subscriber.
    private func remove(_ id: UInt64, from name: String, _ state: inout State) -> Bool {
        guard let subscriber = state.channels[name]?.subscribers.removeValue(forKey: id) else { return false }
        state.channels[name]!.recipients = nil
        let remote = state.remoteMembers[name]
        self.left(subscriber.member.clientID, name, channel: &state.channels[name]!, remote: remote)
        let vacated = state.channels[name]!.subscribers.isEmpty
        if vacated { state.occupancy.append((name, false)) }
        // A channel with history stays when its last subscriber leaves: its position (epoch,
        // last offset) lets a subscriber that comes back recover, or know exactly what it
        // missed. Idle ones go when the hub is full (``sweep(_:now:)``).
        if state.channels[name]!.history == nil, state.channels[name]!.subscribers.isEmpty { Self.forget(name, &state) }
        return vacated
    }

    private static func forget(_ name: String, _ state: inout State) {
        guard let channel = state.channels.removeValue(forKey: name) else { return }
        state.historyBytes -= channel.history?.keptWeight ?? 0
    }

    /// Forgets the channels with no subscriber and no publication kept: a subscriber that
    /// comes back to one gets a new epoch, and a gap of unknown size.
    private static func sweep(_ state: inout State, now: TetherInstant) {
        for (name, channel) in state.channels where channel.isIdle(at: now) { Self.forget(name, &state) }
    }

    /// The most body bytes one page of a recovery or of a history query holds (a publication
    /// larger than it goes alone): what one small frame from a client can make the gateway
    /// write is bounded.
    static let pageBytes = 64 << 10

    /// The first publications of `publications` whose bodies hold at most ``pageBytes`` (at
    /// least one), and whether some were left out: for pages read from memory or the store.
    static func capped<Publication>(
        _ publications: [Publication],
        bodyBytes: (Publication) -> Int
    ) -> (ArraySlice<Publication>, Bool) {
        var bytes = 0
        for (index, publication) in publications.enumerated() {
            bytes += bodyBytes(publication)
            if bytes > Self.pageBytes, index > 0 { return (publications[..<index], true) }
        }
        return (publications[...], false)
    }

    /// ``capped(_:bodyBytes:)`` for publications kept in memory.
    private static func capped(_ publications: [ChannelHistory<Kept>.Publication]) -> (ArraySlice<ChannelHistory<Kept>.Publication>, Bool) {
        Self.capped(publications) { $0.payload.body.readableBytes }
    }

    private static func frame(_ kept: ChannelHistory<Kept>.Publication, of channel: String, epoch: UInt64) -> Frame.Publication {
        Frame.Publication(
            channel: channel,
            position: ChannelPosition(epoch: epoch, offset: kept.offset),
            publisher: kept.payload.publisher,
            body: kept.payload.body
        )
    }

    static func group(_ subscribers: some Sequence<Subscriber>) -> [ConnectionRegistry.LoopRecipients] {
        ConnectionRegistry.LoopRecipients.grouping(subscribers.lazy.filter(\.live).map(\.handler))
    }
}
