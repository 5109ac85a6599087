import Logging
import NIOCore
import TetherCore
import Tracing

/// Runs one batch of a connection's reliable messages through its outbox's lane: holds the
/// lane, and performs what the ``ReliableLaneMachine`` asks for — the store's reads, the
/// handlers, the commit — and nothing else.
///
/// It runs in a task of the connection, which the connection's timer cancels when a handler
/// runs past the handler time limit: the running handler ends (its message is not taken now),
/// so do the batch's later handlers, and what was processed before is still committed: the
/// commit runs in a task of its own, which nothing cancels (PROTOCOL.md, section 9.1: a batch
/// whose handlers ran is committed, even if the connection closed meanwhile).
struct LaneDriver: Sendable {
    let lane: ReliableLanes.Lane
    let reliable: ReliableServices
    let router: Router
    let pushes: Pusher
    let connection: ConnectionInfo
    let clock: any TetherClock
    let executor: (any TaskExecutor)?
    /// The gateway's logger; ``logger`` adds the connection's id when something is logged (a
    /// batch makes no copy of it otherwise).
    let baseLogger: Logger
    let connectionID: UInt64
    let handle: ConnectionHandle
    /// The connection's time-limit token for this batch's handlers.
    let timeLimit: UInt64
    /// Where message spans go; `nil`: no tracing.
    let tracer: (any Tracer)?

    /// The logger of the batch's connection.
    var logger: Logger {
        var logger = self.baseLogger
        logger[metadataKey: "tether.connection"] = "\(self.connectionID)"
        return logger
    }

    /// Processes `batch` in order.
    /// - Parameter answers: Whether the client takes `unavailable` answers.
    /// - Returns: The acknowledgements to send, and the deliveries stored.
    func process(_ batch: [ReliableLaneMachine.Received], answers: Bool) async -> ReliableLaneMachine.Done {
        await self.lane.turn.acquire()
        defer { self.lane.turn.release() }
        let sender = self.lane.machine.configuration.outbox.client
        let done = await self.run(batch, answers: answers, sender: sender)
        // What the batch stored counts against the store-wide quota and its sender's.
        let stored = done.stored.values.joined()
        self.reliable.quotas.stored(
            by: sender,
            deliveries: stored.count,
            bytes: stored.reduce(0) { $0 + $1.body.readableBytes },
            now: self.clock.now
        )
        return done
    }

    /// The batch's steps, with the lane's turn held.
    private func run(_ batch: [ReliableLaneMachine.Received], answers: Bool, sender: String) async -> ReliableLaneMachine.Done {
        var step = self.lane.machine.begin(
            batch,
            answers: answers,
            now: self.clock.now,
            allowances: self.reliable.quotas.allowances(for: sender, now: self.clock.now)
        )
        var compressor = DeliveryCompressor(self.reliable.compression)
        while true {
            switch step {
            case .load(let query):
                if let cluster = self.reliable.cluster, self.lane.fence == nil {
                    do {
                        self.lane.fence = try await cluster.claimLane(self.lane.machine.configuration.outbox)
                    } catch {
                        self.logger.warning("cannot claim the outbox's lane in the cluster", metadata: ["error": "\(error)"])
                        step = self.lane.machine.loadFailed()
                        continue
                    }
                }
                do {
                    let state = try await self.reliable.store.dedupState(
                        of: self.lane.machine.configuration.outbox,
                        conversations: query.conversations,
                        outcomes: query.outcomes
                    )
                    step = self.lane.machine.loaded(state)
                } catch {
                    self.logger.error("cannot read the message store", metadata: ["error": "\(error)"])
                    step = self.lane.machine.loadFailed()
                }
            case .run(let message):
                var outcome = await self.run(message)
                if case .processed(let status, let deliveries) = outcome, !deliveries.isEmpty {
                    // Stored (and counted against the quotas) compressed where it is worth it.
                    outcome = .processed(status, deliveries: compressor.compress(deliveries))
                }
                step = self.lane.machine.handled(outcome)
            case .loadUsage(let recipients):
                do {
                    step = self.lane.machine.usageLoaded(try await self.reliable.store.usage(of: recipients))
                } catch {
                    self.logger.error("cannot read the message store", metadata: ["error": "\(error)"])
                    step = self.lane.machine.usageFailed()
                }
            case .commit(var write):
                write.fence = self.lane.fence
                // In a task of its own: the time limit's cancellation of this one must not stop it.
                let writer = self.reliable.writer
                let committed = await Task(executorPreference: self.executor) { () async -> Result<[DeliveryReceipt], MessageStoreError> in
                    do {
                        return .success(try await writer.commit(write))
                    } catch {
                        return .failure(error as? MessageStoreError ?? MessageStoreError(code: .storage, message: "\(error)"))
                    }
                }.value
                switch committed {
                case .success(let receipts):
                    return self.lane.machine.committed(receipts)
                case .failure(let error):
                    if error.code == .fenced { self.lane.fence = nil }  // claimed again by the next batch
                    // A conflict (another gateway processed these messages meanwhile) or a
                    // storage failure: nothing was written; the client sends the messages again.
                    self.logger.warning("could not commit reliable messages", metadata: ["error": "\(error)"])
                    return self.lane.machine.commitFailed()
                }
            case .done(let done):
                return done
            }
        }
    }

    /// Runs the handler of one message, under the handler time limit.
    private func run(_ message: Frame.Message) async -> ReliableLaneMachine.HandlerOutcome {
        guard self.router.permits(.send(topic: message.topic), self.connection) else {
            return .processed(.permissionDenied, deliveries: [])  // a final refusal, recorded like a handler's
        }
        guard let handler = self.router.messageHandler(message.topic) else {
            return .processed(.unknownMethod, deliveries: [])
        }
        if Task.isCancelled { return .transient }  // an earlier handler of the batch ran past its limit
        return await GatewayServices.traced(message, by: self.tracer) { await self.runHandler(handler, message) }
    }

    /// Runs the handler of one message (permitted, routed) under the handler time limit.
    private func runHandler(
        _ handler: @escaping Gateway.MessageHandler,
        _ message: Frame.Message
    ) async -> ReliableLaneMachine.HandlerOutcome {
        let context = MessageContext(
            connection: self.connection,
            base: self.baseLogger,
            connectionID: self.connectionID,
            message: message,
            pushes: self.pushes
        )
        let reliableMessage = ReliableMessage(
            outbox: self.lane.machine.configuration.outbox,
            id: message.id,
            topic: message.topic,
            conversation: message.conversation,
            sequence: message.sequence,
            body: message.body
        )
        let token = self.timeLimit
        await self.handle.onLoop(passing: token) { $0.armTimeLimit($1) }
        let outcome: Result<Void, any Error>
        do {
            try await handler(reliableMessage, context)
            outcome = .success(())
        } catch {
            outcome = .failure(error)
        }
        let timedOut = await self.handle.onLoop(passing: token) { $0.disarmTimeLimit($1) } ?? true
        if timedOut {
            context.logger.error("message handler ran past the handler time limit; the client will send the message again")
            return .transient
        }
        switch outcome {
        case .success:
            return .processed(.ok, deliveries: context.staged)
        case .failure(let error as RequestError) where error.status == .unavailable:
            // "Not now": a transient failure, not an outcome to record.
            context.logger.info("message handler answered unavailable; the client will send the message again")
            return .transient
        case .failure(let error as RequestError):
            return .processed(error.status == .ok ? .internalError : error.status, deliveries: [])
        case .failure(let error):
            context.logger.error("message handler failed; the client will send the message again", metadata: ["error": "\(error)"])
            return .transient
        }
    }
}
