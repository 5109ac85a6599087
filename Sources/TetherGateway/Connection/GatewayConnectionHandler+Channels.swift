import Foundation
import NIOCore
import TetherCore

extension GatewayConnectionHandler {
    /// A SUBSCRIBE: checks the client may, registers it in the channel's hub, and writes
    /// SUBSCRIBED; the recovery follows in pages as the connection drains.
    func subscribe(_ request: Frame.Subscribe) {
        guard let hub = self.services.pushes.channels else { return }  // the feature is offered only with a hub
        self.subscribesToChannels = true
        // A subscription this one replaces gets nothing more, whatever is on its way, and its
        // recovery stops.
        self.liveChannels[request.channel] = nil
        self.recoveries.removeAll { $0.channel == request.channel }
        self.subscribing[request.channel] = nil
        self.stopPresence(of: request.channel)
        if let (status, message) = self.refusal(of: request, hub: hub) {
            if hub.unsubscribe(connection: self.id, from: request.channel) { self.tellOccupancy() }
            self.refuse(request, status, message)
            return
        }
        if self.services.router.channelAuthorizer != nil, let connection = self.scope?.connection {
            // The application's check first (a call): the SUBSCRIBE waits for its answer, as it
            // waits for the store's, and is bounded the same way.
            guard self.mayWait(request, hub: hub, "to be checked") else { return }
            self.subscribing[request.channel] = request.id
            let router = self.services.router
            let handle = self.handle
            self.spawn {
                var refusal = await router.channelRefusal(.subscribe(channel: request.channel), connection)
                if refusal == nil, request.presenceEvents {
                    refusal = await router.channelRefusal(.presence(channel: request.channel), connection)
                }
                handle.execute(passing: (request, refusal)) { $0.authorized($1.0, refusal: $1.1) }
            }
            return
        }
        self.subscribeAllowed(request, hub: hub)
    }

    /// The application's channel check answered a SUBSCRIBE: unless it was replaced or left
    /// meanwhile, or the connection closed, it is refused or goes on.
    private func authorized(_ request: Frame.Subscribe, refusal: RequestError?) {
        guard self.subscribing[request.channel] == request.id, let hub = self.services.pushes.channels else { return }
        self.subscribing[request.channel] = nil
        if let refusal {
            if hub.unsubscribe(connection: self.id, from: request.channel) { self.tellOccupancy() }
            self.refuse(request, refusal.status, refusal.message)
            return
        }
        self.subscribeAllowed(request, hub: hub)
    }

    /// A SUBSCRIBE the client may make: registered now, or once the store said where the
    /// channel's stream is.
    private func subscribeAllowed(_ request: Frame.Subscribe, hub: ChannelHub) {
        if let writer = self.services.pushes.channelWriter, let retention = hub.configuration.storedHistory(of: request.channel) {
            // Where its stream is, from the store first; answered when the store has. Bounded
            // as the subscriptions are: a burst of SUBSCRIBEs does not start a read each.
            guard self.mayWait(request, hub: hub, "for the channel store") else { return }
            self.subscribing[request.channel] = request.id
            let notBefore = retention.notBefore(self.services.clock)
            let handle = self.handle
            self.spawn {
                let head: Result<ChannelStreamHead, any Error>
                do {
                    head = .success(try await writer.store.head(of: request.channel, notBefore: notBefore))
                } catch {
                    head = .failure(error)
                }
                handle.execute(passing: (request, head)) { $0.subscribe($1.0, head: $1.1) }
            }
            return
        }
        self.register(request, head: nil)
    }

    /// Whether one more SUBSCRIBE may wait (`what`: for the application's check, for the
    /// store); refuses it if the connection has as many waiting as it may have subscriptions.
    private func mayWait(_ request: Frame.Subscribe, hub: ChannelHub, _ what: String) -> Bool {
        guard self.subscribing.count < hub.configuration.maxSubscriptionsPerConnection else {
            self.refuse(
                request,
                .resourceExhausted,
                "this connection has \(self.subscribing.count) subscriptions waiting \(what), the most it may have"
            )
            return false
        }
        return true
    }

