import Foundation
import TetherHistory

/// The plot of a nemesis run (`throughput.svg`): operations invoked and messages acknowledged
/// and delivered per interval over the run, with every fault drawn as a bar in a row of its
/// kind, from its start to its heal.
///
/// ```swift
/// let svg = ThroughputPlot(records: try HistoryWriter.read(directory: "nemesis")).svg()
/// ```
struct ThroughputPlot {
    /// A fault: its kind (the first word of its detail), start and end in milliseconds.
    struct FaultSpan: Equatable {
        var kind: String
        var start: Int64
        var end: Int64
    }

    /// The counts per bucket: invoked, acknowledged, delivered.
    private(set) var invoked: [Int] = []
    private(set) var acknowledged: [Int] = []
    private(set) var delivered: [Int] = []
    private(set) var faults: [FaultSpan] = []
    /// The first record's time, and the bucket's length, in milliseconds.
    let origin: Int64
    let bucket: Int64

    /// - Parameter buckets: At most this many intervals across the run (each a whole number of seconds).
    init(records: [HistoryRecord], buckets: Int = 600) {
        let start = records.lazy.map(\.time).min() ?? 0
        let end = records.lazy.map(\.time).max() ?? start
        self.origin = start
        let seconds = max(1, (end - start + 999) / 1000)
        self.bucket = 1000 * max(1, (seconds + Int64(buckets) - 1) / Int64(buckets))
        let count = Int((end - start) / self.bucket) + 1
        self.invoked = Array(repeating: 0, count: count)
        self.acknowledged = self.invoked
        self.delivered = self.invoked
        for record in records {
            let index = Int((record.time - start) / self.bucket)
            switch (record.kind, record.phase) {
            case (.send, .invoke), (.request, .invoke), (.publish, .invoke): self.invoked[index] += 1
            case (.send, .ok): self.acknowledged[index] += 1
            case (.delivery, .ok): self.delivered[index] += 1
            default: continue
            }
        }
        // The faults from start to heal (kills are counted as their fault records, not twice);
        // one never healed (the run stopped first) lasts until the end.
        self.faults = FaultTimeline(records).faults.filter { !$0.detail.hasPrefix("SIGKILL of ") }.map { fault in
            FaultSpan(kind: fault.kind, start: fault.start, end: fault.end.map { max($0, fault.start + 1) } ?? end)
        }
        self.faults.sort { ($0.kind, $0.start) < ($1.kind, $1.start) }
    }

    /// The plot as an SVG document.
    func svg() -> String {
        let kinds = Array(Set(self.faults.map(\.kind))).sorted()
        let width = 1200.0
        let left = 150.0
        let right = 20.0
        let plotTop = 40.0
        let plotHeight = 300.0
        let rowHeight = 14.0
        let faultTop = plotTop + plotHeight + 40
        let height = faultTop + Double(max(kinds.count, 1)) * rowHeight + 40
        let span = Double(self.invoked.count) * Double(self.bucket)
        let xScale = (width - left - right) / max(span, 1)
        let peak = Double(max(self.invoked.max() ?? 1, self.acknowledged.max() ?? 1, self.delivered.max() ?? 1, 1))
        let perSecond = 1000 / Double(self.bucket)
        func x(_ milliseconds: Double) -> Double { left + milliseconds * xScale }
        func y(_ count: Int) -> Double { plotTop + plotHeight - Double(count) / peak * plotHeight }
        func line(_ counts: [Int]) -> String {
            counts.enumerated().map { index, count in
                String(format: "%.1f,%.1f", x((Double(index) + 0.5) * Double(self.bucket)), y(count))
            }.joined(separator: " ")
        }
        let palette = ["#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#ff7f0e", "#1f77b4", "#2ca02c"]
        var svg = """
            <svg xmlns="http://www.w3.org/2000/svg" width="\(Int(width))" height="\(Int(height))" font-family="sans-serif" font-size="11">
            <rect width="100%" height="100%" fill="white"/>
            <text x="\(left)" y="20" font-size="13">Operations per second over the run (\(self.bucket / 1000) s intervals), and the faults in force</text>

            """
        // Axes, and the peak's value.
        svg +=
            "<line x1=\"\(left)\" y1=\"\(plotTop + plotHeight)\" x2=\"\(width - right)\" y2=\"\(plotTop + plotHeight)\" stroke=\"black\"/>\n"
        svg += "<line x1=\"\(left)\" y1=\"\(plotTop)\" x2=\"\(left)\" y2=\"\(plotTop + plotHeight)\" stroke=\"black\"/>\n"
        svg += "<text x=\"\(left - 5)\" y=\"\(plotTop + 4)\" text-anchor=\"end\">\(String(format: "%.0f", peak * perSecond))/s</text>\n"
        svg += "<text x=\"\(left - 5)\" y=\"\(plotTop + plotHeight)\" text-anchor=\"end\">0</text>\n"
        let seconds = Int(span / 1000)
        let tick = max(1, seconds / 10)
        for second in stride(from: 0, through: seconds, by: tick) {
            let position = x(Double(second) * 1000)
            svg +=
                "<text x=\"\(String(format: "%.1f", position))\" y=\"\(plotTop + plotHeight + 14)\" text-anchor=\"middle\">\(second) s</text>\n"
        }
        for (counts, colour, name) in [
            (self.invoked, "#1f77b4", "invoked"), (self.acknowledged, "#2ca02c", "acknowledged"), (self.delivered, "#ff7f0e", "delivered"),
        ] {
            svg +=
                "<polyline fill=\"none\" stroke=\"\(colour)\" stroke-width=\"1.2\" points=\"\(line(counts))\"><title>\(name)</title></polyline>\n"
        }
        for (index, name) in ["invoked", "acknowledged", "delivered"].enumerated() {
            let colour = ["#1f77b4", "#2ca02c", "#ff7f0e"][index]
            let legendX = width - right - 330 + Double(index) * 110
            svg += "<rect x=\"\(legendX)\" y=\"\(plotTop - 14)\" width=\"10\" height=\"10\" fill=\"\(colour)\"/>"
            svg += "<text x=\"\(legendX + 14)\" y=\"\(plotTop - 5)\">\(name)</text>\n"
        }
        // One row per kind of fault.
        for (row, kind) in kinds.enumerated() {
            let top = faultTop + Double(row) * rowHeight
            let colour = palette[row % palette.count]
            let count = self.faults.filter { $0.kind == kind }.count
            svg += "<text x=\"\(left - 5)\" y=\"\(top + 10)\" text-anchor=\"end\" font-size=\"9\">\(kind) (\(count))</text>\n"
            for fault in self.faults where fault.kind == kind {
                let start = x(Double(fault.start - self.origin))
                let length = max(1, x(Double(fault.end - self.origin)) - start)
                svg += String(format: "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" ", start, top + 1, length, rowHeight - 3)
                svg += "fill=\"\(colour)\"/>"
            }
            svg += "\n"
        }
        svg += "</svg>\n"
        return svg
    }
}
