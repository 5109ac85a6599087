public import NIOCore
import TetherCore
import Tracing

extension TetherClient {
    /// Calls `method` on the gateway and returns the response body.
    ///
    /// If the client is connecting or reconnecting, the request waits for the connection. Many
    /// requests may be in flight at once; each gets its own response. Cancelling the calling
    /// task cancels the request at once and tells the gateway (CANCEL).
    ///
    /// Requests are not retried after they reached the gateway: if the connection drops while
    /// one is in flight, it fails with ``TetherError/Code/connectionLost`` because the gateway
    /// may have run it. A request the gateway refused because it was going away
    /// (status `unavailable`) never ran, and is sent again on the next connection.
    ///
    /// It runs on the caller's executor (`nonisolated(nonsending)`): it only hands the request
    /// to the connection's event loop, which takes no blocking work, and each `async` layer
    /// that ran elsewhere would cost a task switch (15 per request before, 8 with the bench's
    /// driver; `Benchmarks/count-runtime-calls`).
    ///
    /// ```swift
    /// let reply = try await client.request("room.enter", body: ByteBuffer(string: #"{"room":"lobby"}"#), timeout: .seconds(3))
    /// ```
    /// - Parameters:
    ///   - method: The route to call, 1 to 65,535 bytes of UTF-8.
    ///   - body: The request's content.
    ///   - timeout: The deadline, from now until the response, including any wait for a
    ///     connection; ``ClientConfiguration/Requests-swift.struct/defaultTimeout`` if `nil`.
    /// - Returns: The body of the gateway's ok response.
    /// - Throws: ``TetherError``: ``TetherError/Code/timedOut``, ``TetherError/Code/cancelled``,
    ///   ``TetherError/Code/serverError`` (with the gateway's ``TetherError/status``),
    ///   ``TetherError/Code/connectionLost``, ``TetherError/Code/notConnected``,
    ///   ``TetherError/Code/shutdown``, ``TetherError/Code/requestTooLarge`` or
    ///   ``TetherError/Code/invalidArgument``.
    public nonisolated(nonsending) func request(
        _ method: String,
        body: ByteBuffer = ByteBuffer(),
        timeout: Duration? = nil
    ) async throws(TetherError) -> ByteBuffer {
        var call = try self.prepareRequest(method, timeout: timeout)
        do {
            let reply = try await self.withSpan(method, ofKind: .client, attributes: ["rpc.system": "tether", "rpc.method": method]) {
                traceContext throws(TetherError) in
                call.traceContext = traceContext
                return try await self.perform(call, body: body)
            }
            self.recorder.requestEnded(nil, after: self.clock.now - call.preparedAt)
            return reply
        } catch {
            self.recorder.requestEnded(error, after: self.clock.now - call.preparedAt)
            throw error
        }
    }

    /// A request's arguments, checked, with its id and deadline.
    struct PreparedRequest: Sendable {
        var id: UInt64
        var method: String
        var deadline: TetherInstant
        /// When it was prepared: its timeout is `deadline - preparedAt`.
        var preparedAt: TetherInstant
        /// The caller's trace, sent if the gateway accepts trace contexts.
        var traceContext: TraceContext?
    }

    /// Checks a request's arguments and gives it an id and a deadline.
    func prepareRequest(_ method: String, timeout: Duration?) throws(TetherError) -> PreparedRequest {
        guard !method.isEmpty, method.utf8.count <= Int(UInt16.max) else {
            throw TetherError(code: .invalidArgument, message: "the method must be 1 to 65535 bytes long")
        }
        let timeout = timeout ?? self.configuration.requests.defaultTimeout
        guard timeout > .zero else {
            throw TetherError(code: .invalidArgument, message: "the timeout must be positive, got \(timeout.shortDescription)")
        }
        let now = self.clock.now
        return PreparedRequest(
            id: self.requestIDs.loadThenWrappingIncrement(ordering: .relaxed),
            method: method,
            deadline: now + timeout,
            preparedAt: now
        )
    }