    /// Why the client may not subscribe as `request` asks, if it may not.
    private func refusal(of request: Frame.Subscribe, hub: ChannelHub) -> (StatusCode, String)? {
        // The connection whose access the router checks, if it checks this one's.
        let checked = self.scope.flatMap { $0.checksAccess ? $0.connection : nil }
        if let checked, !self.services.router.permits(.subscribe(channel: request.channel), checked) {
            return (.permissionDenied, "this client may not subscribe to \(request.channel)")
        }
        guard request.presenceEvents else { return nil }
        guard hub.configuration.rule(for: request.channel)?.presence == true else {
            return (.invalidRequest, "\(request.channel) keeps no presence (its rule's presence is off); subscribe without presence events")
        }
        if let checked, !self.services.router.permits(.presence(channel: request.channel), checked) {
            return (.permissionDenied, "this client may not see who is in \(request.channel); subscribe without presence events")
        }
        return nil
    }

    /// The store answered where the stream of a SUBSCRIBE's channel is: unless the
    /// subscription was replaced or left meanwhile, or the connection closed, it is registered.
    private func subscribe(_ request: Frame.Subscribe, head: Result<ChannelStreamHead, any Error>) {
        guard self.subscribing[request.channel] == request.id else { return }
        self.subscribing[request.channel] = nil
        switch head {
        case .success(let head):
            self.register(request, head: head)
        case .failure(let error):
            self.refuse(request, .unavailable, "the gateway's channel store failed; subscribe again later: \(error)")
        }
    }

    /// Registers a subscription in the hub, and writes SUBSCRIBED and the recovery's first page.
    private func register(_ request: Frame.Subscribe, head: ChannelStreamHead?) {
        guard let hub = self.services.pushes.channels, let connection = self.scope?.connection else { return }
        let handler = NIOLoopBound(self, eventLoop: self.eventLoop)
        let member = ChannelHub.Member(clientID: connection.clientID, info: connection.identity?.info ?? "")
        switch hub.subscribe(connection: self.id, handler: handler, member: member, to: request, head: head) {
        case .refused(let status, let message):
            self.refuse(request, status, message)
        case .subscribed(let subscribed, let page):
            if page.occupied { self.tellOccupancy() }
            self.services.metrics.subscribed(subscribed.gap ? "gap" : request.recoverFrom == nil ? "top" : "recovered")
            // Publications of a subscription this one replaces, queued on this loop, go first
            // (the client drops those that arrive before SUBSCRIBED).
            self.pushes?.drain()
            self.write(.subscribed(subscribed))
            if request.presenceEvents {
                // The members first, in pages as the connection drains; the changes after.
                self.presenceCursors[request.channel] = PresenceCursor(generation: page.generation)
                self.presenceSnapshots.append(request.channel)
            }
            self.send(page, of: request.channel)
            self.scheduleRecoveries()
            self.flushSoon()
        }
    }

    /// An UNSUBSCRIBE from the client.
    func unsubscribe(from channel: String) {
        if self.services.pushes.channels?.unsubscribe(connection: self.id, from: channel) == true { self.tellOccupancy() }
        self.recoveries.removeAll { $0.channel == channel }
        self.subscribing[channel] = nil
        self.liveChannels[channel] = nil
        self.stopPresence(of: channel)
    }

    /// Where a subscription's presence events are: the generation of the subscription they
    /// are for, and how far the pages of the channel's members reached.
    struct PresenceCursor {
        var generation: UInt64
        /// The last client id the pages wrote; `nil` before the first page.
        var reached: String?
        /// Whether every page was written: every event is written from then on.
        var done = false

