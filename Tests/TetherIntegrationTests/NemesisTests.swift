import Foundation
import Testing
import TetherLab
import TetherTestSupport

extension IntegrationTests {
    /// Issue 44's CI run: workers in processes of their own record a history while the nemesis
    /// kills and pauses them and the gateway at moments drawn from a seed; the checker then
    /// searches the whole history (`Proposals/0003-nemesis-and-checker.md`).
    @Suite("The nemesis: faults at random moments, a recorded history, a checker", .timeLimit(.minutes(4)))
    struct NemesisTests {
        @Test(
            "one gateway on SQLite, two workers of three clients: 25 s of SIGKILLs and SIGSTOPs of the gateway and the workers, then no anomaly in the history (a fixed seed, and one drawn for this run)",
            arguments: [UInt64(44), nil]
        )
        func singleNode(seed fixed: UInt64?) async throws {
            let seed = fixed ?? UInt64.random(in: 0...UInt64.max)
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-nemesis-\(seed)-\(UUID().uuidString)")
                .path
            var configuration = NemesisRun.Configuration(executable: try ChildProcess.tetherExecutable(), directory: directory, seed: seed)
            configuration.faultySeconds = 25
            configuration.quietSeconds = 15
            let report = try await NemesisRun(configuration: configuration).run { print("nemesis \(seed): \($0)") }
            #expect(
                report.anomalies.isEmpty,
                "seed \(seed) (tether lab nemesis --seed \(seed) --seconds 25 --quiet 15; its files: \(directory)):\n\(report.anomalies.prefix(5).joined(separator: "\n"))"
            )
            let acknowledged = report.sends["ok", default: 0]
            #expect(acknowledged > 300, "the workers worked through the faults: \(report.sends)")
            #expect(report.delivered >= acknowledged, "every acknowledged message delivered")
            #expect(report.requestsAnswered > 50)
            #expect(report.faults.values.reduce(0, +) >= 5, "faults were injected: \(report.faults)")
            if fixed != nil {
                let kinds = NemesisRun.Fault.allCases.filter { !$0.needsPostgres }.map(\.rawValue)
                #expect(Set(report.faults.keys) == Set(kinds), "every kind: \(report.faults)")
            }
            if report.anomalies.isEmpty { try? FileManager.default.removeItem(atPath: directory) }
        }

        @Test(
            "two nodes on a private PostgreSQL, two workers listing both: 25 s of SIGKILLs and SIGSTOPs of the nodes and the workers, PostgreSQL crashed and started again, its connections ended; then no anomaly, and every message finished within 30 s of the last fault (a seed drawn for this run)",
            .requires(.postgresql)
        )
        func cluster() async throws {
            try OutsideTool.postgresql.require()
            let seed = UInt64.random(in: 0...UInt64.max)
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-nemesis-cluster-\(seed)").path
            var configuration = NemesisRun.Configuration(executable: try ChildProcess.tetherExecutable(), directory: directory, seed: seed)
            configuration.nodes = 2
            configuration.faultySeconds = 25
            // After PostgreSQL crashes, a query on a connection it dropped can hang until the
            // store's 10 s operation timeout (PostgresNIO), sometimes twice: messages waited up to
            // 23.5 s after the last fault (seed 17638114970183012230). The bound says so.
            configuration.quietSeconds = 40
            configuration.convergenceBound = .seconds(30)
            let report = try await NemesisRun(configuration: configuration).run { print("nemesis cluster \(seed): \($0)") }
            #expect(
                report.anomalies.isEmpty,
                "seed \(seed) (tether lab nemesis --nodes 2 --seed \(seed) --seconds 25 --quiet 40 --bound 30; its files: \(directory)):\n\(report.anomalies.prefix(5).joined(separator: "\n"))"
            )
            let acknowledged = report.sends["ok", default: 0]
            #expect(acknowledged > 300, "the workers worked through the faults: \(report.sends)")
            #expect(report.delivered >= acknowledged)
            #expect(report.faults.values.reduce(0, +) >= 5, "faults were injected: \(report.faults)")
            if report.anomalies.isEmpty { try? FileManager.default.removeItem(atPath: directory) }
        }
    }
}
