import Atomics
import NIOCore
import TetherCore
import TetherNIO

/// The client's channel subscriptions: one ``SubscriptionMachine`` each, across connections.
///
/// Everything runs on the client's event loop, where its connections' handlers run: a frame
/// from the gateway reaches ``received(_:)`` with no hop; the application's calls hop there
/// once. No lock.
final class ClientChannels: @unchecked Sendable {
    // Sendable: the mutable state is touched only on `loop`, which every entry point reaches first.

    private struct Entry {
        var machine: SubscriptionMachine
        var continuation: AsyncThrowingStream<SubscriptionEvent, any Error>.Continuation
        /// Tells this subscription apart from a later one to the same channel.
        var token: UInt64
        /// The id of the SUBSCRIBE waiting for its SUBSCRIBED.
        var pending: UInt64?
        /// The position of the last publication the application's buffer took.
        var enqueued: ChannelPosition?
        /// The buffer was full: the publications after `enqueued` were not taken. A channel
        /// with history subscribes again from `enqueued`; one without reports a gap first.
        var overflowed = false
        /// Whether it asks for the channel's presence events.
        var presence: Bool
        /// The buffer was full when a presence event came: it subscribes again, to get the
        /// channel's members afresh.
        var presenceLost = false
        /// Its position is being read from the client's store: it subscribes once it is.
        var loading = false
    }

    private let loop: any EventLoop
    private var connection: ClientConnection?
    private var entries: [String: Entry] = [:]
    /// The ids of SUBSCRIBE frames.
    private var nextID: UInt64 = 0
    private var finished = false
    /// Tells subscriptions to one channel apart (taken off the loop, when one is made).
    private let tokens = ManagedAtomic<UInt64>(1)

    init(loop: any EventLoop) {
        self.loop = loop
    }

    /// A new subscription; its stream ends with an error if the channel name is bad, the
    /// client subscribes to this channel already, or the client stopped.
    func subscribe(
        _ channel: String,
        from position: ChannelPosition?,
        recover: Bool,
        presence: Bool,
        bufferSize: Int,
        positions: ChannelPositionSaver? = nil,
        loadsPosition: Bool = false
    ) -> ChannelSubscription {
        let (stream, continuation) = AsyncThrowingStream.makeStream(
            of: SubscriptionEvent.self,
            throwing: (any Error).self,
            bufferingPolicy: .bufferingOldest(max(1, bufferSize))
        )
        guard Frame.isValidChannelName(channel) else {
            continuation.finish(
                throwing: TetherError(code: .invalidArgument, message: "a channel name must be 1 to \(Frame.maxChannelLength) bytes long")
            )
            return ChannelSubscription(stream: stream)
        }
        // Set before the hop: a reader that stops at once still ends the subscription (its end
        // is queued on the loop after the hop that adds it).
        let token = self.tokens.loadThenWrappingIncrement(ordering: .relaxed)
        continuation.onTermination = { [weak self] _ in self?.onLoop { $0.end(channel, token: token) } }
        let loading = loadsPosition && positions != nil
        self.onLoop { channels in
            channels.add(
                channel,
                token: token,
                position: position,
                recover: recover,
                presence: presence,
                loading: loading,
                continuation: continuation
            )
        }
        if loading, let positions {
            // Read off the loop; the subscription waits for it (in order with everything else
            // queued on the loop for this channel, its end too).
            Task {
                let kept = try? await positions.store.channelPosition(of: channel)
                self.onLoop { $0.loaded(channel, token: token, position: kept ?? nil) }
            }
        }
        return ChannelSubscription(stream: stream, saver: positions)
    }

    /// A connection is up: every subscription subscribes on it, if it negotiated channels.
    func attach(_ connection: ClientConnection) {
        self.onLoop { channels in
            guard connection.negotiated.features.contains(.channels) else { return }
            channels.connection = connection
            for name in Array(channels.entries.keys) where !channels.entries[name]!.loading {
                channels.perform(on: name) { $0.connected() }
            }
        }
    }

    /// The connection went down: the subscriptions wait for the next.
    func detach(_ connection: ClientConnection) {
        self.onLoop { channels in
            guard channels.connection === connection else { return }
            channels.connection = nil
            for name in Array(channels.entries.keys) {
                channels.entries[name]!.machine.disconnected()
                channels.entries[name]!.pending = nil
            }
        }
    }

