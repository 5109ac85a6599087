import Logging
import NIOCore
import TetherCore

extension Gateway {
    /// Negotiates, authenticates and registers the client; the caller sends the WELCOME.
    /// - Returns: The session, or `nil` if the client was refused (ERROR or GOAWAY sent) or the
    ///   connection closed meanwhile.
    /// - Throws: If a refusal could not be written.
    func handshake(
        _ hello: Frame.Hello,
        connectionID: UInt64,
        remoteAddress: String?,
        outbound: ConnectionWriter,
        logger: Logger
    ) async throws -> ConnectionDispatcher.Session? {
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
        return ConnectionDispatcher.Session(info: info, welcome: welcome, resume: resume)
    }

    private enum Outcome: Sendable {
        case replied(ByteBuffer)
        case threw(any Error)
    }

    /// Runs one handler in the calling task and writes its RESPONSE.
    ///
    /// Deadlines and CANCELs are the protocol handler's job: it answers (or not) and settles the
    /// request in `requests`, which cancels this task; a cancelled handler's answer is not sent.
    func execute(
        _ request: Frame.Request,
        handler: Handler,
        requests: RequestRegistry,
        scope: ConnectionScope,
        outbound: ConnectionWriter
    ) async {
        let context = RequestContext(scope: scope, request: (request.id, request.method))
        let gatewayRequest = self.gatewayRequest(request)
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
        outbound.send(Frame(.response(response)))
    }

    /// The answer to a request that needs no task: an inline handler's reply, or `unknown
    /// method` if nothing handles it (`handler` is `nil`). Called on the connection's event loop.
    func answerInline(_ request: Frame.Request, handler: InlineHandler?, scope: ConnectionScope) -> Frame.Response {
        guard let handler else {
            return Frame.Response(id: request.id, status: .unknownMethod, message: "no handler for method '\(request.method)'")
        }
        let context = RequestContext(scope: scope, request: (request.id, request.method))
        let outcome: Outcome
        do {
            outcome = .replied(try handler(self.gatewayRequest(request), context))
        } catch {
            outcome = .threw(error)
        }
        return self.response(to: request, outcome: outcome, logger: context.logger)
    }

    private func gatewayRequest(_ request: Frame.Request) -> GatewayRequest {
        // The protocol handler set the effective deadline (the client's, capped by ours).
        let timeout = request.timeout ?? self.configuration.timeouts.handler
        return GatewayRequest(method: request.method, body: request.body, id: request.id, timeout: timeout)
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
