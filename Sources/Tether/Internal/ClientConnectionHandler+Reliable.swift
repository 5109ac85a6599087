import NIOCore
import TetherCore
import TetherNIO

/// What the client's reliable engine hears from a connection.
struct ReliableCallbacks: Sendable {
    var acknowledged: @Sendable ([Frame.MessageAck.Entry]) -> Void
    var sent: @Sendable ([UInt64]) -> Void
    /// A DELIVERY arrived on a connection whose WELCOME announced this delivery epoch.
    var delivery: @Sendable (Frame.Delivery, _ epoch: UInt64) -> DeliveryVerdict
}

/// Reliable messaging on one connection: what to send, what is in flight, when to send again.
struct ReliableConnectionState {
    var scheduler: MessageScheduler
    var retransmission: RTTEstimator
    /// When each message in flight is sent again, served by one timer (`timer`).
    var deadlines = DeadlineQueue<UInt64, NIODeadline>()
    var timer = DeadlineTimer()
    var pumping = false
}

extension ClientConnectionHandler {
    // MARK: Called by the client, on the event loop

    /// Queues messages to send on this connection.
    func enqueueMessages(_ records: [OutboxRecord]) {
        guard self.reliable != nil, let context = self.context else { return }
        self.reliable!.scheduler.enqueue(records)
        self.pumpMessages(context: context)
    }

    /// A message expired: its tombstone replaces it.
    func replaceMessage(with tombstone: OutboxRecord) {
        self.reliable?.scheduler.replace(with: tombstone)
    }

    /// Tells the gateway that every delivery up to `sequence` was processed.
    func acknowledgeDeliveries(upTo sequence: UInt64) {
        guard let context, self.session.negotiated != nil else { return }
        self.send(.deliveryAck(.init(sequence: sequence)), context: context)
    }

    // MARK: Sending

    /// Sends messages while the window and the channel's buffer allow: messages never pile up
    /// in the channel, so PINGs, CANCELs and acknowledgements are not stuck behind them.
    func pumpMessages(context: ChannelHandlerContext) {
        // Writing can fire a writability change that lands here again: one pump at a time.
        guard self.reliable != nil, !self.reliable!.pumping, self.session.acceptsRequests else { return }
        self.reliable!.pumping = true
        defer { self.reliable?.pumping = false }
        let now = context.eventLoop.now
        let nowMilliseconds = WallClock.milliseconds()
        var firstTransmissions: [UInt64] = []
        var wrote = false
        while context.channel.isWritable, let record = self.reliable!.scheduler.next(now: now) {
            let transmissions = self.reliable!.scheduler.inFlight[record.id]?.transmissions ?? 1
            if transmissions == 1 { firstTransmissions.append(record.id) }
            let message = Frame.Message(
                id: record.id,
                topic: record.topic,
                conversation: record.conversation,
                sequence: record.sequence,
                ttl: record.expired ? nil : record.expiresAt.map { .milliseconds(max(1, $0 - nowMilliseconds)) },
                expired: record.expired,
                body: record.expired ? ByteBuffer() : record.body
            )
            self.write(.message(message), context: context)
            wrote = true
            let timeout = self.reliable!.retransmission.retransmissionTimeout(afterRetransmissions: transmissions - 1)
            self.reliable!.deadlines.insert(record.id, deadline: now + TimeAmount(timeout))
        }
        if wrote {
            context.flush()
            self.heartbeat?.frameSent(at: now)
            self.armRetransmissionTimer(context: context)
        }
        if !firstTransmissions.isEmpty { self.callbacks.reliable?.sent(firstTransmissions) }
    }

    /// Makes the retransmission timer fire at the earliest deadline of the messages in flight.
    private func armRetransmissionTimer(context: ChannelHandlerContext) {
        guard self.reliable != nil else { return }
        guard self.reliable!.timer.needsArming(at: self.reliable!.deadlines.earliest) else { return }
        self.reliable!.timer.arm(at: self.reliable!.deadlines.earliest, on: context.eventLoop) {
            guard self.reliable != nil, let context = self.context else { return }
            self.reliable!.timer.fired()
            for id in self.reliable!.deadlines.popExpired(at: context.eventLoop.now) {
                self.reliable!.scheduler.timedOut(id)
            }
            self.pumpMessages(context: context)
            self.armRetransmissionTimer(context: context)
        }
    }

    // MARK: Receiving

    func messagesAcknowledged(_ ack: Frame.MessageAck, context: ChannelHandlerContext) {
        let now = context.eventLoop.now
        for entry in ack.entries {
            guard let (_, sample) = self.reliable?.scheduler.acknowledged(entry.id, now: now) else { continue }
            self.reliable?.deadlines.remove(entry.id)
            if let sample { self.reliable?.retransmission.record(sample: Duration(sample)) }
        }
        self.callbacks.reliable?.acknowledged(ack.entries)
        self.pumpMessages(context: context)
    }

    func deliveryReceived(_ delivery: Frame.Delivery, context: ChannelHandlerContext) {
        guard let epoch = self.session.negotiated?.deliveryEpoch, let verdict = self.callbacks.reliable?.delivery(delivery, epoch) else {
            return
        }
        if case .gap(let expected) = verdict {
            self.logger.warning("the gateway skipped a delivery", metadata: ["expected": "\(expected)", "got": "\(delivery.sequence)"])
            self.sendErrorAndClose(
                ProtocolError(code: .protocolError, message: "delivery \(delivery.sequence) skips \(expected)"),
                context: context
            )
        }
    }

    func stopReliable() {
        self.reliable?.timer.cancel()
        self.reliable = nil
    }
}