    /// The client stopped: every subscription ends.
    func finish() {
        self.onLoop { channels in
            channels.finished = true
            let entries = channels.entries
            channels.entries = [:]
            for entry in entries.values { entry.continuation.finish() }
        }
    }

    /// A channel frame from the connection, on the event loop.
    func received(_ payload: Frame.Payload) {
        self.loop.preconditionInEventLoop()
        switch payload {
        case .subscribed(let subscribed):
            guard let name = self.entries.first(where: { $0.value.pending == subscribed.id })?.key else { return }  // replaced or left
            self.entries[name]!.pending = nil
            guard subscribed.status == .ok else {
                self.refused(name, status: subscribed.status, message: subscribed.message)
                return
            }
            let startingAfter = ChannelPosition(epoch: subscribed.epoch, offset: subscribed.startingAfter)
            let gap =
                subscribed.gap
                ? ChannelGap(
                    after: self.entries[name]!.machine.position ?? ChannelPosition(epoch: 0, offset: 0),
                    resumesAt: ChannelPosition(epoch: subscribed.epoch, offset: subscribed.startingAfter + 1)
                ) : nil
            self.perform(on: name) { $0.subscribed(startingAfter: startingAfter, gap: gap) }
        case .publication(let publication):
            guard self.entries[publication.channel] != nil else { return }  // left
            self.perform(on: publication.channel, publication: publication) { $0.received(publication.position) }
        case .unsubscribe(let unsubscribe):
            guard self.entries[unsubscribe.channel] != nil else { return }
            self.refused(unsubscribe.channel, status: unsubscribe.status, message: unsubscribe.message)
        case .presence(let presence):
            self.received(presence)
        default:
            break
        }
    }

    /// A presence event: handed on if it is for the subscription now made (not one between its
    /// SUBSCRIBE and SUBSCRIBED).
    private func received(_ presence: Frame.Presence) {
        guard var entry = self.entries[presence.channel], entry.presence, entry.pending == nil,
            case .subscribed = entry.machine.state
        else { return }
        let event: SubscriptionEvent =
            switch presence.kind {
            case .joined: .joined(clientID: presence.clientID, info: presence.info)
            case .left: .left(clientID: presence.clientID)
            }
        guard case .dropped = entry.continuation.yield(event) else { return }
        // The members the app folds are wrong from here: subscribe again, for them afresh.
        entry.presenceLost = true
        self.entries[presence.channel] = entry
        self.resubscribeAfterOverflow(presence.channel)
    }

    // MARK: On the loop

    private func add(
        _ channel: String,
        token: UInt64,
        position: ChannelPosition?,
        recover: Bool,
        presence: Bool,
        loading: Bool,
        continuation: AsyncThrowingStream<SubscriptionEvent, any Error>.Continuation
    ) {
        guard !self.finished else {
            continuation.finish(throwing: TetherError(code: .shutdown, message: "the client is stopped"))
            return
        }
        guard self.entries[channel] == nil else {
            continuation.finish(
                throwing: TetherError(
                    code: .invalidArgument,
                    message: "this client is subscribed to \(channel) already; end that subscription first"
                )
            )
            return
        }
        self.entries[channel] = Entry(
            machine: SubscriptionMachine(recover: recover, position: position),
            continuation: continuation,
            token: token,
            enqueued: position,
            presence: presence,
            loading: loading
        )
        if self.connection != nil, !loading { self.perform(on: channel) { $0.connected() } }
    }

    /// The position the client kept for a subscription was read: it subscribes from there.
    private func loaded(_ channel: String, token: UInt64, position: ChannelPosition?) {
        guard var entry = self.entries[channel], entry.token == token, entry.loading else { return }
        entry.loading = false
        if let position {
            entry.machine = SubscriptionMachine(recover: entry.machine.recover, position: position)
            entry.enqueued = position
        }
        self.entries[channel] = entry
        if self.connection != nil { self.perform(on: channel) { $0.connected() } }
    }

    /// The application stopped reading the subscription.
    private func end(_ channel: String, token: UInt64) {
        guard self.entries[channel]?.token == token else { return }
        let entry = self.entries.removeValue(forKey: channel)!
        var machine = entry.machine
        if machine.unsubscribe() == .unsubscribe { self.connection?.send(.unsubscribe(.init(channel: channel))) }
    }

