import Logging
import NIOCore
import TetherCore

extension Gateway {
    /// What a completed handshake established.
    private struct Session {
        var info: ConnectionInfo
        /// With reliable delivery: the last delivery the client already has.
        var resume: UInt64?
    }

    /// Serves one connection from handshake to close.
    func serve(_ connection: AcceptedConnection) async {
        let channel = connection.channel.channel
        let remoteAddress = channel.remoteAddress?.description
        if let goAway = self.registry.add(connection.id, channel: channel, handler: connection.handler, remoteAddress: remoteAddress) {
            channel.pipeline.triggerUserOutboundEvent(GatewayConnectionEvent.drain(goAway), promise: nil)
        }
        defer { self.registry.remove(connection.id) }
        let logger = connection.logger
        do {
            try await connection.channel.executeThenClose { inbound, outbound in
                var frames = inbound.makeAsyncIterator()
                // The protocol handler lets nothing but a HELLO through first.
                guard let first = try await frames.next(), case .hello(let hello) = first.payload else { return }
                guard
                    let session = try await self.handshake(
                        hello,
                        connectionID: connection.id,
                        remoteAddress: remoteAddress,
                        outbound: outbound,
                        logger: logger
                    )
                else { return }
                logger.debug("client connected", metadata: ["client": "\(session.info.clientID)", "remote": "\(remoteAddress ?? "-")"])
                try await self.serveFrames(
                    from: &frames,
                    session: session,
                    requests: connection.requests,
                    outbound: outbound,
                    logger: logger
                )
            }
        } catch {
            logger.debug("connection ended with an error", metadata: ["error": "\(error)"])
        }
        logger.debug("connection closed")
    }

    /// Negotiates, authenticates, registers and welcomes the client.
    /// - Returns: The session, or `nil` if the client was refused (ERROR or GOAWAY sent).
    private func handshake(
        _ hello: Frame.Hello,
        connectionID: UInt64,
        remoteAddress: String?,
        outbound: NIOAsyncChannelOutboundWriter<Frame>,
        logger: Logger
    ) async throws -> Session? {
        let welcome: Frame.Welcome
        let policy = self.configuration.handshakePolicy(deliveryEpoch: self.messageStore?.epoch)
        switch Handshake.accept(hello, policy: policy, connectionID: connectionID) {
        case .failure(let error):
            logger.info("handshake refused", metadata: ["error": "\(error)"])
            try await outbound.write(Frame(.error(.init(code: error.code, message: error.message))))
            return nil
        case .success(let accepted):
            welcome = accepted.0
        }
        if let authenticator = self.authenticator {
            do {
                try await authenticator(
                    HandshakeInfo(
                        clientID: hello.clientID,
                        authToken: hello.authToken,
                        userAgent: hello.userAgent,
                        remoteAddress: remoteAddress
                    )
                )
            } catch {
                let message = (error as? RequestError)?.message ?? "authentication failed"
                logger.info("client refused by the authenticator", metadata: ["client": "\(hello.clientID)", "error": "\(error)"])
                try await outbound.write(Frame(.error(.init(code: .unauthenticated, message: message))))
                return nil
            }
        }
        var resume: UInt64?
        if welcome.features.contains(.reliableDelivery), let store = self.messageStore {
            do {
                let reset = try await self.clientLanes.exclusively(hello.clientID) { lane in
                    let reset = try await store.registerOutbox(client: hello.clientID, epoch: hello.outboxEpoch ?? 0)
                    if reset { lane.lastProcessed = [:] }
                    return reset
                }
                if reset {
                    logger.info("the client has a new outbox; its conversations start again", metadata: ["client": "\(hello.clientID)"])
                }
            } catch {
                logger.error("the message store is unavailable; refusing the connection", metadata: ["error": "\(error)"])
                try await outbound.write(
                    Frame(.goAway(.init(reason: .overloaded, retryAfter: .seconds(1), message: "the message store is unavailable")))
                )
                return nil
            }
            resume = hello.resume.flatMap { $0.epoch == store.epoch ? $0.lastSequence : nil } ?? 0
        }
        guard let info = self.registry.established(connectionID, clientID: hello.clientID, userAgent: hello.userAgent) else {
            return nil
        }
        try await outbound.write(Frame(.welcome(welcome)))
        return Session(info: info, resume: resume)
    }

