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
            var configuration = NemesisRun.Configuration(executable: try ChildProcess.tetherExecutable(), directory: "", seed: seed)
            configuration.faultySeconds = 25
            configuration.quietSeconds = 15
            let report = try await Self.run(configuration, command: "--seconds 25 --quiet 15")
            #expect(report.requestsAnswered > 50)
            if fixed != nil {
                let kinds = NemesisRun.Fault.allCases.filter { !$0.needsPostgres }.map(\.rawValue)
                #expect(Set(report.faults.keys) == Set(kinds), "every kind: \(report.faults)")
            }
        }

        @Test(
            "two nodes on a private PostgreSQL, two workers listing both: 25 s of SIGKILLs and SIGSTOPs of the nodes and the workers, PostgreSQL crashed and started again, its connections ended; then no anomaly, and every message finished within 40 s of the last fault (a seed drawn for this run)",
            .requires(.postgresql)
        )
        func cluster() async throws {
            try OutsideTool.postgresql.require()
            var configuration = NemesisRun.Configuration(
                executable: try ChildProcess.tetherExecutable(),
                directory: "",
                seed: UInt64.random(in: 0...UInt64.max)
            )
            configuration.nodes = 2
            configuration.faultySeconds = 25
            // After PostgreSQL crashes, a query on a connection it dropped can hang until the
            // store's 10 s operation timeout (PostgresNIO), sometimes twice: messages waited up to
            // 23.5 s after the last fault (seed 17638114970183012230). The bound says so, with
            // room for a third.
            configuration.quietSeconds = 50
            configuration.convergenceBound = .seconds(40)
            _ = try await Self.run(configuration, command: "--nodes 2 --seconds 25 --quiet 50 --bound 40")
        }

        /// Runs the nemesis in a directory of its own, and expects no anomaly and work done; the
        /// directory is kept when there is an anomaly. `command`: the options that run it again.
        static func run(_ configuration: NemesisRun.Configuration, command: String) async throws -> NemesisRun.Report {
            var configuration = configuration
            let seed = configuration.seed
            configuration.directory =
                FileManager.default.temporaryDirectory
                .appendingPathComponent("tether-nemesis-\(configuration.nodes)-\(seed)-\(UUID().uuidString)").path
            let report = try await NemesisRun(configuration: configuration).run { print("nemesis \(seed): \($0)") }
            #expect(
                report.anomalies.isEmpty,
                "seed \(seed) (tether lab nemesis --seed \(seed) \(command); its files: \(configuration.directory)):\n\(report.anomalies.prefix(5).joined(separator: "\n"))"
            )
            let acknowledged = report.sends["ok", default: 0]
            #expect(acknowledged > 300, "the workers worked through the faults: \(report.sends)")
            #expect(report.delivered >= acknowledged, "every acknowledged message delivered")
            #expect(report.faults.values.reduce(0, +) >= 5, "faults were injected: \(report.faults)")
            // What the faults must not do either: memory beyond the gateway's budget (512 MiB of
            // buffered bytes by default), descriptors left open once the workers stopped (a
            // node keeps up to its PostgreSQL pool's connections more than when it started).
            #expect(report.gateways.count == max(1, configuration.nodes))
            for (name, figures) in report.gateways {
                #expect(figures.peakResidentBytes < 768 << 20, "\(name): \(figures.peakResidentBytes >> 20) MiB at its peak")
                if let first = figures.firstDescriptors, let last = figures.lastDescriptors {
                    #expect(last <= first + 30, "\(name): \(first) descriptors at the start, \(last) at the end")
                }
            }
            if report.anomalies.isEmpty { try? FileManager.default.removeItem(atPath: configuration.directory) }
            return report
        }
    }
}
