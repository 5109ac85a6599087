import NIOCore
import TetherCompression
import TetherCore

extension GatewayConnectionHandler {
    /// Hands a batch of the client's reliable messages to its outbox's lane, in a task that
    /// holds the handler time limit for each handler it runs.
    func startBatch(_ batch: [ReliableLaneMachine.Received]) {
        guard let lane = self.lane, let reliable = self.services.reliable, let scope = self.scope else { return }
        let answers = self.machine.reliableAnswers
        let token = self.machine.newTimeLimit()
        let driver = LaneDriver(
            lane: lane.lane,
            reliable: reliable,
            router: self.services.router,
            pushes: self.services.pushes,
            connection: scope.connection,
            clock: self.services.clock,
            executor: self.executor,
            baseLogger: self.baseLogger,
            connectionID: self.id,
            handle: self.handle,
            timeLimit: token,
            tracer: self.services.tracer
        )
        self.machine.taskStarted()
        let size = (messages: batch.count, since: batch.first?.receivedAt ?? self.services.clock.now)
        self.limitedTasks[token] = self.spawn {
            let done = await driver.process(batch, answers: answers)
            driver.handle.execute(passing: (done, token, size)) { $0.batchFinished($1.0, timeLimit: $1.1, size: $1.2) }
        }
    }

    /// The lane finished a batch (committed or not): answer, hand its deliveries to their
    /// recipients' pumps, start the next batch.
    /// - Parameter size: How many messages the batch had, and when the first of them was read.
    private func batchFinished(_ done: ReliableLaneMachine.Done, timeLimit token: UInt64, size: (messages: Int, since: TetherInstant)) {
        defer { self.taskEnded() }
        self.limitedTasks[token] = nil
        self.machine.endTimeLimit(token)
        for note in done.notes { self.log(note) }
        // Committed: whether this connection is still open or not, the recipients get them.
        if !done.stored.isEmpty { self.services.registry.offer(done.stored) }
        if !done.acks.isEmpty {
            // Not awaited: what is acknowledged is committed; a lost ACK makes the client send again.
            self.pushes?.drain()
            self.write(.messageAck(.init(entries: done.acks)))
            self.flushSoon()
        }
        let now = self.services.clock.now
        self.services.metrics.batch(done.tally, messages: size.messages, nanoseconds: (now - size.since).nanoseconds)
        if let next = self.machine.batchEnded(now: now) { self.startBatch(next) }
        self.resumeReading()
        self.armTimer(now: now)
    }

    private func log(_ note: ReliableLaneMachine.Note) {
        switch note {
        case .conflict(let conversation, let sequence, let message, let earlier):
            self.services.refusalLog.log(
                self.logger,
                .warning,
                "refusing a message whose sequence another message already had",
                metadata: ["conversation": "\(conversation)", "sequence": "\(sequence)", "message": "\(message)", "earlier": "\(earlier)"]
            )
        case .quotaExceeded(let reason):
            self.services.metrics.refused("store_quota")
            self.services.refusalLog.log(self.logger, .warning, "a recipient's store quota is full", metadata: ["reason": "\(reason)"])
        case .storeUnavailable:
            self.services.refusalLog.log(self.logger, .error, "the message store is unavailable; the client will send its messages again")
        }
    }

    // MARK: The delivery pump

    /// Deliveries were committed for this connection's client.
    func deliveriesOffered(_ deliveries: [StoredDelivery]) {
        guard let actions = self.machine.deliveriesOffered(deliveries) else { return }
        self.pump(actions)
    }

    /// Another node of the cluster appended deliveries for this connection's client.
    func deliveriesAppendedElsewhere() {
        guard let actions = self.machine.deliveriesAppendedElsewhere() else { return }
        self.pump(actions)
    }

