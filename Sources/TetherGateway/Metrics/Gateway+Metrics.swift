public import CoreMetrics
public import Prometheus

extension Gateway {
    /// Where the gateway's metrics go: swift-metrics' global factory, one given, a Prometheus
    /// registry (which the admin listener then serves at `/metrics`), or nowhere.
    ///
    /// ```swift
    /// let registry = PrometheusCollectorRegistry()
    /// let gateway = try Gateway(configuration: configuration, metrics: .prometheus(registry))
    /// // GET /metrics on GatewayConfiguration.admin, or: registry.emitToString()
    /// ```
    ///
    /// Every metric's name starts with `tether_`; their labels are bounded (transports, status
    /// codes, the router's methods: never a client id, room or topic). The operating guide
    /// (TetherGateway's documentation, "Operating Tether") lists them.
    public struct Metrics: Sendable {
        /// `nil`: swift-metrics' `MetricsSystem.factory` when the gateway is created.
        let factory: (any CoreMetrics.MetricsFactory)?
        /// The registry `/metrics` serves, if any.
        let registry: PrometheusCollectorRegistry?

        /// swift-metrics' global factory, as the application bootstrapped it (`MetricsSystem`);
        /// nothing is recorded if it did not.
        public static var system: Metrics { Metrics(factory: nil, registry: nil) }

        /// Nothing is recorded.
        public static var off: Metrics { Metrics(factory: CoreMetrics.NOOPMetricsHandler.instance, registry: nil) }

        /// Metrics go to `factory`.
        public static func factory(_ factory: any CoreMetrics.MetricsFactory) -> Metrics {
            Metrics(factory: factory, registry: nil)
        }

        /// Metrics go to `registry`, with histogram buckets that suit the gateway (from 100 µs),
        /// and the admin listener serves it at `/metrics` in Prometheus' text format.
        public static func prometheus(_ registry: PrometheusCollectorRegistry = PrometheusCollectorRegistry()) -> Metrics {
            Metrics(factory: Gateway.prometheusFactory(registry), registry: registry)
        }
    }

    /// A swift-metrics factory for `registry` with the gateway's histogram buckets (durations
    /// from 100 µs to 10 s, fan-out sizes from 1 to 100,000). ``Metrics/prometheus(_:)`` uses it;
    /// bootstrap `MetricsSystem` with it to share the registry with the rest of the process.
    public static func prometheusFactory(_ registry: PrometheusCollectorRegistry) -> PrometheusMetricsFactory {
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.defaultDurationHistogramBuckets = GatewayMetrics.durationBuckets
        factory.valueHistogramBuckets[GatewayMetrics.Names.pushFanout] = GatewayMetrics.fanoutBuckets
        factory.valueHistogramBuckets[GatewayMetrics.Names.reliableBatchSize] = GatewayMetrics.batchBuckets
        return factory
    }
}
