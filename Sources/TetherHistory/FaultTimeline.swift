/// The nemesis's acts in a history: each fault from its start (`invoke`) to its heal (`ok`, the
/// record with the same `detail`), and each kill, at its moment.
///
/// ```swift
/// let timeline = FaultTimeline(records)
/// print(timeline.inForce(from: anomaly.records.first!.time, to: anomaly.records.last!.time).map(\.detail))
/// ```
public struct FaultTimeline: Sendable {
    /// A fault: what it was (`kill-node gateway for 1200 ms`), when it started and healed
    /// (milliseconds since 1970; `nil`: never healed in the history).
    public struct Fault: Sendable, Hashable {
        public var detail: String
        public var start: Int64
        public var end: Int64?

        /// Its kind: the first word of its detail (`kill-node`).
        public var kind: String { String(self.detail.split(separator: " ").first ?? "fault") }
    }

    /// In the order of their starts.
    public private(set) var faults: [Fault] = []

    public init(_ history: [HistoryRecord]) {
        var open: [String: [Int]] = [:]  // by detail: the faults started and not yet healed
        let acts = history.enumerated().filter { $0.element.kind == .fault || $0.element.kind == .kill }
            .sorted { ($0.element.time, $0.offset) < ($1.element.time, $1.offset) }.map(\.element)
        for record in acts {
            if record.kind == .kill {
                if record.phase != .fail {
                    self.faults.append(Fault(detail: "SIGKILL of \(record.peer ?? "?")", start: record.time, end: record.time))
                }
                continue
            }
            let detail = record.detail ?? ""
            switch record.phase {
            case .invoke:
                open[detail, default: []].append(self.faults.count)
                self.faults.append(Fault(detail: detail, start: record.time, end: nil))
            case .ok:
                guard var started = open[detail], !started.isEmpty else { continue }
                let index = started.removeFirst()
                open[detail] = started
                self.faults[index].end = max(record.time, self.faults[index].start)
            case .fail, .info:
                continue
            }
        }
    }

    /// The faults in force at some moment from `start` to `end` (milliseconds since 1970).
    public func inForce(from start: Int64, to end: Int64) -> [Fault] {
        self.faults.filter { $0.start <= end && ($0.end ?? .max) >= start }
    }
}