    /// Writes a stored delivery: a compressed payload as it is (COMPRESSED) to a client that
    /// negotiated compression, inflated for one that did not.
    /// - Parameter afterAcknowledged: It follows deliveries acknowledged on another connection
    ///   of the client id (ACKED_ELSEWHERE).
    /// - Returns: `false` if a compressed payload cannot be inflated (the store holds what the
    ///   gateway never wrote): the connection is then closed, as on any failure of the store.
    func write(_ delivery: StoredDelivery, afterAcknowledged: Bool = false) -> Bool {
        let frame = Frame.Delivery(
            sequence: delivery.sequence,
            topic: delivery.topic,
            body: delivery.body,
            afterAcknowledged: afterAcknowledged
        )
        guard delivery.compressed else {
            self.write(.delivery(frame))
            return true
        }
        if self.io.compression != nil {
            self.write(.delivery(frame), flags: self.machine.outboundFlags.union(.compressed))
            return true
        }
        do {
            if self.deliveryInflater == nil { self.deliveryInflater = try PayloadInflater() }
            let limit = self.machine.peerMaxBodySize ?? FrameHeader.absoluteMaximumBodySize
            let body = try self.deliveryInflater!.inflate(delivery.body, limit: limit, of: .delivery)
            self.write(
                .delivery(.init(sequence: delivery.sequence, topic: delivery.topic, body: body, afterAcknowledged: afterAcknowledged))
            )
            return true
        } catch {
            self.logger.error("a stored delivery cannot be inflated", metadata: ["sequence": "\(delivery.sequence)", "error": "\(error)"])
            self.closeNow()
            return false
        }
    }

    /// Carries out what the delivery pump decided: reads, sends, acknowledgement writes.
    func pump(_ actions: DeliveryPump.Actions) {
        if !actions.send.isEmpty {
            self.services.metrics.deliveriesSent.increment(by: actions.send.count)
            self.pushes?.drain()
            for (index, delivery) in actions.send.enumerated()
            where self.write(delivery, afterAcknowledged: index == 0 && actions.afterAcknowledged) == false {
                return  // a stored payload that cannot be inflated: the connection is closing
            }
            self.flushSoon()
        }
        guard let reliable = self.services.reliable, let recipient = self.scope?.connection.clientID else { return }
        let handle = self.handle
        if let fetch = actions.fetch {
            self.machine.taskStarted()
            self.spawn {
                let result = await Result { try await reliable.store.deliveries(for: recipient, after: fetch.after, limit: fetch.limit) }
                handle.execute(passing: (result, fetch.limit)) { $0.fetched($1.0, limit: $1.1) }
            }
        }
        if actions.newlyAcknowledged > 0 { self.services.metrics.deliveriesAcknowledged.increment(by: actions.newlyAcknowledged) }
        if let upTo = actions.record {
            self.machine.taskStarted()
            self.spawn {
                let result = await Result { try await reliable.writer.commit(StoreWrite(acknowledgements: [recipient: upTo])) }
                handle.execute(passing: result) { $0.recorded($1) }
            }
        }
    }

    private func fetched(_ result: Result<[StoredDelivery], any Error>, limit: Int) {
        defer { self.taskEnded() }
        switch result {
        case .success(let deliveries):
            if let actions = self.machine.deliveriesFetched(deliveries, limit: limit) { self.pump(actions) }
        case .failure(let error):
            self.logger.error("cannot read deliveries; retrying", metadata: ["error": "\(error)"])
            let now = self.services.clock.now
            self.machine.deliveriesFetchFailed(now: now)
            self.armTimer(now: now)
        }
    }

    private func recorded(_ result: Result<[DeliveryReceipt], any Error>) {
        defer { self.taskEnded() }
        if case .failure(let error) = result {
            // The client's next acknowledgement (or its next connection's resume point) records it.
            self.logger.error("cannot record a delivery acknowledgement", metadata: ["error": "\(error)"])
        }
        if let actions = self.machine.acknowledgementRecorded(result.isSuccess) { self.pump(actions) }
    }

    // MARK: Time limits, for the lane driver

    /// A handler of the batch with `token` starts: it has the handler time limit from now.
    func armTimeLimit(_ token: UInt64) {
        let now = self.services.clock.now
        self.machine.armTimeLimit(token, now: now)
        self.armTimer(now: now)
    }

    /// The handler ended.
    /// - Returns: Whether it ran past its limit (its task was cancelled).
    func disarmTimeLimit(_ token: UInt64) -> Bool {
        self.machine.disarmTimeLimit(token)
    }
}

extension Result {
    fileprivate var isSuccess: Bool {
        if case .success = self { return true }
        return false
    }
}
