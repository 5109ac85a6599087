public import CoreMetrics
import OTel
public import ServiceLifecycle
public import Tracing

/// Tether's traces and metrics exported with OpenTelemetry (OTLP over HTTP) through swift-otel,
/// without bootstrapping anything process-wide: the gateway and clients get the tracer and the
/// metrics factory, and the returned service exports in the background.
///
/// ```swift
/// let observability = try TetherOTel.backends(serviceName: "chat-gateway")  // OTEL_EXPORTER_OTLP_ENDPOINT, …
/// let gateway = try Gateway(configuration: configuration, metrics: .factory(observability.metrics),
///                           tracer: observability.tracer)
/// let group = ServiceGroup(services: [observability.service, gateway], logger: logger)
/// try await group.run()
/// ```
///
/// The OpenTelemetry environment variables (`OTEL_EXPORTER_OTLP_ENDPOINT`, `OTEL_SERVICE_NAME`, …)
/// override what is given here, as the specification says.
public enum TetherOTel {
    /// The tracer, the metrics factory, and the service that exports both.
    public struct Backends: Sendable {
        public var tracer: any Tracer
        public var metrics: any MetricsFactory
        /// Run it in the application's `ServiceGroup`: it batches and exports, and flushes on
        /// graceful shutdown.
        public var service: any Service
    }

    /// Makes swift-otel's tracing and metrics backends for Tether.
    /// - Parameters:
    ///   - serviceName: The `service.name` resource attribute.
    ///   - endpoint: The collector's OTLP/HTTP base URL (`http://collector:4318`; `/v1/traces` and
    ///     `/v1/metrics` are appended); `nil` for the default or
    ///     `OTEL_EXPORTER_OTLP_ENDPOINT`.
    ///   - json: Export OTLP/JSON instead of protobuf.
    ///   - exportInterval: How often spans and metrics are sent.
    public static func backends(
        serviceName: String,
        endpoint: String? = nil,
        json: Bool = false,
        exportInterval: Duration = .seconds(5)
    ) throws -> Backends {
        var configuration = OTel.Configuration.default
        configuration.serviceName = serviceName
        configuration.logs.enabled = false
        // An endpoint set here is the signal's own URL (as OTEL_EXPORTER_OTLP_TRACES_ENDPOINT).
        for (exporter, path) in [(\OTel.Configuration.traces.otlpExporter, "v1/traces"), (\.metrics.otlpExporter, "v1/metrics")] {
            configuration[keyPath: exporter].protocol = json ? .httpJSON : .httpProtobuf
            if let endpoint { configuration[keyPath: exporter].endpoint = endpoint + (endpoint.hasSuffix("/") ? "" : "/") + path }
        }
        configuration.traces.batchSpanProcessor.scheduleDelay = exportInterval
        configuration.metrics.exportInterval = exportInterval
        // The gateway's histograms start at 100 µs: a Tether request often takes less than 1 ms.
        configuration.metrics.defaultDurationHistogramBuckets = [
            .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .microseconds(2500),
            .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100),
            .milliseconds(250), .milliseconds(500), .seconds(1), .milliseconds(2500), .seconds(5), .seconds(10),
        ]
        let tracing = try OTel.makeTracingBackend(configuration: configuration)
        let metrics = try OTel.makeMetricsBackend(configuration: configuration)
        return Backends(
            tracer: tracing.factory,
            metrics: metrics.factory,
            service: ServiceGroup(
                configuration: .init(
                    services: [.init(service: tracing.service), .init(service: metrics.service)],
                    logger: .init(label: "tether.otel")
                )
            )
        )
    }
}