    /// Serves the frames of an established connection until it closes: a handler per REQUEST
    /// (at most the configured number at once), and with reliable delivery, the message
    /// processor and the delivery pump.
    private func serveFrames(
        from frames: inout NIOAsyncChannelInboundStream<Frame>.AsyncIterator,
        session: Session,
        requests: RequestRegistry,
        outbound: NIOAsyncChannelOutboundWriter<Frame>,
        logger: Logger
    ) async throws {
        let connection = session.info
        let slots = AsyncSemaphore(permits: self.configuration.limits.maxConcurrentRequestsPerConnection)
        let reliable = session.resume.flatMap { _ in self.messageStore }.map { store in
            ReliableSession(gateway: self, store: store, connection: connection, outbound: outbound, logger: logger)
        }
        // The processor is not a child task, so closing the connection does not cancel it: a
        // batch whose handlers ran must still be committed, or a retransmission would run them
        // again. It stops after `finish()`, once its current batch is done; the group awaits it.
        let processor = reliable.map { reliable in Task { await reliable.runProcessor() } }
        try await withThrowingDiscardingTaskGroup { group in
            defer { reliable?.finish() }  // however the connection ends
            if let processor { group.addTask { await processor.value } }
            if let reliable, let resume = session.resume {
                group.addTask { await reliable.runPump(from: resume) }
            }
            while let frame = try await frames.next() {
                switch frame.payload {
                case .request(let request):
                    // Waiting here stops reading from the socket: TCP backpressure, not refusals.
                    // Deadlines and CANCELs still reach running handlers through the registry.
                    try await slots.acquire()
                    guard requests.isPending(request.id) else {
                        // Answered by its deadline, or cancelled, while it waited: do not run it.
                        slots.release()
                        continue
                    }
                    group.addTask {
                        await self.execute(request, requests: requests, connection: connection, outbound: outbound, logger: logger)
                        slots.release()
                    }
                case .message(let message):
                    reliable?.receive(message)
                case .deliveryAck(let ack):
                    reliable?.acknowledged(upTo: ack.sequence)
                default:
                    continue
                }
            }
            // The connection is gone: answers can no longer be delivered, so stop everything.
            reliable?.finish()
            group.cancelAll()
        }
    }

    private enum Outcome: Sendable {
        case replied(ByteBuffer)
        case threw(any Error)
    }

    /// Runs one handler and writes its RESPONSE.
    ///
    /// Deadlines and CANCELs are the protocol handler's job: it answers (or not) and settles the
    /// request in `requests`, which cancels this task; a cancelled handler's answer is not sent.
    private func execute(
        _ request: Frame.Request,
        requests: RequestRegistry,
        connection: ConnectionInfo,
        outbound: NIOAsyncChannelOutboundWriter<Frame>,
        logger: Logger
    ) async {
        guard let handler = self.routes.withLockedValue({ $0[request.method] }) else {
            let response = Frame.Response(id: request.id, status: .unknownMethod, message: "no handler for method '\(request.method)'")
            try? await outbound.write(Frame(.response(response)))
            return
        }
        // The protocol handler set the effective deadline (the client's, capped by ours).
        let timeout = request.timeout ?? self.configuration.timeouts.handler
        let context = RequestContext(connection: connection, logger: logger, request: (request.id, request.method), gateway: self)
        let gatewayRequest = GatewayRequest(method: request.method, body: request.body, id: request.id, timeout: timeout)
        let outcome = await requests.run(request.id) { () async -> Outcome in
            do {
                return .replied(try await handler(gatewayRequest, context))
            } catch {
                return .threw(error)
            }
        }
        // Not started (settled while it waited), or cancelled while it ran: nothing to send.
        guard let outcome, !Task.isCancelled else { return }
        let response = self.response(to: request, outcome: outcome, logger: context.logger)
        try? await outbound.write(Frame(.response(response)))
    }

    private func response(to request: Frame.Request, outcome: Outcome, logger: @autoclosure () -> Logger) -> Frame.Response {
        switch outcome {
        case .replied(let body):
            return Frame.Response(id: request.id, status: .ok, body: body)
        case .threw(let error as RequestError):
            return Frame.Response(id: request.id, status: error.status, message: error.message)
        case .threw(let error):
            logger().error("handler failed", metadata: ["error": "\(error)"])
            let message = self.configuration.exposeHandlerErrors ? "\(error)" : "internal error in '\(request.method)'"
            return Frame.Response(id: request.id, status: .internalError, message: message)
        }
    }
}
