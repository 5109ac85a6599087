import ArgumentParser
import Foundation
import TetherLab

struct Lab: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "The weak-network lab: packet loss, latency, blackholes, network switches, flapping and restarts.",
        discussion: """
            `tether lab run` starts a gateway process and clients, breaks their network as each scenario
            says, and writes results.json and REPORT.md. Packet loss and blackholes are real dropped
            packets (iptables) on loopback inside a network namespace the lab creates and deletes:
            that needs root, iptables and iproute2 (Debian: apt-get install iptables iproute2).
            Without them those scenarios are skipped, with the reason in the report.
            Plots: python3 Lab/plot.py DIRECTORY (needs matplotlib).
            """,
        subcommands: [List.self, Run.self, Report.self]
    )

    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the scenarios.")

        @Flag(help: "The short versions CI runs.")
        var quick = false

        func run() {
            for scenario in Scenario.catalog(quick: self.quick) {
                let root = scenario.needsPacketFilter ? " (needs root + iptables)" : ""
                print("\(scenario.name.padding(toLength: 16, withPad: " ", startingAt: 0)) \(scenario.summary)\(root)")
            }
        }
    }

    struct Run: AsyncParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Run scenarios and write the results and the report.")

        @Argument(help: "The scenarios to run (all if none; see `tether lab list`).")
        var scenarios: [String] = []

        @Flag(help: "Run the short versions (as CI does).")
        var quick = false

        @Option(help: "Where results.json, REPORT.md and the scenarios' files go.")
        var output = "lab-results"

        @Flag(help: "Do not create a network namespace: skip the scenarios that drop packets.")
        var noNamespace = false

        @Option(help: .hidden)
        var insideNamespace: String?

        func validate() throws {
            let known = Scenario.catalog(quick: self.quick).map(\.name)
            for name in self.scenarios where !known.contains(name) {
                throw ValidationError("unknown scenario '\(name)'; known: \(known.joined(separator: ", "))")
            }
        }

        func run() async throws {
            let selected = Scenario.catalog(quick: self.quick).filter { self.scenarios.isEmpty || self.scenarios.contains($0.name) }
            let executable = Self.executable()
            // Inside the lab's namespace packets can be dropped; outside, find out why not, once.
            var unavailable: String?
            if self.insideNamespace == nil, selected.contains(where: \.needsPacketFilter) {
                unavailable = PacketFilter.unavailableReason()
                if self.noNamespace {
                    unavailable = unavailable ?? "not run inside a lab network namespace (--no-namespace)"
                } else if let unavailable {
                    print("note: \(unavailable); the scenarios that drop packets are skipped")
                } else {
                    try self.runInNamespace(executable: executable)
                    return
                }
            }
            let lab = TetherLab.Lab(
                executable: executable,
                directory: self.output,
                packetFilter: self.insideNamespace == nil ? nil : try PacketFilter(),
                packetFilterUnavailable: unavailable
            )
            var results: [ScenarioResult] = []
            for scenario in selected {
                results.append(try await lab.run(scenario))
                try self.write(results)
            }
            print("\nwrote \(self.output)/results.json and \(self.output)/REPORT.md")
            for check in LabReport.targets(results) { print(check) }
        }

        private func write(_ results: [ScenarioResult]) throws {
            try FileManager.default.createDirectory(atPath: self.output, withIntermediateDirectories: true)
            let encoder = JSONEncoder()
            encoder.outputFormatting = [.sortedKeys]
            try encoder.encode(results).write(to: URL(fileURLWithPath: "\(self.output)/results.json"))
            let command = (["tether", "lab", "run"] + (self.quick ? ["--quick"] : []) + self.scenarios).joined(separator: " ")
            let report = LabReport.markdown(results, machine: LabReport.machine(), command: command)
            try report.write(toFile: "\(self.output)/REPORT.md", atomically: true, encoding: .utf8)
        }

        /// Runs this command again inside a new network namespace, then deletes the namespace.
        private func runInNamespace(executable: String) throws {
            let namespace = try LabNamespace()
            defer { namespace.remove() }
            print("lab network namespace: \(namespace.name)")
            fflush(nil)
            var arguments = ["lab", "run", "--output", self.output, "--inside-namespace", namespace.name] + self.scenarios
            if self.quick { arguments.append("--quick") }
            let status = try namespace.run([executable] + arguments)
            guard status == 0 else { throw ExitCode(status) }
        }

        private static func executable() -> String {
            #if os(Linux)
                if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") { return path }
            #endif
            return Bundle.main.executablePath ?? CommandLine.arguments[0]
        }
    }

    struct Report: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Write REPORT.md again from a results directory.")

        @Argument(help: "The directory holding results.json.")
        var directory = "lab-results"

        @Option(help: "The command line to credit in the report.")
        var command = "tether lab run"

        func run() throws {
            let data = try Data(contentsOf: URL(fileURLWithPath: "\(self.directory)/results.json"))
            let results = try JSONDecoder().decode([ScenarioResult].self, from: data)
            let report = LabReport.markdown(results, machine: LabReport.machine(), command: self.command)
            try report.write(toFile: "\(self.directory)/REPORT.md", atomically: true, encoding: .utf8)
            print(report)
        }
    }
}
