import Foundation
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

/// The nemesis reads each process's log for crashes: the nemesis only kills with SIGKILL, so a
/// backtrace or a fatal error is a crash of Tether's (or a library's) own.
@Suite("The nemesis's crash finder")
struct NemesisCrashTests {
    @Test(
        "a backtrace is one crash, with what failed and the crashed thread's first frames; a fatal error alone is one; a log without either has none"
    )
    func crashesInLogs() throws {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-crashes-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let backtrace = """
            2026-12-02T02:28:47+0000 warning tether.gateway: error=storage: PostgreSQL: serverClosedConnection
            Fatal error: How can we receive a body part, after a channelReadComplete
            *** Signal 4: Backtracing from 0x556bb3d0cb9c... done ***

            *** Swift runtime failure: precondition failure ***

            Thread 0 "tether":

              0      0x00007fa2d505a301 sigsuspend + 65 in libc.so.6

            Thread 4 crashed:

              0 [inlined] [system] 0x0000556bb3d0cb9c Swift runtime failure: precondition failure in tether
              1                    0x0000556bb3d0cb9c RowStreamStateMachine.channelReadComplete() + 172 in tether
              2 [ra]               0x0000556bb3c49bde ExtendedQueryStateMachine.channelReadComplete() + 253 in tether

            Backtrace took 0.52s
            2026-12-02T02:29:07+0000 warning tether.serve: [TetherCLI] no --jwt-key
            """
        let fatal = "starting\nTether/Outbox.swift:88: Fatal error: the outbox's file vanished\n"
        let files = [("backtrace.log", backtrace), ("fatal.log", fatal), ("clean.log", "warning: a gateway restarted\n")]
        for (name, text) in files { try text.write(to: directory.appendingPathComponent(name), atomically: true, encoding: .utf8) }

        let crashes = NemesisRun.crashes(inLog: directory.appendingPathComponent("backtrace.log").path)
        try #require(crashes.count == 1, "the fatal error and its backtrace are one crash: \(crashes)")
        #expect(crashes[0].first?.hasPrefix("*** Signal 4") == true)
        #expect(crashes[0].contains("*** Swift runtime failure: precondition failure ***"))
        #expect(crashes[0].contains { $0.contains("RowStreamStateMachine.channelReadComplete()") })
        #expect(
            NemesisRun.crashes(inLog: directory.appendingPathComponent("fatal.log").path).map(\.first) == [
                "Tether/Outbox.swift:88: Fatal error: the outbox's file vanished"
            ]
        )
        #expect(NemesisRun.crashes(inLog: directory.appendingPathComponent("clean.log").path).isEmpty)
        #expect(NemesisRun.crashes(inLog: directory.appendingPathComponent("missing.log").path).isEmpty)
    }
}
