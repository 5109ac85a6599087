import ArgumentParser
import Foundation
import TetherCore
import TetherLab
import UnixSignals

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
        subcommands: [List.self, Run.self, Report.self, Nemesis.self, Restarts.self, Worker.self]
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
                    try self.runInNamespace()
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
        private func runInNamespace() throws {
            var arguments = ["lab", "run", "--output", self.output] + self.scenarios
            if self.quick { arguments.append("--quick") }
            try Lab.runInNamespace(arguments)
        }

        static func executable() -> String {
            #if os(Linux)
                if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") { return path }
            #endif
            return Bundle.main.executablePath ?? CommandLine.arguments[0]
        }
    }

    /// Runs `tether` with `arguments` and `--inside-namespace NAME` inside a new network
    /// namespace, then deletes the namespace; throws the command's exit status if it failed.
    static func runInNamespace(_ arguments: [String]) throws {
        let namespace = try LabNamespace()
        defer { namespace.remove() }
        print("lab network namespace: \(namespace.name)")
        fflush(nil)
        let status = try namespace.run([Run.executable()] + arguments + ["--inside-namespace", namespace.name])
        guard status == 0 else { throw ExitCode(status) }
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

    struct Nemesis: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Workers record a history while faults are injected at random; the history is then checked.",
            discussion: """
                Starts `tether serve` (SQLite store) and `tether lab worker` processes that send reliable
                messages to each other, make requests, and publish to channels they subscribe to,
                recording every invocation and outcome; kills and pauses them and the gateway at moments
                drawn from the seed; then lets them finish and checks the history (every acknowledged
                message delivered once, in order; nothing delivered that was not sent or was refused;
                requests answered at most once; every acknowledged publication received by each
                subscriber once and in order, or inside a gap event). Writes
                report.json (and anomalies.txt) to --output; exits 1 if there is an anomaly.

                As root, it runs in a network namespace of its own, which adds partitions, packet
                loss and TCP blocked (iptables), packets delayed and reordered (NFQUEUE, with the
                NetfilterQueue package), and a full or read-only disk under the SQLite store. SIGTERM
                or SIGINT stops the run and everything it started.
                """
        )

        @Option(help: "The seed (the same seed draws the same faults at the same moments); random if absent.")
        var seed: UInt64?

        @Option(help: "Seconds of work with faults.")
        var seconds: Double = 40

        @Option(help: "Seconds of quiet after the faults, for the workers to receive what is left.")
        var quiet: Double = 20

        @Option(help: "Workload processes.")
        var workers = 2

        @Option(help: "Clients in each workload process.")
        var clients = 3

        @Option(help: "Gateways: 1 with an SQLite store, or 2 and more on a private PostgreSQL server (needs PostgreSQL's binaries).")
        var nodes = 1

        @Option(
            help:
                "The kinds of fault, comma-separated (default: all of \(NemesisRun.Fault.allCases.map(\.rawValue).joined(separator: ", ")))."
        )
        var faults: String?

        @Option(
            help:
                "Seconds after the last fault within which every acknowledged message must be delivered, and every message have its outcome."
        )
        var bound: Double = 15

        @Option(help: "Where the store, histories, logs and report go.")
        var output = "nemesis"

        @Option(help: "The mean time between the starts of two faults, in seconds.")
        var gap: Double = 2

        @Option(help: "Seconds between one client's operations.")
        var interval: Double = 0.025

        @Option(help: "Channels the clients subscribe to (each to one) and publish to (0: no channel operations).")
        var channels = 2

        @Flag(help: "Every client on TCP (by default, clients are spread over TCP, WebSocket and the HTTP stream).")
        var tcpOnly = false

        @Flag(help: "Do not create a network namespace: no partitions, packet loss, delays or disk faults.")
        var noNamespace = false

        @Option(help: .hidden)
        var insideNamespace: String?

        func validate() throws {
            guard self.gap > 0 else { throw ValidationError("--gap must be positive") }
            guard self.channels >= 0 else { throw ValidationError("--channels must not be negative") }
            guard self.seconds > 0, self.quiet > 0, self.workers > 0, self.clients > 0, self.workers * self.clients >= 2, self.nodes > 0
            else {
                throw ValidationError(
                    "--seconds, --quiet, --workers, --clients and --nodes must be positive, with at least two clients in all"
                )
            }
            for name in self.faults?.split(separator: ",") ?? [] where NemesisRun.Fault(rawValue: String(name)) == nil {
                throw ValidationError("--faults: unknown fault '\(name)'")
            }
        }

        func run() async throws {
            let seed = self.seed ?? UInt64.random(in: 0...UInt64.max)
            if self.insideNamespace == nil && !self.noNamespace {
                if let unavailable = PacketFilter.unavailableReason() {
                    print("note: \(unavailable); no partitions, packet loss or full disk in this run")
                } else {
                    // The same command, with the seed drawn here, in a namespace of its own.
                    var arguments = Array(CommandLine.arguments.dropFirst())
                    if self.seed == nil { arguments += ["--seed", "\(seed)"] }
                    try Lab.runInNamespace(arguments)
                    return
                }
            }
            var configuration = NemesisRun.Configuration(executable: Run.executable(), directory: self.output, seed: seed)
            configuration.namespace = self.insideNamespace != nil
            configuration.meanGap = try duration(seconds: self.gap, option: "gap")
            configuration.interval = try duration(seconds: self.interval, option: "interval")
            configuration.faultySeconds = self.seconds
            configuration.quietSeconds = self.quiet
            configuration.workers = self.workers
            configuration.clientsPerWorker = self.clients
            configuration.nodes = self.nodes
            configuration.channels = self.channels
            configuration.everyTransport = !self.tcpOnly
            configuration.convergenceBound = try duration(seconds: self.bound, option: "bound")
            if let faults = self.faults {
                configuration.faults = faults.split(separator: ",").compactMap { NemesisRun.Fault(rawValue: String($0)) }
            }
            let run = NemesisRun(configuration: configuration)
            // SIGTERM or SIGINT cancels the run: on its way out it kills its workers and gateways
            // (and PostgreSQL), lets paused ones go, and removes its rules and its disk; the
            // process that made the namespace then deletes it.
            let finished = try await withThrowingTaskGroup(of: NemesisRun.Report?.self) { group in
                group.addTask { try await run.run { print($0) } }
                group.addTask {
                    for await signal in await UnixSignalsSequence(trapping: .sigterm, .sigint) {
                        print("\(signal): stopping the run, its processes and its faults")
                        return nil
                    }
                    return nil  // the run ended first
                }
                defer { group.cancelAll() }
                return try await group.next() ?? nil
            }
            guard let report = finished else { throw ExitCode(130) }
            for anomaly in report.anomalies.prefix(20) { print(anomaly) }
            if !report.anomalies.isEmpty { throw ExitCode(1) }
        }
    }

    struct Restarts: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Kills and restarts a gateway, cuts a client's connection again and again, and counts descriptors.",
            discussion: """
                Starts `tether serve` (SQLite store) and a client in this process behind a fault proxy;
                kills the gateway and starts it again --gateway-restarts times, then cuts every
                connection --cycles times, each time waiting until the client answers a request again.
                Counts this process's descriptors and the gateway's after the first 20 cycles and at
                the end, and writes restarts.json to --output.
                """
        )

        @Option(help: "Connections cut (each followed by a reconnection and a request).")
        var cycles = 1000

        @Option(help: "Gateway processes killed and started again, before the cycles.")
        var gatewayRestarts = 10

        @Option(help: "Where the gateway's store and log, and restarts.json, go.")
        var output = "restarts"

        func validate() throws {
            guard self.cycles >= 20, self.gatewayRestarts >= 0 else {
                throw ValidationError("--cycles must be at least 20 (the warm-up), --gateway-restarts not negative")
            }
        }

        func run() async throws {
            var configuration = RestartsRun.Configuration(executable: Run.executable(), directory: self.output)
            configuration.cycles = self.cycles
            configuration.gatewayRestarts = self.gatewayRestarts
            _ = try await RestartsRun(configuration: configuration).run { print($0) }
        }
    }

    struct Worker: AsyncParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "A workload process of `tether lab nemesis`: clients that record a history.",
            shouldDisplay: false
        )

        @Option var name: String
        @Option(help: "Its client ids, comma-separated.") var clients: String
        @Option(help: "Every client id of the run, comma-separated.") var everyone: String
        @Option(help: "Client ids of other workers to run a second device of (its own outbox; sends, no deliveries), comma-separated.")
        var twins = ""
        @Option(help: "Gateway endpoints, comma-separated.") var endpoints: String
        @Option(help: "The gateways' WebSocket and HTTP-stream ports, in the same order (none: every client on TCP).") var webPorts = ""
        @Option var directory: String
        @Option(help: "Stop sending at this wall time (ms since 1970).") var sendUntil: Int64
        @Option(help: "Stop at this wall time (ms since 1970).") var stopAt: Int64
        @Option var seed: UInt64 = 0
        @Option(help: "Heartbeat interval in seconds.") var heartbeat: Double = 1
        @Option(help: "Seconds between one client's operations.") var interval: Double = 0.025
        @Option(help: "Channels to subscribe and publish to, comma-separated (none: no channel operations).") var channels = ""
        @Option(help: "With channels, one operation in this many (not counting requests) is a publication.") var publishEvery = 4

        func validate() throws {
            guard self.publishEvery > 0 else { throw ValidationError("--publish-every must be positive") }
        }

        func run() async throws {
            let endpoints = try self.endpoints.split(separator: ",").map { try Endpoint(parsing: String($0)) }
            var configuration = HistoryWorker.Configuration(
                name: self.name,
                clients: self.clients.split(separator: ",").map(String.init),
                everyone: self.everyone.split(separator: ",").map(String.init),
                endpoints: endpoints,
                directory: self.directory,
                sendUntil: self.sendUntil,
                stopAt: self.stopAt,
                seed: self.seed
            )
            configuration.heartbeat = try duration(seconds: self.heartbeat, option: "heartbeat")
            configuration.interval = try duration(seconds: self.interval, option: "interval")
            configuration.channels = self.channels.split(separator: ",").map(String.init)
            configuration.twins = self.twins.split(separator: ",").map(String.init)
            configuration.webPorts = try self.webPorts.split(separator: ",").map {
                guard let port = Int($0), (1...65_535).contains(port) else { throw ValidationError("--web-ports: '\($0)' is not a port") }
                return port
            }
            guard configuration.webPorts.isEmpty || configuration.webPorts.count == endpoints.count else {
                throw ValidationError("--web-ports needs one port per endpoint (\(endpoints.count)), got \(configuration.webPorts.count)")
            }
            configuration.publishEvery = self.publishEvery
            try await HistoryWorker(configuration: configuration).run()
        }
    }
}
