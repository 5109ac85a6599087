import NIOCore

/// The client's side of reliable deliveries (PROTOCOL.md, section 9.2): which DELIVERY is new,
/// a duplicate or past a gap; which one the application holds; how far it processed; what to
/// checkpoint durably and what to acknowledge.
///
/// A delivery counts as **processed** only when the application asks for the next one
/// (``next()``) or acknowledges it (``acknowledge(_:)``). When the application stops
/// consuming without either (``consumerStopped()``: its loop ended or threw), the delivery it
/// held goes back to the front of the inbox and is handed out again.
///
/// Acknowledgements follow the durable checkpoint, never run ahead of it: the gateway forgets
/// what it is told was processed, so the client tells it only once a restart could not lose
/// it. The same holds for HELLO's resume point (``resumePoint``), which the gateway treats as
/// an acknowledgement.
///
/// The machine performs no I/O. Its driver saves ``takeCheckpointToSave()`` and reports it
/// with ``checkpointSaved(_:)``, which says what to acknowledge on the current connection.
///
/// ```swift
/// var inbox = InboxMachine(checkpoint: snapshot.checkpoint)
/// _ = inbox.received(delivery, epoch: welcome.deliveryEpoch!)   // .accepted
/// let first = inbox.next()          // handed to the app
/// _ = inbox.next()                  // the app moved on: `first` is processed
/// if let checkpoint = inbox.takeCheckpointToSave() { save(checkpoint) }
/// ```
package struct InboxMachine: Sendable {
    /// What to do with an inbound DELIVERY.
    package enum Verdict: Sendable, Hashable {
        /// New: it waits in the inbox for the application.
        case accepted
        /// Already received: drop it.
        case duplicate
        /// A sequence was skipped (and the DELIVERY did not say another connection of the client
        /// id acknowledged it): a protocol error.
        case gap(expected: UInt64)
    }

    /// The delivery epoch the sequence numbers belong to; `nil` until one is known.
    package private(set) var epoch: UInt64?
    /// The highest sequence accepted (waiting, held by the application, or processed).
    package private(set) var lastReceived: UInt64
    /// The highest sequence the application is done with.
    package private(set) var processed: UInt64
    /// The highest processed sequence saved durably, in ``epoch``.
    package private(set) var saved: UInt64
    /// Accepted and not yet handed to the application, in order.
    private var waiting = CircularBuffer<Frame.Delivery>()
    /// The delivery the application holds, not yet processed.
    package private(set) var handedOut: Frame.Delivery?
    /// A checkpoint that changed since it was last taken for saving.
    private var dirty = false
    /// Whether a connection is attached, and what it acknowledged to the gateway so far
    /// (including its HELLO's resume point).
    private var connection: (epoch: UInt64, acknowledged: UInt64)?

    /// An inbox that starts from what was saved, if anything.
    package init(checkpoint: DeliveryCheckpoint?) {
        self.epoch = checkpoint?.epoch
        self.lastReceived = checkpoint?.lastSequence ?? 0
        self.processed = self.lastReceived
        self.saved = self.lastReceived
    }

    /// How many accepted deliveries wait for the application (not counting the one it holds).
    package var waitingCount: Int { self.waiting.count }

    /// What HELLO says about the deliveries: the epoch and the last sequence processed and
    /// saved; `nil` before any epoch is known. The gateway may forget everything up to it.
    package var resumePoint: Frame.Hello.Resume? {
        self.epoch.map { Frame.Hello.Resume(epoch: $0, lastSequence: self.saved) }
    }

    // MARK: Deliveries from the gateway

    /// A DELIVERY arrived on a connection whose WELCOME announced `epoch`.
    package mutating func received(_ delivery: Frame.Delivery, epoch: UInt64) -> Verdict {
        self.adopt(epoch)
        if delivery.sequence <= self.lastReceived { return .duplicate }
        // Those skipped were processed on another connection of the client id (PROTOCOL.md 9.2).
        guard delivery.sequence == self.lastReceived + 1 || delivery.afterAcknowledged else {
            return .gap(expected: self.lastReceived + 1)
        }
        self.lastReceived = delivery.sequence
        self.waiting.append(delivery)
        return .accepted
    }

    // MARK: The application

    /// The next delivery for the application, if one waits; the one handed out before, if
    /// any, is processed from now on.
    package mutating func next() -> Frame.Delivery? {
        self.markHandedOutProcessed()
        guard let next = self.waiting.popFirst() else { return nil }
        self.handedOut = next
        return next
    }

    /// The application says it processed the delivery with this sequence.
    /// - Returns: `false` if that delivery was not handed out (and is not processed already).
    package mutating func acknowledge(_ sequence: UInt64) -> Bool {
        if sequence <= self.processed { return true }
        guard self.handedOut?.sequence == sequence else { return false }
        self.markHandedOutProcessed()
        return true
    }

    /// The application stopped consuming (its loop ended, or threw): the delivery it held, not
    /// acknowledged, goes back to the front, to be handed out again.
    package mutating func consumerStopped() {
        guard let held = self.handedOut else { return }
        self.handedOut = nil
        self.waiting.prepend(held)
    }

    private mutating func markHandedOutProcessed() {
        guard let handedOut = self.handedOut else { return }
        self.handedOut = nil
        if handedOut.sequence > self.processed {
            self.processed = handedOut.sequence
            self.dirty = true
        }
    }

    // MARK: Checkpoints and acknowledgements

    /// Whether a checkpoint is due: it changed since it was last taken (what wakes the
    /// engine's maintenance to save it).
    package var checkpointDue: Bool { self.dirty && self.epoch != nil }

    /// The checkpoint to save now, if it changed since it was last taken.
    package mutating func takeCheckpointToSave() -> DeliveryCheckpoint? {
        guard self.dirty, let epoch = self.epoch else { return nil }
        self.dirty = false
        return DeliveryCheckpoint(epoch: epoch, lastSequence: self.processed)
    }

    /// A checkpoint taken with ``takeCheckpointToSave()`` is stored durably.
    /// - Returns: The sequence to acknowledge (DELIVERY_ACK) on the attached connection, if any.
    package mutating func checkpointSaved(_ checkpoint: DeliveryCheckpoint) -> UInt64? {
        guard checkpoint.epoch == self.epoch else { return nil }  // the epoch changed meanwhile
        self.saved = max(self.saved, checkpoint.lastSequence)
        return self.acknowledgementDue()
    }

    /// Saving a checkpoint failed: it will be taken again.
    package mutating func checkpointFailed() {
        self.dirty = true
    }

    /// A connection was established whose WELCOME announced `epoch` and whose HELLO carried
    /// `resume`.
    /// - Returns: The sequence to acknowledge on it at once, if the saved checkpoint is past
    ///   what its HELLO said.
    package mutating func attached(epoch: UInt64, resume: Frame.Hello.Resume?) -> UInt64? {
        self.adopt(epoch)
        let acknowledged = resume.flatMap { $0.epoch == epoch ? $0.lastSequence : nil } ?? 0
        self.connection = (epoch, acknowledged)
        return self.acknowledgementDue()
    }

    /// The connection closed.
    package mutating func detached() {
        self.connection = nil
    }

    private mutating func acknowledgementDue() -> UInt64? {
        guard let connection = self.connection, connection.epoch == self.epoch, self.saved > connection.acknowledged else {
            return nil
        }
        self.connection = (connection.epoch, self.saved)
        return self.saved
    }

    /// Switches to another gateway store, whose sequence numbers start again: what was
    /// received from the old one can no longer be acknowledged there, and is dropped.
    private mutating func adopt(_ epoch: UInt64) {
        guard self.epoch != epoch else { return }
        self.epoch = epoch
        self.lastReceived = 0
        self.processed = 0
        self.saved = 0
        self.waiting.removeAll()
        self.handedOut = nil
        self.dirty = true
    }
}
