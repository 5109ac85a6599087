import Logging
import NIOCore
import TetherCore

extension GatewayServices {
    private enum Outcome: Sendable {
        case replied(ByteBuffer)
        case threw(any Error)
    }

    /// Runs a request's handler in the calling task.
    ///
    /// Deadlines and CANCELs are the connection's job: it answers (or not) and cancels this task;
    /// a cancelled handler's answer is not sent.
    /// - Returns: The RESPONSE, or `nil` if the task was cancelled meanwhile.
    func run(_ request: Frame.Request, handler: Gateway.Handler, scope: ConnectionScope, deadline: TetherInstant) async -> Frame.Response? {
        let observation = self.observe(request)
        let context = RequestContext(scope: scope, request: (request.id, request.method), deadline: deadline)
        let outcome: Outcome
        do {
            outcome = .replied(try await observation.run { try await handler(self.gatewayRequest(request), context) })
        } catch {
            outcome = .threw(error)
        }
        guard !Task.isCancelled else {
            // Answered already at its deadline, or cancelled by the client or the connection's end.
            let ended = self.clock.now
            observation.end(metrics: ended >= deadline ? .deadlineExceeded : .cancelled, span: .cancelled, at: ended)
            return nil
        }
        let response = self.response(to: request, outcome: outcome, logger: context.logger)
        observation.end(response.status, at: self.clock.now)
        return response
    }

    /// The answer to a request that needs no task: an inline handler's reply, or `unknown
    /// method` if nothing handles it (`handler` is `nil`). Called on the connection's event loop.
    func answerInline(
        _ request: Frame.Request,
        handler: Gateway.InlineHandler?,
        scope: ConnectionScope,
        deadline: TetherInstant
    ) -> Frame.Response {
        guard let handler else {
            self.unknownMethodMetrics.ended(.unknownMethod, nanoseconds: nil)
            return Frame.Response(id: request.id, status: .unknownMethod, message: "no handler for '\(request.method)'")
        }
        let observation = self.observe(request)
        let context = RequestContext(scope: scope, request: (request.id, request.method), deadline: deadline)
        let outcome: Outcome
        do {
            outcome = .replied(try observation.run { try handler(self.gatewayRequest(request), context) })
        } catch {
            outcome = .threw(error)
        }
        let response = self.response(to: request, outcome: outcome, logger: context.logger)
        observation.end(response.status, at: self.clock.now)
        return response
    }

    private func gatewayRequest(_ request: Frame.Request) -> GatewayRequest {
        // The connection set the effective deadline (the client's, capped by ours).
        let timeout = request.timeout ?? self.configuration.timeouts.handler
        return GatewayRequest(
            method: request.method,
            body: request.body,
            id: request.id,
            timeout: timeout,
            traceContext: request.traceContext
        )
    }

    private func response(to request: Frame.Request, outcome: Outcome, logger: @autoclosure () -> Logger) -> Frame.Response {
        switch outcome {
        case .replied(let body):
            return Frame.Response(id: request.id, status: .ok, body: body)
        case .threw(let error as RequestError):
            return Frame.Response(id: request.id, status: error.status, message: Self.clipped(error.message))
        case .threw(let error):
            logger().error("handler failed", metadata: ["error": "\(error)"])
            let message = self.configuration.exposeHandlerErrors ? "\(error)" : "internal error in '\(request.method)'"
            return Frame.Response(id: request.id, status: .internalError, message: Self.clipped(message))
        }
    }

    /// `message` cut to the 65,535 bytes of UTF-8 a RESPONSE's message holds (PROTOCOL.md 4.4),
    /// between two Unicode scalars: a handler's long error still reaches the client.
    static func clipped(_ message: String) -> String {
        let limit = Int(UInt16.max)
        guard message.utf8.count > limit else { return message }
        var bytes = 0
        var end = message.unicodeScalars.startIndex
        for scalar in message.unicodeScalars {
            let width = UTF8.width(scalar)
            guard bytes + width <= limit else { break }
            bytes += width
            end = message.unicodeScalars.index(after: end)
        }
        return String(message.unicodeScalars[..<end])
    }
}
