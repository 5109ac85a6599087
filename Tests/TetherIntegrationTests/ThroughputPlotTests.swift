import Testing
import TetherHistory

@testable import TetherLab

/// The nemesis run's plot: counts per interval, and each fault from its start to its heal.
@Suite("The nemesis run's plot")
struct ThroughputPlotTests {
    static func record(_ time: Int64, _ kind: HistoryRecord.Kind, _ phase: HistoryRecord.Phase, detail: String? = nil) -> HistoryRecord {
        HistoryRecord(time: time, process: "w1", kind: kind, phase: phase, detail: detail)
    }

    @Test("operations counted per second; faults paired by their detail, one still open at the end lasting to the last record")
    func countsAndFaults() {
        let records = [
            Self.record(1_000, .send, .invoke),
            Self.record(1_100, .request, .invoke),
            Self.record(1_200, .fault, .invoke, detail: "kill-node gateway for 500 ms"),
            Self.record(1_500, .send, .ok),
            Self.record(1_700, .fault, .ok, detail: "kill-node gateway for 500 ms"),
            Self.record(2_300, .delivery, .ok),
            Self.record(2_400, .fault, .invoke, detail: "fill-disk disk for 3000 ms"),
            Self.record(2_500, .fault, .info, detail: "while fill-disk disk for 3000 ms: /ready 503"),
            Self.record(3_999, .send, .invoke),
        ]
        let plot = ThroughputPlot(records: records)
        #expect(plot.bucket == 1_000 && plot.origin == 1_000)
        #expect(plot.invoked == [2, 0, 1])
        #expect(plot.acknowledged == [1, 0, 0])
        #expect(plot.delivered == [0, 1, 0])
        #expect(
            plot.faults == [
                .init(kind: "fill-disk", start: 2_400, end: 3_999),
                .init(kind: "kill-node", start: 1_200, end: 1_700),
            ]
        )
        let svg = plot.svg()
        #expect(svg.hasPrefix("<svg") && svg.hasSuffix("</svg>\n"))
        #expect(svg.contains("kill-node (1)") && svg.contains("fill-disk (1)"))
    }

    @Test("a long run is drawn in at most the asked number of intervals, each a whole number of seconds")
    func longRun() {
        let records = (0..<3_600).map { Self.record(Int64($0) * 1_000, .send, .invoke) }
        let plot = ThroughputPlot(records: records, buckets: 600)
        #expect(plot.bucket == 6_000)
        #expect(plot.invoked.count == 600 && plot.invoked.allSatisfy { $0 == 6 })
    }
}
