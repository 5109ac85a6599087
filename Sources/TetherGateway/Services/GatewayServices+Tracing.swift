import NIOCore
import TetherCore
import Tracing

extension GatewayServices {
    /// Runs `body` in a server span named after the request's method, the child of the trace the
    /// REQUEST carried (if any); the handler's own spans are its children. Without a tracer
    /// (``Gateway/init(configuration:eventLoopGroup:messageStore:authenticator:cluster:clock:metrics:tracer:logger:)``),
    /// `body` runs as it is.
    func traced(_ request: Frame.Request, _ body: () async -> Frame.Response?) async -> Frame.Response? {
        guard let tracer = self.tracer else { return await body() }
        let parent = Self.context(extractedFrom: request.traceContext, by: tracer)
        return await tracer.withSpan(request.method, context: parent, ofKind: .server) { span in
            span.attributes["rpc.system"] = "tether"
            span.attributes["rpc.method"] = request.method
            let response = await body()
            Self.settle(span, status: response?.status ?? .cancelled)
            return response
        }
    }

    /// ``traced(_:_:)`` for an inline handler, on the event loop.
    func tracedInline(_ request: Frame.Request, _ body: () -> Frame.Response) -> Frame.Response {
        guard let tracer = self.tracer else { return body() }
        let parent = Self.context(extractedFrom: request.traceContext, by: tracer)
        return tracer.withSpan(request.method, context: parent, ofKind: .server) { span in
            span.attributes["rpc.system"] = "tether"
            span.attributes["rpc.method"] = request.method
            let response = body()
            Self.settle(span, status: response.status)
            return response
        }
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