    /// Sends a prepared request, waiting for a connection if none is ready, and returns its response.
    nonisolated(nonsending) func perform(_ call: PreparedRequest, body: ByteBuffer) async throws(TetherError) -> ByteBuffer {
        while true {
            guard !Task.isCancelled else {
                throw TetherError(code: .cancelled, message: "request '\(call.method)' was cancelled")
            }
            let connection: ClientConnection
            if let ready = self.readyConnection {
                connection = ready
            } else {
                connection = try await self.connection(before: call.deadline, method: call.method)
            }
            // The REQUEST carries the time left before its deadline.
            let remaining = call.deadline - self.clock.now
            guard remaining > .zero else {
                throw TetherError(code: .timedOut, message: "no connection for '\(call.method)' before its deadline")
            }
            let request = Frame.Request(
                id: call.id,
                method: call.method,
                timeout: remaining,
                body: body,
                traceContext: connection.negotiated.features.contains(.traceContext) ? call.traceContext : nil
            )
            do {
                return try await connection.execute(request, deadline: call.deadline)
            } catch let error as TetherError where error.code == .notDispatched {
                // The connection stopped accepting requests before this one reached a handler:
                // make sure nobody picks it again, then wait for the next one.
                self.retire(connection)
                continue
            } catch {
                throw TetherError.wrapping(error, as: .connectionLost, "request '\(call.method)' failed")
            }
        }
    }

    /// The connection requests go to now, if one is ready.
    var readyConnection: ClientConnection? {
        self.state.withLockedValue { $0.ready }
    }

    /// Stops handing out `connection`, which no longer accepts requests.
    func retire(_ connection: ClientConnection) {
        self.state.withLockedValue { state in
            if state.ready === connection { state.ready = nil }
        }
    }

    /// The connection to send a request on, waiting for one until `deadline` (``perform(_:body:)``
    /// takes a ready one without calling this).
    func connection(before deadline: TetherInstant, method: String) async throws(TetherError) -> ClientConnection {
        enum Immediate {
            case ready(ClientConnection)
            case failed(TetherError)
            case wait
        }
        let immediate: Immediate = self.state.withLockedValue { state in
            if let connection = state.ready { return .ready(connection) }
            if let error = state.terminalError { return .failed(error) }
            return .wait
        }
        switch immediate {
        case .ready(let connection): return connection
        case .failed(let error): throw error
        case .wait: break
        }

        let waiterID = self.waiterIDs.loadThenWrappingIncrement(ordering: .relaxed)
        do {
            let connection = try await withTaskCancellationHandler {
                try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<ClientConnection, any Error>) in
                    let timer = self.clock.schedule(at: deadline, on: self.eventLoop) {
                        self.expireWaiter(waiterID, method: method)
                    }
                    let outcome: Result<ClientConnection, TetherError>? = self.state.withLockedValue { state in
                        if case .cancelledEarly = state.waiters[waiterID] {
                            return .failure(TetherError(code: .cancelled, message: "request '\(method)' was cancelled"))
                        }
                        if let connection = state.ready { return .success(connection) }
                        if let error = state.terminalError { return .failure(error) }
                        state.waiters[waiterID] = .waiting(continuation, timer: timer)
                        return nil
                    }
                    if let outcome {
                        timer.cancel()
                        continuation.resume(with: outcome.mapError { $0 as any Error })
                    }
                }
            } onCancel: {
                self.cancelWaiter(waiterID, method: method)
            }
            self.state.withLockedValue { _ = $0.waiters.removeValue(forKey: waiterID) }
            return connection
        } catch {
            self.state.withLockedValue { _ = $0.waiters.removeValue(forKey: waiterID) }
            throw TetherError.wrapping(error, as: .notConnected, "no connection for '\(method)'")
        }
    }

    private func expireWaiter(_ id: UInt64, method: String) {
        let (waiter, message): (State.Waiter?, String) = self.state.withLockedValue { state in
            guard case .waiting = state.waiters[id] else { return (nil, "") }
            let waiter = state.waiters.removeValue(forKey: id)
            var message = "no connection for '\(method)' before its deadline"
            switch state.run {
            case .notStarted:
                message += ": the client is not running; call run() first"
            case .running, .finished:
                message += " (\(ConnectionState(state.machine.state)))"
                if let lastError = state.lastError { message += "; last error: \(lastError)" }
            }
            return (waiter, message)
        }
        if case .waiting(let continuation, _) = waiter {
            continuation.resume(throwing: TetherError(code: .timedOut, message: message))
        }
    }

    private func cancelWaiter(_ id: UInt64, method: String) {
        let waiter: State.Waiter? = self.state.withLockedValue { state in
            guard let waiter = state.waiters[id] else {
                state.waiters[id] = .cancelledEarly
                return nil
            }
            state.waiters[id] = nil
            return waiter
        }
        if case .waiting(let continuation, let timer) = waiter {
            timer.cancel()
            continuation.resume(throwing: TetherError(code: .cancelled, message: "request '\(method)' was cancelled"))
        }
    }
}