        /// Whether an event about `clientID` is written: once the pages reached it (a later
        /// page has its state, which includes the event).
        func writes(about clientID: String) -> Bool {
            if self.done { return true }
            guard let reached = self.reached else { return false }
            return !reached.utf8.lexicographicallyPrecedes(clientID.utf8)
        }
    }

    /// A presence event from the hub (``ChannelHub``), for the subscription made at `generation`.
    func presenceEvent(_ event: Frame.Presence, generation: UInt64) {
        guard self.context != nil, let cursor = self.presenceCursors[event.channel], cursor.generation == generation,
            cursor.writes(about: event.clientID)
        else { return }
        guard event.bodySize <= self.machine.peerMaxBodySize ?? Int.max else {
            self.services.metrics.refused("push_size")
            return
        }
        self.write(.presence(event))
        self.flushSoon()
    }

    /// The subscription to `channel` ended or was replaced: no more of its presence events.
    private func stopPresence(of channel: String) {
        guard self.presenceCursors.removeValue(forKey: channel) != nil else { return }
        self.presenceSnapshots.removeAll { $0 == channel }
    }

    /// Writes the next page of members of the first channel whose presence pages are under way.
    private func continuePresence(hub: ChannelHub) {
        let channel = self.presenceSnapshots.removeFirst()
        guard let cursor = self.presenceCursors[channel],
            let (members, done) = hub.presenceSnapshot(
                of: channel,
                connection: self.id,
                generation: cursor.generation,
                after: cursor.reached,
                limit: hub.configuration.recoveryPageSize
            )
        else { return }
        let limit = self.machine.peerMaxBodySize ?? Int.max
        for event in members where event.bodySize <= limit { self.write(.presence(event)) }
        self.presenceCursors[channel]!.reached = members.last?.clientID ?? cursor.reached
        if done {
            self.presenceCursors[channel]!.done = true
        } else {
            self.presenceSnapshots.append(channel)
        }
    }

    /// The connection closed: it leaves its channels.
    func leaveChannels() {
        guard self.subscribesToChannels else { return }
        if self.services.pushes.channels?.remove(connection: self.id).isEmpty == false { self.tellOccupancy() }
        self.recoveries.removeAll()
        self.subscribing.removeAll()
        self.presenceCursors.removeAll()
        self.presenceSnapshots.removeAll()
    }

    /// Sends the next page of the recoveries under way, one after another, while the
    /// connection is writable: a client that does not read its recoveries gets no more of them
    /// until it does.
    func continueRecoveries() {
        self.recoveryScheduled = false
        guard let context = self.context, let hub = self.services.pushes.channels else { return }
        if !self.presenceSnapshots.isEmpty, context.channel.isWritable, !self.machine.isClosing {
            // One page of members per turn of the loop: the presence events made meanwhile
            // reach the connection between pages.
            self.continuePresence(hub: hub)
            self.flushNow()
            self.scheduleRecoveries()
        }
        while !self.recoveries.isEmpty, context.channel.isWritable, !self.machine.isClosing {
            if self.recoveries[0].fromStore {
                // One read of the store at a time; the rest wait for its page.
                if !self.readingStore { self.readStored(self.recoveries.removeFirst()) }
                return
            }
            let continuation = self.recoveries.removeFirst()
            // A subscription replaced or left meanwhile has no page.
            guard let page = hub.continueRecovery(connection: self.id, continuation) else { continue }
            self.send(page, of: continuation.channel, scheduling: false)
            self.flushNow()  // so that the channel's writability counts this page
        }
        // Stopped by a full channel: its writability's return schedules the rest.
    }

    /// Hands the changes of occupancy the hub recorded to the application's hook
    /// (``Gateway/onChannelOccupancy(_:)``), if any.
    private func tellOccupancy() {
        self.services.pushes.channels?.drainOccupancy(to: self.services.router.occupancy)
    }