    /// The gateway refused or ended the subscription: its stream ends with why.
    private func refused(_ channel: String, status: StatusCode, message: String) {
        guard var entry = self.entries[channel] else { return }
        if status == .unavailable {
            // The gateway is going away: subscribe again on the next connection.
            entry.machine.disconnected()
            self.entries[channel] = entry
            return
        }
        entry.machine.refused()
        self.entries[channel] = nil
        if status == .ok {
            entry.continuation.finish()
        } else {
            entry.continuation.finish(
                throwing: TetherError(code: .serverError, message: "subscription to \(channel) refused: \(message)", status: status)
            )
        }
    }

    /// Runs one event of a subscription's machine and carries out its action.
    private func perform(
        on channel: String,
        publication: Frame.Publication? = nil,
        _ event: (inout SubscriptionMachine) -> SubscriptionMachine.Action
    ) {
        guard var entry = self.entries[channel] else { return }
        let action = event(&entry.machine)
        switch action {
        case .none, .drop:
            break
        case .subscribe(let from):
            self.sendSubscribe(channel, from: from, entry: &entry)
        case .resubscribe(let from):
            self.sendSubscribe(channel, from: from, entry: &entry)
        case .unsubscribe:
            self.connection?.send(.unsubscribe(.init(channel: channel)))
        case .report(.subscribed(let recovered)):
            _ = entry.continuation.yield(.subscribed(recovered: recovered))
        case .report(.gap(let gap)):
            _ = entry.continuation.yield(.gap(gap))
        case .deliver:
            if let publication { Self.deliver(publication, to: &entry) }
        case .reportGapAndDeliver(let gap):
            _ = entry.continuation.yield(.gap(gap))
            if let publication { Self.deliver(publication, to: &entry) }
        }
        self.entries[channel] = entry
        self.resubscribeAfterOverflow(channel)
    }

    /// After the application's buffer was full: subscribes again from the last publication it
    /// took, when the channel's history has the rest or the members must be had afresh.
    private func resubscribeAfterOverflow(_ channel: String) {
        guard let entry = self.entries[channel] else { return }
        let recovers = entry.overflowed && entry.machine.recover && (entry.machine.position?.epoch ?? 0) != 0
        guard recovers || entry.presenceLost else { return }
        if recovers { self.entries[channel]!.overflowed = false }
        self.entries[channel]!.machine = SubscriptionMachine(
            recover: entry.machine.recover,
            position: recovers ? entry.enqueued : entry.machine.position
        )
        if self.connection != nil { self.perform(on: channel) { $0.connected() } }
    }

    private func sendSubscribe(_ channel: String, from position: ChannelPosition?, entry: inout Entry) {
        self.nextID += 1
        entry.pending = self.nextID
        entry.presenceLost = false  // its SUBSCRIBED brings the members afresh
        self.connection?.send(.subscribe(.init(id: self.nextID, channel: channel, recoverFrom: position, presenceEvents: entry.presence)))
    }

    private static func deliver(_ publication: Frame.Publication, to entry: inout Entry) {
        if entry.overflowed {
            // Without history: what the full buffer dropped is gone; say so before going on.
            let gap = ChannelGap(after: entry.enqueued ?? publication.position, resumesAt: publication.position)
            guard case .enqueued = entry.continuation.yield(.gap(gap)) else { return }
            entry.overflowed = false
        }
        let event = SubscriptionEvent.publication(
            ChannelPublication(
                channel: publication.channel,
                position: publication.position,
                publisher: publication.publisher,
                body: publication.body
            )
        )
        switch entry.continuation.yield(event) {
        case .enqueued: entry.enqueued = publication.position
        case .dropped: entry.overflowed = true
        case .terminated: break
        @unknown default: break
        }
    }

    /// Runs `body` on the loop: at once when called there, else queued (in order with the
    /// other calls queued there, such as the connection loop's ``attach(_:)``).
    private func onLoop(_ body: @escaping @Sendable (ClientChannels) -> Void) {
        if self.loop.inEventLoop {
            body(self)
        } else {
            self.loop.execute { body(self) }
        }
    }
}
