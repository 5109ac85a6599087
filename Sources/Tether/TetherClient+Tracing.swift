import TetherCore
import Tracing

extension TetherClient {
    /// Runs `body` in a span of the client's tracer, handing it the trace context to send in
    /// the frame (`nil` without a tracer, or if the tracer injects nothing), so that the
    /// gateway's span is the child of this one. A ``TetherError`` marks the span.
    /// - Parameters:
    ///   - name: The span's name: the request's method, or the message's topic.
    ///   - kind: `.client` for a request, `.producer` for a reliable message.
    ///   - attributes: The span's attributes (OpenTelemetry's semantic conventions); made only
    ///     when there is a tracer.
    nonisolated(nonsending) func withSpan<T: Sendable>(
        _ name: String,
        ofKind kind: SpanKind,
        attributes: @autoclosure () -> [String: String],
        _ body: (TraceContext?) async throws(TetherError) -> T
    ) async throws(TetherError) -> T {
        guard let tracer = self.tracer else { return try await body(nil) }
        do {
            let attributes = attributes()
            return try await tracer.withSpan(name, ofKind: kind) { span in
                for (key, value) in attributes { span.attributes[key] = value }
                var fields: [String: String] = [:]
                tracer.inject(span.context, into: &fields, using: TraceContextInjector())
                do throws(TetherError) {
                    return try await body(fields.isEmpty ? nil : TraceContext(fields))
                } catch {
                    span.attributes["tether.error"] = "\(error.code)"
                    if let status = error.status { span.attributes["tether.status"] = "\(status)" }
                    throw error
                }
            }
        } catch let error as TetherError {
            throw error
        } catch {
            // withSpan rethrows what `body` threw, which is a TetherError.
            throw TetherError.wrapping(error, as: .connectionLost, "'\(name)' failed")
        }
    }
}

/// Writes a tracer's propagation fields into a frame's trace context.
struct TraceContextInjector: Injector {
    func inject(_ value: String, forKey key: String, into carrier: inout [String: String]) {
        carrier[key] = value
    }
}
