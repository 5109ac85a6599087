import TetherCore

/// The connection's side of the engine. ``sent(_:)``, ``acknowledged(_:)`` and
/// ``ReliableEngine/receive(_:epoch:)`` run on the event loop, where the connection handler
/// calls them; the connection's task attaches and detaches it through commands.
extension ReliableEngine {
    /// A connection with reliable delivery was established: it gets every unacknowledged
    /// message, and the acknowledgement of deliveries checkpointed before it was there.
    /// - Parameters:
    ///   - sink: The connection.
    ///   - deliveryEpoch: The delivery epoch its WELCOME announced.
    ///   - resume: The resume point its HELLO carried.
    func attach(_ sink: any ReliableSink, deliveryEpoch: UInt64, resume: Frame.Hello.Resume?) {
        self.submit(.attach(sink, deliveryEpoch: deliveryEpoch, resume: resume))
    }

    /// The connection closed.
    func detach(_ sink: any ReliableSink) {
        self.submit(.detach(sink))
    }

    /// The client stopped: consumers end, senders waiting for room fail, maintenance flushes and ends.
    func finish() {
        self.submit(.finish)
    }

    /// What HELLO says about this client: its outbox epoch, and where its deliveries stand.
    func helloFields() async throws(TetherError) -> HelloFields {
        try await self.loadIfNeeded()
        return await withUnsafeContinuation { self.submit(.helloFields($0)) }
    }

    // MARK: On the event loop

    func attached(_ sink: any ReliableSink, deliveryEpoch: UInt64, resume: Frame.Hello.Resume?) {
        let (records, acknowledge) = self.state.withValue { state in
            state.sink = sink
            // DELIVERYs can arrive, and the app process them, before the connection is attached:
            // their checkpoint may be saved already, with no connection to acknowledge it on.
            // Acknowledge it now, or the gateway, its window full, would wait for this forever.
            let acknowledge = state.inbox.attached(epoch: deliveryEpoch, resume: resume)
            return (state.outbox?.unacknowledged ?? [], acknowledge)
        }
        self.publishInbox()
        if let acknowledge { sink.acknowledgeDeliveries(upTo: acknowledge) }
        sink.enqueue(records)
        self.storageWorkDue()  // a checkpoint of a new epoch may be due
    }

    func detached(_ sink: any ReliableSink) {
        self.state.withValue { state in
            guard state.sink === sink else { return }
            state.sink = nil
            state.inbox.detached()
        }
    }

    /// Messages were sent for the first time on a connection.
    func sent(_ ids: [UInt64]) {
        let firsts = self.state.withValue { $0.outbox?.sent(ids) ?? [] }
        for record in firsts { self.events.yield(MessageEvent(record, .sent)) }
    }

    /// The gateway acknowledged messages.
    func acknowledged(_ entries: [Frame.MessageAck.Entry]) {
        let (finished, depth) = self.state.withValue { state in
            let finished = (state.outbox?.acknowledged(entries) ?? []).map { record, outcome in
                (record, outcome, state.outcomeWaiters.removeValue(forKey: record.id) ?? [])
            }
            return (finished, state.outbox?.depth ?? 0)
        }
        self.report(finished, depth: depth)
        self.admitWaitingSends()
        self.startCommitIfDue()
        self.storageWorkDue()
    }

    func finished() {
        let (consumer, waiting, timer) = self.state.withValue { state in
            state.finished = true
            defer {
                state.consumer = nil
                state.waitingForRoom.removeAll()
                state.expiryTimer = nil
            }
            return (state.consumer, Array(state.waitingForRoom), state.expiryTimer?.callback)
        }
        consumer?.resume(returning: .success(nil))
        let shutDown = TetherError(code: .shutdown, message: "the client is shut down")
        for (_, ticket) in waiting { ticket.resume(.failed(shutDown)) }
        timer?.cancel()
        self.storageWork.continuation.finish()
    }
}
