public import TetherCore

/// What a channel subscription hears, in order.
public enum SubscriptionEvent: Sendable, Hashable {
    /// Subscribed on a connection (the first, or after a reconnect). `recovered`: nothing the
    /// subscription had not received since its last position is lost — what it missed while
    /// away follows, then the live publications. `false` when the channel keeps no history
    /// and the subscription was away (it cannot know what it missed), or recovery is off.
    case subscribed(recovered: Bool)
    /// A publication, each once and in offset order.
    case publication(ChannelPublication)
    /// Publications were missed and cannot be had any more: the channel's history no longer
    /// reaches back to them (``ChannelGap/missed`` says how many when known), or the
    /// subscriber fell too far behind. The publications after it follow. An app shows "N
    /// messages missed", or reloads the state from its backend.
    case gap(ChannelGap)
    /// A client is in the channel, with what it shows others (``ClientIdentity``'s info on the
    /// gateway): for a subscription made with `presence: true`. After each
    /// ``subscribed(recovered:)`` the channel's members come first, each as `joined`, then the
    /// changes; an app folds them by client id (a `joined` of a member it has replaces it).
    case joined(clientID: String, info: String)
    /// A client left the channel: its last connection there unsubscribed or closed.
    case left(clientID: String)
}

/// A subscription to a channel: its events, across reconnects, until the task reading it
/// stops (or the client stops, or the gateway refuses it, which ends it with a
/// ``TetherError``).
///
/// ```swift
/// for try await event in client.subscribe("room.lobby") {
///     switch event {
///     case .publication(let message): show(message)
///     case .gap(let gap): showMissed(gap.missed)
///     case .subscribed: break
///     case .joined, .left: break  // with `presence: true`
///     }
/// }
/// ```
public struct ChannelSubscription: AsyncSequence, Sendable {
    public typealias Element = SubscriptionEvent
    public typealias Failure = any Error

    let stream: AsyncThrowingStream<SubscriptionEvent, any Error>
    /// Where the subscription keeps its position, if the client keeps them
    /// (``ClientConfiguration/Channels-swift.struct/positions``).
    let saver: ChannelPositionSaver?

    init(stream: AsyncThrowingStream<SubscriptionEvent, any Error>, saver: ChannelPositionSaver? = nil) {
        self.stream = stream
        self.saver = saver
    }

    public struct AsyncIterator: AsyncIteratorProtocol {
        var base: AsyncThrowingStream<SubscriptionEvent, any Error>.AsyncIterator
        let saver: ChannelPositionSaver?
        /// The position of the publication handed out last: handled once the app asks for the next.
        var pending: ChannelPosition?
        /// The last publication handled, and the last one kept.
        var handled: ChannelPosition?
        var saved: ChannelPosition?
        var savedAt: TetherInstant?

        /// The next event; `nil` once the subscription ended; throws ``TetherError`` when the
        /// gateway refused or ended it.
        ///
        /// With positions kept, asking for the next event says the app handled the publication
        /// it got last: its position is kept (at most once per ``ClientConfiguration/Channels-swift.struct/saveInterval``,
        /// and when the subscription ends).
        public mutating func next() async throws -> SubscriptionEvent? {
            guard self.saver != nil else { return try await self.base.next() }
            if let pending = self.pending {
                self.handled = pending
                self.pending = nil
                await self.save(force: false)
            }
            let event: SubscriptionEvent?
            do {
                event = try await self.base.next()
            } catch {
                await self.save(force: true)
                throw error
            }
            switch event {
            case .publication(let publication)? where publication.position.epoch != 0:
                self.pending = publication.position
            case nil:
                await self.save(force: true)
            default:
                break
            }
            return event
        }

        /// Keeps the position handled last, if it changed and the interval has passed (or `force`).
        private mutating func save(force: Bool) async {
            guard let saver = self.saver, let handled = self.handled, handled != self.saved else { return }
            let now = saver.clock.now
            if !force, let savedAt = self.savedAt, now < savedAt + saver.interval { return }
            // A failed save costs a publication handed out again after a restart, not a loss.
            guard (try? await saver.store.saveChannelPositions([saver.channel: handled])) != nil else { return }
            self.saved = handled
            self.savedAt = now
        }
    }

    public func makeAsyncIterator() -> AsyncIterator {
        AsyncIterator(base: self.stream.makeAsyncIterator(), saver: self.saver)
    }
}
