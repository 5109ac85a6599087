import NIOCore
import TetherCore
import Tracing

extension GatewayServices {
    /// What a request's handler runs inside, for a handler in a task and an inline one alike:
    /// its server span (named after the method, the child of the trace the REQUEST carried, if
    /// any; none without a tracer) and its metrics, from ``observe(_:)`` to ``end(_:at:)``.
    struct RequestObservation {
        let span: (any Span)?
        let metrics: RequestMetrics
        let started: TetherInstant

        /// Runs the handler with the span as the current context: the handler's own spans are its children.
        func run<Result>(_ handler: () throws -> Result) rethrows -> Result {
            guard let span else { return try handler() }
            return try ServiceContext.$current.withValue(span.context, operation: handler)
        }

        /// Runs the handler with the span as the current context: the handler's own spans are its children.
        func run<Result>(
            isolation: isolated (any Actor)? = #isolation,
            _ handler: () async throws -> Result
        ) async rethrows -> Result {
            guard let span else { return try await handler() }
            return try await ServiceContext.$current.withValue(span.context, operation: handler)
        }

        /// The request ended with `status`: counted, and its span marked and ended.
        func end(_ status: StatusCode, at ended: TetherInstant) {
            self.end(metrics: status, span: status, at: ended)
        }

        /// The request ended, counted as `metrics` and its span marked `span`.
        func end(metrics: StatusCode, span status: StatusCode, at ended: TetherInstant) {
            self.metrics.ended(metrics, nanoseconds: (ended - self.started).nanoseconds)
            if let span = self.span {
                GatewayServices.settle(span, status: status)
                span.end()
            }
        }
    }

    /// Starts observing `request`: its span begun (with a tracer), its start time taken.
    func observe(_ request: Frame.Request) -> RequestObservation {
        var span: (any Span)?
        if let tracer = self.tracer {
            let parent = Self.context(extractedFrom: request.traceContext, by: tracer)
            let started = tracer.startSpan(request.method, context: parent, ofKind: .server)
            started.attributes["rpc.system"] = "tether"
            started.attributes["rpc.method"] = request.method
            span = started
        }
        return RequestObservation(span: span, metrics: self.requestMetrics(request.method), started: self.clock.now)
    }

    /// Runs a reliable message's handler in a consumer span named after its topic, the child of
    /// the trace the MESSAGE carried (if any).
    static func traced(
        _ message: Frame.Message,
        by tracer: (any Tracer)?,
        _ body: () async -> ReliableLaneMachine.HandlerOutcome
    ) async -> ReliableLaneMachine.HandlerOutcome {
        guard let tracer else { return await body() }
        let parent = Self.context(extractedFrom: message.traceContext, by: tracer)
        return await tracer.withSpan(message.topic, context: parent, ofKind: .consumer) { span in
            span.attributes["messaging.system"] = "tether"
            span.attributes["messaging.destination.name"] = message.topic
            span.attributes["tether.message.sequence"] = Int64(truncatingIfNeeded: message.sequence)
            let outcome = await body()
            switch outcome {
            case .processed(let status, _): Self.settle(span, status: status)
            case .transient: Self.settle(span, status: .unavailable)
            }
            return outcome
        }
    }

    /// The context a carried trace context names, or a new trace's.
    static func context(extractedFrom carried: TraceContext?, by tracer: any Tracer) -> ServiceContext {
        var context = ServiceContext.topLevel
        if let carried { tracer.extract(carried.fields, into: &context, using: TraceContextExtractor()) }
        return context
    }

    /// Marks the span with the outcome's status.
    static func settle(_ span: any Span, status: StatusCode) {
        span.attributes["tether.status"] = status.metricLabel
        if status != .ok { span.setStatus(SpanStatus(code: .error, message: status.description)) }
    }
}

/// Reads a trace context's fields for a tracer's propagation.
struct TraceContextExtractor: Extractor {
    func extract(key: String, from carrier: [String: String]) -> String? {
        carrier[key]
    }
}
