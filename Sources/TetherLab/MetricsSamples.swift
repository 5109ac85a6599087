/// The samples of a Prometheus text exposition (what a gateway's `GET /metrics` answers), by
/// series: `name{labels}` as written, without the value. For tests and the lab, which read a
/// gateway's own counts.
///
/// ```swift
/// let samples = MetricsSamples(parsing: text)
/// let answered = samples[#"tether_requests_total{method="echo",status="ok"}"#] ?? 0
/// let open = samples.total("tether_connections_open")   // every transport
/// ```
public struct MetricsSamples: Sendable, Hashable {
    /// The value of each series.
    public var values: [String: Double]

    /// Reads the exposition format: one sample per line, `series value`; comments (`# HELP`,
    /// `# TYPE`) and lines without a number are skipped.
    public init(parsing text: String) {
        var values: [String: Double] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            guard let space = line.lastIndex(of: " "), let value = Double(line[line.index(after: space)...]) else { continue }
            values[String(line[..<space])] = value
        }
        self.values = values
    }

    /// The value of one series, `name{labels}` exactly as the exposition writes it.
    public subscript(series: String) -> Double? { self.values[series] }

    /// The sum of every series of a metric, whatever its labels.
    public func total(_ name: String) -> Double {
        self.values.filter { $0.key == name || $0.key.hasPrefix(name + "{") }.values.reduce(0, +)
    }
}