    /// Reads the next page of a recovery from the store; it is written when read.
    private func readStored(_ continuation: ChannelHub.Continuation) {
        guard let writer = self.services.pushes.channelWriter,
            let retention = self.services.pushes.channels?.configuration.storedHistory(of: continuation.channel)
        else { return }
        self.readingStore = true
        let notBefore = retention.notBefore(self.services.clock)
        let limit = self.services.pushes.channels?.configuration.recoveryPageSize ?? 256
        let handle = self.handle
        self.spawn {
            // A failed read ends the recovery where it is: the live publications that follow
            // do not follow the subscriber's position, and it subscribes again.
            let read = try? await writer.store.publications(
                of: continuation.channel,
                epoch: continuation.after.epoch,
                after: continuation.after.offset,
                limit: limit,
                notBefore: notBefore
            )
            handle.execute(passing: (continuation, read)) { $0.storedPage($1.0, read: $1.1) }
        }
    }

    /// A page of a recovery read from the store.
    private func storedPage(_ continuation: ChannelHub.Continuation, read: [StoredPublication]?) {
        self.readingStore = false
        guard self.context != nil, !self.machine.isClosing, let hub = self.services.pushes.channels,
            let page = hub.continueRecovery(connection: self.id, continuation, read: read)
        else {
            self.scheduleRecoveries()
            return
        }
        self.send(page, of: continuation.channel, scheduling: false)
        self.flushNow()
        self.scheduleRecoveries()
    }

    private func refuse(_ request: Frame.Subscribe, _ status: StatusCode, _ message: String) {
        self.services.metrics.refused("subscription")
        self.write(.subscribed(Frame.Subscribed(id: request.id, status: status, message: message)))
        self.flushSoon()
    }

    /// Writes a page of a recovery, and schedules the next one: at once while the connection
    /// is writable, else when it becomes writable again.
    private func send(_ page: ChannelHub.Page, of channel: String, scheduling: Bool = true) {
        let limit = self.machine.peerMaxBodySize ?? Int.max
        for publication in page.publications {
            guard publication.bodySize <= limit else {
                // The client sees an offset that does not follow and subscribes again; told of
                // the gap then.
                self.services.metrics.refused("push_size")
                continue
            }
            self.write(.publication(publication))
        }
        if !page.publications.isEmpty { self.services.metrics.recovered.increment(by: page.publications.count) }
        if let liveAfter = page.liveAfter { self.liveChannels[channel] = LiveChannel(after: liveAfter, skipThrough: page.skipThrough) }
        guard let next = page.next else { return }
        self.recoveries.append(next)
        if scheduling { self.scheduleRecoveries() }
    }

    /// Whether every publication among `messages` is for a live subscription of this
    /// connection and published after it went live (a push always is).
    func takesEvery(_ messages: [EncodedPush.Message]) -> Bool {
        messages.allSatisfy(self.takes)
    }

    /// Whether `message` is a push, or a publication this connection's subscription gets.
    func takes(_ message: EncodedPush.Message) -> Bool {
        guard case .publication(let publication, let sequence) = message else { return true }
        guard let live = self.liveChannels[publication.channel], sequence > live.after else { return false }
        guard let skip = live.skipThrough else { return true }
        return publication.position.epoch != skip.epoch || publication.position.offset > skip.offset
    }

    /// Schedules ``continueRecoveries()`` if the connection is writable; otherwise
    /// ``channelWritabilityChanged(context:)`` does once it is.
    func scheduleRecoveries() {
        guard !self.recoveries.isEmpty || !self.presenceSnapshots.isEmpty, !self.recoveryScheduled, self.io.isWritable else { return }
        self.recoveryScheduled = true
        self.eventLoop.assumeIsolated().execute { self.continueRecoveries() }
    }

