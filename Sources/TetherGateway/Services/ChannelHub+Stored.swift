import NIOCore
import TetherCore

/// Channels whose history is in the gateway's store (a rule's `storage: .store`): where a
/// subscription's recovery starts, its pages read from the store, and the publications the
/// store appended sent in its order (see ``ChannelWriter``).
extension ChannelHub {
    /// Where the recovery of a subscription to a channel whose history is in the store starts:
    /// `nil` if it has nothing to recover (it goes live at once).
    static func storedRecovery(
        from request: Frame.Subscribe,
        head: ChannelStreamHead,
        channel: inout Channel,
        subscribed: inout Frame.Subscribed,
        generation: UInt64
    ) -> Continuation? {
        // The node may have sent publications the store appended after it answered (a later
        // top), or not yet those it answered with: they are on their way (``sendStored(_:)``),
        // and go to every live subscriber, this one too once it is. So what this node sent
        // stays as it is: raising it to the store's top made `sendStored` skip them, and the
        // subscribers live already never got them (seed 4412 of the nemesis: the last
        // publication of a channel lost to two subscribers after a gateway restart).
        if channel.stream?.epoch != head.epoch {
            channel.stream = head.position
        }
        let top = channel.stream!.offset
        subscribed.epoch = head.epoch
        guard let position = request.recoverFrom else {
            subscribed.startingAfter = top
            return nil
        }
        // Measured against the store's head: in a cluster what this node sent follows its tail
        // of the shared stream and can lag it (a node just started, PostgreSQL away); a
        // subscriber between the two missed nothing (seed 4421 of the nemesis: 542 subscribers
        // told of a gap they did not have and sent what they had again).
        let (first, gap) = ChannelGap.resuming(
            position,
            epoch: head.epoch,
            top: max(top, head.top),
            available: head.oldest ?? head.top + 1
        )
        subscribed.gap = gap != nil
        subscribed.startingAfter = first - 1
        guard first <= top else { return nil }
        return Continuation(
            channel: request.channel,
            after: ChannelPosition(epoch: head.epoch, offset: first - 1),
            generation: generation,
            fromStore: true
        )
    }

    /// The next page of a recovery from the store, made of what the store read after the
    /// continuation's position (`nil`: the stream of that epoch is gone); `nil` if the
    /// subscription it was for is gone or replaced. The page that reaches the top this node
    /// sent makes the subscriber live.
    func continueRecovery(connection id: UInt64, _ continuation: Continuation, read: [StoredPublication]?) -> Page? {
        self.state.withLockedValue { state -> Page? in
            guard let subscriber = state.channels[continuation.channel]?.subscribers[id],
                subscriber.generation == continuation.generation, !subscriber.live,
                let stream = state.channels[continuation.channel]?.stream
            else { return nil }
            // Only what this node sent already: what follows comes live. What the store
            // trimmed meanwhile makes an offset that does not follow, and the subscriber
            // subscribes again from its position (to be told of the gap); so does one whose
            // stream was lost (another epoch).
            let sent = stream.epoch == continuation.after.epoch ? (read ?? []).filter { $0.offset <= stream.offset } : []
            let publications = Self.capped(sent) { $0.body.readableBytes }.0.map {
                Frame.Publication(
                    channel: continuation.channel,
                    position: ChannelPosition(epoch: stream.epoch, offset: $0.offset),
                    publisher: $0.publisher,
                    body: $0.body
                )
            }
            var page = Page(publications: publications)
            if let last = publications.last, last.position.offset < stream.offset {
                page.next = Continuation(
                    channel: continuation.channel,
                    after: last.position,
                    generation: continuation.generation,
                    fromStore: true
                )
            } else {
                state.channels[continuation.channel]!.subscribers[id]!.live = true
                state.channels[continuation.channel]!.recipients = nil
                page.liveAfter = state.channels[continuation.channel]!.sequence
            }
            return page
        }
    }

    /// Sends publications the store appended, in the order it appended them: each gets its
    /// sequence on this node and the live subscribers of its channel. One the node sent
    /// already (a subscription read the store's head after it was appended) is left out (`nil`).
    func sendStored(_ publications: [Frame.Publication]) -> [(sequence: UInt64, recipients: [ConnectionRegistry.LoopRecipients])?] {
        self.state.withLockedValue { state in
            publications.map { publication in
                // A channel nobody here subscribes to has nothing to send: its stream is read
                // from the store when someone does.
                guard var entry = state.channels.removeValue(forKey: publication.channel) else { return nil }
                defer { state.channels[publication.channel] = entry }
                if let stream = entry.stream, stream.epoch == publication.position.epoch, stream.offset >= publication.position.offset {
                    return nil
                }
                entry.stream = publication.position
                entry.sequence += 1
                if entry.recipients == nil { entry.recipients = Self.group(entry.subscribers.values) }
                return (entry.sequence, entry.recipients!)
            }
        }
    }
}
