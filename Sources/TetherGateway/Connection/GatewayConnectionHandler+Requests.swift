import NIOCore
import TetherCore

extension GatewayConnectionHandler {
    /// The request that replaces the connection's credentials (PROTOCOL.md, section 5.1).
    static let refreshCredentialsMethod = "$auth"

    /// Runs a request's handler: an inline one (or the `unknown method` answer) at once, a
    /// task's once a slot is free.
    /// - Parameter directly: The request was routed as it was read, not after waiting for the
    ///   rate: it is in the machine's table only if it goes to a task.
    func route(_ request: Frame.Request, directly: Bool, now: TetherInstant) {
        guard let scope = self.scope else { return }  // requests come only once established
        if request.method == Self.refreshCredentialsMethod {
            // Runs the authenticator in a task, in a handler slot like any request.
            self.startOrQueue(request, now: now)
            return
        }
        if self.channelMethod(request.method) != nil {
            guard self.io.isWritable else {
                // A page of history is up to 64 KiB for a small request: a client that does not
                // read its answers gets no more of them until it does.
                let refusal = Frame.Response(
                    id: request.id,
                    status: .unavailable,
                    message: "the client does not read what it was sent; ask again once it has"
                )
                self.services.requestMetrics(request.method).ended(.unavailable, nanoseconds: nil)
                self.answer(refusal, directly: directly)
                return
            }
            // Checked per channel (Access.subscribe, Access.publish), not as a method; in a
            // task, as the store may be read or written.
            self.startOrQueue(request, now: now)
            return
        }
        let router = self.services.router
        if scope.checksAccess, !router.permits(.request(method: request.method), scope.connection) {
            let refusal = Frame.Response(id: request.id, status: .permissionDenied, message: "not allowed to call '\(request.method)'")
            self.services.requestMetrics(request.method).ended(.permissionDenied, nanoseconds: nil)
            self.answer(refusal, directly: directly)
            return
        }
        switch router.route(request.method) {
        case .task:
            self.startOrQueue(request, now: now)
        case .inline(let handler):
            self.answer(
                self.services.answerInline(request, handler: handler, scope: scope, deadline: Self.deadline(of: request, now)),
                directly: directly
            )
        case nil:
            self.answer(self.services.answerInline(request, handler: nil, scope: scope, deadline: now), directly: directly)
        }
    }

    private static func deadline(of request: Frame.Request, _ now: TetherInstant) -> TetherInstant {
        now + (request.timeout ?? .zero)  // the machine set the effective timeout
    }

    private func startOrQueue(_ request: Frame.Request, now: TetherInstant) {
        if self.machine.handlerNeeded(request, now: now) == .start {
            self.startHandler(request, now: now)
        }
    }

    /// Starts a request's handler in a task; its slot is taken. The request is one that
    /// ``route(_:directly:now:)`` gave a slot to, now or after it waited for one: `$auth`, or a
    /// method with a task handler.
    private func startHandler(_ request: Frame.Request, now: TetherInstant) {
        let handler: Gateway.Handler
        if request.method == Self.refreshCredentialsMethod {
            handler = self.refreshCredentials
        } else if let channels = self.channelMethod(request.method) {
            handler = channels
        } else if case .task(let routed) = self.services.router.route(request.method) {
            handler = routed
        } else {
            // The routes are fixed while the gateway runs, so this does not happen; if it did,
            // the slot must still be given back, or the connection would never be done.
            self.handlerFinished(request.id, response: nil)
            return
        }
        guard let scope = self.scope else {
            self.handlerFinished(request.id, response: nil)
            return
        }
        let services = self.services
        let handle = self.handle
        let id = request.id
        let deadline = Self.deadline(of: request, now)
        // On the connection's loop, the handler starts at once, as an inline one would; its
        // task is queued only if it suspends.
        self.starting = id
        let task = self.spawn(immediately: self.executor != nil) {
            let response = await services.run(request, handler: handler, scope: scope, deadline: deadline)
            handle.execute(passing: (id, response)) { $0.handlerFinished($1.0, response: $1.1) }
        }
        self.starting = nil
        // A handler that answered before it suspended is done already.
        if self.finishedWhileStarting == id {
            self.finishedWhileStarting = nil
        } else {
            self.handlerTasks[id] = task
        }
    }

    /// A request handler's task ended, with its answer (`nil` if cancelled).
    func handlerFinished(_ id: UInt64, response: Frame.Response?) {
        if self.handlerTasks.removeValue(forKey: id) == nil, self.starting == id {
            self.finishedWhileStarting = id  // it ended before its task was recorded
        }
        let ended = self.machine.handlerEnded(answering: response?.id)
        if let response, ended.writeAnswer { self.writeAnswer(response) }
        let now = self.services.clock.now
        for request in ended.start { self.startHandler(request, now: now) }
        self.resumeReading()
        if ended.done { self.done() }
    }

    /// Sends a RESPONSE unless its request was already answered, cancelled, or the connection
    /// is closing. A reply larger than the client accepts is replaced by `resource exhausted`:
    /// sending it would make the client close the connection.
    func answer(_ response: Frame.Response, directly: Bool) {
        guard self.machine.responseReady(response.id, routedDirectly: directly) else { return }
        self.writeAnswer(response)
    }

    /// Writes the answer to a request still unanswered (the machine said so).
    private func writeAnswer(_ response: Frame.Response) {
        self.pushes?.drain()
        let size = response.bodySize
        if let limit = self.machine.peerMaxBodySize, size > limit {
            self.services.metrics.refused("reply_size")
            self.logger.warning("a reply is larger than the client accepts", metadata: ["bytes": "\(size)", "limit": "\(limit)"])
            self.write(
                .response(
                    Frame.Response(
                        id: response.id,
                        status: .resourceExhausted,
                        message: "the reply is \(size) bytes; this client accepts at most \(limit)"
                    )
                )
            )
        } else if !self.write(.response(response)) {
            self.write(.response(Frame.Response(id: response.id, status: .internalError, message: "the response could not be encoded")))
        }
        self.flushSoon()
    }

    // MARK: Credentials

    /// The handler of `$auth`: checks the new token as a HELLO's, for the same client id.
    /// Accepted, it replaces the connection's identity (its expiry, rooms and topics); refused,
    /// the connection keeps the credentials it has until they run out. Without an authenticator
    /// there is nothing to replace: `ok`.
    private var refreshCredentials: Gateway.Handler {
        let services = self.services
        let handle = self.handle
        return { request, context in
            guard let authenticator = services.authenticator else { return ByteBuffer() }
            let connection = context.connection
            let info = HandshakeInfo(
                clientID: connection.clientID,
                authToken: request.body,
                userAgent: connection.userAgent,
                remoteAddress: connection.remoteAddress
            )
            switch await GatewayServices.authenticate(info, with: authenticator) {
            case .success(let identity):
                // Ordered before the RESPONSE, which goes through the loop after this returns.
                handle.execute { $0.credentialsReplaced(identity) }
                return ByteBuffer()
            case .failure(let refusal):
                context.logger.info("credentials refresh refused", metadata: ["error": "\(refusal)"])
                throw RequestError(refusal.status, refusal.message)
            }
        }
    }
}