    /// The handler of ``ChannelHistoryQuery/method``: a page of a channel's history, for a
    /// client that may subscribe to it.
    static func channelHistory(from pusher: Pusher, router: Router) -> Gateway.Handler {
        { request, context in
            let query: ChannelHistoryQuery
            do throws(ChannelHistoryQuery.Malformed) {
                query = try ChannelHistoryQuery(decoding: request.body)
            } catch {
                throw RequestError(.invalidRequest, "\(ChannelHistoryQuery.method): \(error.message)")
            }
            if router.checksAccess(of: context.connection), !router.permits(.subscribe(channel: query.channel), context.connection) {
                throw RequestError(.permissionDenied, "this client may not read \(query.channel)")
            }
            if let refusal = await router.channelRefusal(.subscribe(channel: query.channel), context.connection) { throw refusal }
            return ChannelHistoryQuery.encode(try await pusher.history(of: query.channel, after: query.after, limit: query.limit))
        }
    }

    /// The handler of a reserved channel method (`$channel.history`, `$channel.publish`), if
    /// `method` is one and the gateway has channels.
    func channelMethod(_ method: String) -> Gateway.Handler? {
        guard method.utf8.first == UInt8(ascii: "$") else { return nil }
        switch method {
        case ChannelHistoryQuery.method: return self.services.channelHistory
        case ChannelPublishRequest.method: return self.services.channelPublish
        case ChannelPresenceQuery.method: return self.services.channelPresence
        default: return nil
        }
    }

    /// The handler of ``ChannelPresenceQuery/method``: who is subscribed to a channel whose
    /// rule keeps presence, for a client that may see it.
    static func channelPresence(from hub: ChannelHub, router: Router) -> Gateway.Handler {
        { request, context in
            let query: ChannelPresenceQuery
            do throws(ChannelHistoryQuery.Malformed) {
                query = try ChannelPresenceQuery(decoding: request.body)
            } catch {
                throw RequestError(.invalidRequest, "\(ChannelPresenceQuery.method): \(error.message)")
            }
            guard hub.configuration.rule(for: query.channel)?.presence == true else {
                throw RequestError(.invalidRequest, "\(query.channel) keeps no presence (its rule's presence is off)")
            }
            if router.checksAccess(of: context.connection), !router.permits(.presence(channel: query.channel), context.connection) {
                throw RequestError(.permissionDenied, "this client may not see who is in \(query.channel)")
            }
            if let refusal = await router.channelRefusal(.presence(channel: query.channel), context.connection) { throw refusal }
            return ChannelPresenceQuery.encode(hub.presence(of: query.channel, after: query.after, limit: query.limit))
        }
    }

    /// The handler of ``ChannelPublishRequest/method``: publishes for a client, as itself,
    /// where the channel's rule lets clients publish and its credentials allow it.
    static func channelPublish(to hub: ChannelHub, pusher: Pusher, router: Router) -> Gateway.Handler {
        { request, context in
            let publication: ChannelPublishRequest
            do throws(ChannelHistoryQuery.Malformed) {
                publication = try ChannelPublishRequest(decoding: request.body)
            } catch {
                throw RequestError(.invalidRequest, "\(ChannelPublishRequest.method): \(error.message)")
            }
            guard hub.configuration.clientsMayPublish(to: publication.channel) else {
                throw RequestError(.permissionDenied, "clients may not publish to \(publication.channel); the gateway and its handlers do")
            }
            if router.checksAccess(of: context.connection), !router.permits(.publish(channel: publication.channel), context.connection) {
                throw RequestError(.permissionDenied, "this client may not publish to \(publication.channel)")
            }
            if let refusal = await router.channelRefusal(.publish(channel: publication.channel), context.connection) { throw refusal }
            let (position, _) = try await pusher.publish(publication.body, to: publication.channel, publisher: context.connection.clientID)
            return ChannelPublishRequest.encode(position)
        }
    }
}

/// A subscription of this connection that gets live publications: those published after
/// `after` (the channel's sequence on this node when it went live), but for those at or before
/// `skipThrough` (a position the subscriber had from another node, for a channel in the store).
struct LiveChannel {
    var after: UInt64
    var skipThrough: ChannelPosition?
}
