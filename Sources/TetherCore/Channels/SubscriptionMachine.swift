/// The client's side of one channel subscription: when to subscribe and from which position,
/// which publication is new, a duplicate or past a gap, and what to tell the application —
/// across any number of connections. No I/O; one action per event.
///
/// The subscription lives until the application ends it: while there is no connection it
/// waits; on each connection it subscribes from its last position (with recovery) or from the
/// top; the gateway answers with where the publications it sends next start and, when its
/// history no longer reaches back, the ``ChannelGap``; publications then arrive in offset
/// order. A publication that does not follow the last one (the gateway skipped some, or its
/// stream's epoch changed) is not delivered: the machine subscribes again from its position,
/// so that the history fills the hole or names the gap. If the publications that follow that
/// resubscription skip again from the same position, the gateway cannot fill the hole: the
/// machine reports the gap and delivers, rather than subscribing again and again.
///
/// ```swift
/// var subscription = SubscriptionMachine(recover: true)
/// subscription.connected()                                  // .subscribe(from: nil)
/// subscription.subscribed(startingAfter: top, gap: nil)     // .report(.subscribed(recovered: true))
/// subscription.received(ChannelPosition(epoch: e, offset: top.offset + 1))   // .deliver
/// ```
package struct SubscriptionMachine: Sendable, Hashable {
    package enum State: Sendable, Hashable {
        /// No connection: subscribes when one is up. `position`: the last one delivered.
        case waiting(position: ChannelPosition?)
        /// SUBSCRIBE sent on the current connection, not answered yet.
        case subscribing(position: ChannelPosition?)
        /// Publications after `position` are delivered as they come.
        case subscribed(position: ChannelPosition)
        /// Ended by the application, or refused by the gateway: nothing more happens.
        case ended
    }

    /// What the application hears of its subscription.
    package enum Report: Sendable, Hashable {
        /// Subscribed on a connection; `recovered`: nothing missed since the last position is
        /// lost (always true on a first subscription).
        case subscribed(recovered: Bool)
        /// Publications were missed and cannot be had; the ones after it follow.
        case gap(ChannelGap)
    }

    package enum Action: Sendable, Hashable {
        case none
        /// Send SUBSCRIBE on the current connection, with recovery from `position` when given.
        case subscribe(from: ChannelPosition?)
        /// Send UNSUBSCRIBE on the current connection.
        case unsubscribe
        /// Hand the publication to the application.
        case deliver
        /// Drop the publication: already delivered, or not subscribed.
        case drop
        /// Tell the application.
        case report(Report)
        /// Drop the publication and send SUBSCRIBE again from `position`: it did not follow.
        case resubscribe(from: ChannelPosition)
        /// Tell the application of the gap, then hand it the publication: it did not follow,
        /// again, after a resubscription from the same position.
        case reportGapAndDeliver(ChannelGap)
    }

    package private(set) var state: State
    /// Whether to subscribe from the last position (recovering what was missed) rather than
    /// from the top.
    package let recover: Bool
    /// The position the last resubscription was sent from, until a publication follows it in
    /// order or the connection goes down.
    private var resubscribedFrom: ChannelPosition?

    /// A subscription with no connection yet.
    /// - Parameters:
    ///   - recover: Recover what was missed while away.
    ///   - position: Where it stands already (a position the app saved), if anywhere.
    package init(recover: Bool, position: ChannelPosition? = nil) {
        self.recover = recover
        self.state = .waiting(position: position)
    }

    /// The last position delivered, if any.
    package var position: ChannelPosition? {
        switch self.state {
        case .waiting(let position), .subscribing(let position): position
        case .subscribed(let position): position
        case .ended: nil
        }
    }

    /// A connection is up: subscribe on it (also when subscribed already: a connection came up
    /// without the last one going down first).
    package mutating func connected() -> Action {
        guard self.state != .ended else { return .none }
        let position = self.position
        self.state = .subscribing(position: position)
        return .subscribe(from: self.recoveryPoint(position))
    }

    /// Where to recover from: the position, unless recovery is off or the channel has no
    /// history (epoch 0), where there is nothing to recover from.
    private func recoveryPoint(_ position: ChannelPosition?) -> ChannelPosition? {
        guard self.recover, let position, position.epoch != 0 else { return nil }
        return position
    }

    /// The connection went down.
    package mutating func disconnected() {
        self.resubscribedFrom = nil
        guard self.state != .ended else { return }
        self.state = .waiting(position: self.position)
    }

    /// The gateway accepted the subscription.
    /// - Parameters:
    ///   - startingAfter: The position the publications it sends next follow.
    ///   - gap: What was missed and is gone, when its history did not reach back.
    package mutating func subscribed(startingAfter: ChannelPosition, gap: ChannelGap?) -> Action {
        guard case .subscribing(let position) = self.state else { return .none }
        if startingAfter.epoch == 0 {
            // A channel without history: publications are delivered as they come; one that was
            // subscribed before may have missed some, and cannot know how many.
            self.state = .subscribed(position: startingAfter)
            return .report(.subscribed(recovered: position == nil))
        }
        if let gap {
            self.state = .subscribed(position: startingAfter)
            return .report(.gap(gap))
        }
        guard let position else {
            self.state = .subscribed(position: startingAfter)
            return .report(.subscribed(recovered: true))
        }
        if position.epoch == startingAfter.epoch, startingAfter.offset <= position.offset {
            // What it sends from there up to the position was delivered already: dropped.
            self.state = .subscribed(position: position)
            return .report(.subscribed(recovered: true))
        }
        // It starts past the position and names no gap: subscribed from the top without
        // recovery (skipped on purpose), or a gateway that could not tell (a gap all the same).
        self.state = .subscribed(position: startingAfter)
        guard self.recover else { return .report(.subscribed(recovered: false)) }
        let resumesAt = ChannelPosition(epoch: startingAfter.epoch, offset: startingAfter.offset + 1)
        return .report(.gap(ChannelGap(after: position, resumesAt: resumesAt)))
    }

    /// A publication arrived at `position`.
    package mutating func received(_ position: ChannelPosition) -> Action {
        guard case .subscribed(let last) = self.state else { return .drop }
        if last.epoch == 0, position.epoch == 0 { return .deliver }  // no history, no positions
        if position.epoch == last.epoch {
            if position.offset <= last.offset { return .drop }
            if position.offset == last.offset + 1 {
                self.state = .subscribed(position: position)
                self.resubscribedFrom = nil
                return .deliver
            }
        }
        // It does not follow.
        guard self.resubscribedFrom != last else {
            self.state = .subscribed(position: position)
            self.resubscribedFrom = nil
            return .reportGapAndDeliver(ChannelGap(after: last, resumesAt: position))
        }
        self.resubscribedFrom = last
        self.state = .subscribing(position: last)
        return .resubscribe(from: last)
    }

    /// The gateway refused the subscription, or ended it for good.
    package mutating func refused() {
        self.state = .ended
    }

    /// The application ends the subscription.
    /// - Returns: `.unsubscribe` when the gateway knows of it.
    package mutating func unsubscribe() -> Action {
        switch self.state {
        case .subscribing, .subscribed:
            self.state = .ended
            return .unsubscribe
        case .waiting:
            self.state = .ended
            return .none
        case .ended:
            return .none
        }
    }
}
