import Foundation
import TetherCore
import TetherHistory
import TetherNIO
import TetherPostgres
import TetherProcess

/// A run of the nemesis (issue 44, `Proposals/0003-nemesis-and-checker.md`): gateway
/// processes (`tether serve`: one with its SQLite store, or a cluster of nodes on a private
/// PostgreSQL server), workload processes (`tether lab worker`, ``HistoryWorker``) recording a
/// history, and faults drawn from a seed and injected at random moments while they work; then
/// a quiet period, and ``HistoryChecker`` over every record.
///
/// The faults: SIGKILL of a worker (started again after a while, on the same files) or of a
/// gateway (started again on the same store), SIGSTOP of either (SIGCONT after a while); with a
/// cluster, PostgreSQL crashed (`pg_ctl stop -m immediate`) and started again, and every
/// connection to it ended (`pg_terminate_backend`). Each is logged in the history
/// (`history-nemesis.jsonl`) when it starts and when it is healed. A process (PostgreSQL too)
/// is the target of one fault at a time; faults on different processes overlap.
///
/// ```swift
/// let report = try await NemesisRun(configuration: .init(executable: tether, directory: "nemesis", seed: 7)).run { print($0) }
/// print(report.anomalies.isEmpty ? "no anomaly" : report.anomalies.joined(separator: "\n"))
/// ```
public struct NemesisRun: Sendable {
    public let configuration: Configuration

    public init(configuration: Configuration) {
        self.configuration = configuration
    }

    /// Runs, checks the history, writes `report.json`, `throughput.svg` (operations per second
    /// with the faults marked) and `anomalies.txt` when there are any.
    /// - Parameter say: Progress, one line at a time.
    public func run(say: @escaping @Sendable (String) -> Void = { _ in }) async throws -> Report {
        let configuration = self.configuration
        let directory = configuration.directory
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        let started = ContinuousClock.now
        let nemesis = try HistoryWriter(path: "\(directory)/history-nemesis.jsonl", process: "nemesis")
        // In the run's own namespace: its iptables rules, and a small disk for an SQLite store.
        let filter = configuration.namespace ? try PacketFilter() : nil
        defer { try? filter?.clear() }
        let disk = configuration.namespace && configuration.nodes == 1 ? try SmallDisk(path: "\(directory)/disk", megabytes: 256) : nil
        defer { disk?.unmount() }

        var startedPostgres: LocalPostgres?
        var gateways: [GatewayProcess] = []
        if configuration.nodes > 1 {
            var server = try LocalPostgres(
                directory: URL(fileURLWithPath: "\(directory)/postgres"),
                port: try await GatewayProcess.freePort()
            )  // below the ephemeral range, as the gateways'
            // Node N reaches it at 127.0.0.(N+1): one node's packets can be told from another's.
            server.listenAddresses = ["127.0.0.1"] + (1...configuration.nodes).map { Self.postgresAddress(node: $0) }
            try server.start(fsync: false)  // a crash of the server's process loses nothing the OS holds
            startedPostgres = server
            for index in 1...configuration.nodes {
                gateways.append(
                    GatewayProcess(
                        executable: configuration.executable,
                        port: try await GatewayProcess.freePort(),
                        store: "",
                        heartbeat: configuration.heartbeat,
                        logFile: "\(directory)/node-\(index).log",
                        httpPort: configuration.everyTransport ? try await GatewayProcess.freePort() : nil,
                        postgres: (
                            "postgres://tether@\(Self.postgresAddress(node: index)):\(server.port)/tether?sslmode=disable", "node-\(index)"
                        ),
                        extraArguments: Self.channelArguments
                    )
                )
            }
        } else {
            gateways.append(
                GatewayProcess(
                    executable: configuration.executable,
                    port: try await GatewayProcess.freePort(),
                    store: "\(disk?.path ?? directory)/gateway.sqlite",
                    heartbeat: configuration.heartbeat,
                    logFile: "\(directory)/gateway.log",
                    httpPort: configuration.everyTransport ? try await GatewayProcess.freePort() : nil,
                    adminPort: disk == nil ? nil : try await GatewayProcess.freePort(),  // /ready, while its disk is full
                    // A disk the kernel stops writing to drops what the page cache held, as a
                    // power loss does: only commits flushed one by one survive it.
                    extraArguments: Self.channelArguments + (disk?.canTurnReadOnly == true ? ["--full-sync"] : [])
                )
            )
        }
        let postgres = startedPostgres
        defer {
            for gateway in gateways { gateway.kill() }
            postgres?.destroy()
        }
        for gateway in gateways { try await gateway.start() }
        disk?.flush()  // the store's file, as on a disk that has been up for a while
        let gatewayNames = gateways.count == 1 ? ["gateway"] : (1...gateways.count).map { "node-\($0)" }
        let sampler = ProcessSampler()
        let observed = gateways
        let sampling = Task {
            while !Task.isCancelled {
                sampler.sample(zip(gatewayNames, observed).map { ($0, $1.processIdentifier) })
                try? await Task.sleep(for: .milliseconds(500))
            }
        }
        defer { sampling.cancel() }
        let nodes = gateways.count
        var faults = configuration.faults.filter {
            $0.isAvailable(nodes: nodes, namespace: configuration.namespace, everyTransport: configuration.everyTransport)
        }
        if configuration.namespace, configuration.faults.contains(.delayPackets), let reason = PacketDelay.unavailableReason {
            say("no delay-packets: \(reason)")
        }
        if faults.contains(.readOnlyDisk), disk?.canTurnReadOnly != true {
            faults.removeAll { $0 == .readOnlyDisk }
            say("no read-only-disk: the store's disk is not ext4 on a loop device (mkfs.ext4 and loop devices are needed)")
        }

        let names = (1...configuration.workers).map { "w\($0)" }
        let clients = names.map { name in (1...configuration.clientsPerWorker).map { "\(name)c\($0)" } }
        let everyone = clients.flatMap { $0 }
        let sendUntil = HistoryWriter.now() + Int64(configuration.faultySeconds * 1000)
        let stopAt = sendUntil + Int64(configuration.quietSeconds * 1000)
        let workers = names.enumerated().map { index, name in
            WorkerProcess(
                name: name,
                arguments: [
                    configuration.executable, "lab", "worker", "--name", name,
                    "--clients", clients[index].joined(separator: ","), "--everyone", everyone.joined(separator: ","),
                    // A second device of the next worker's first client (its own outbox).
                    "--twins", names.count > 1 ? clients[(index + 1) % names.count][0] : "",
                    // Every node, each worker's first a different one.
                    "--endpoints", (0..<nodes).map { "tether://127.0.0.1:\(gateways[(index + $0) % nodes].port)" }.joined(separator: ","),
                    "--web-ports",
                    (0..<nodes).compactMap { gateways[(index + $0) % nodes].httpPort.map(String.init) }.joined(separator: ","),
                    "--directory", directory,
                    "--send-until", "\(sendUntil)", "--stop-at", "\(stopAt)",
                    "--seed", "\(configuration.seed &+ UInt64(index + 1))",
                    "--heartbeat", "\(configuration.heartbeat.totalSeconds)",
                    "--interval", "\(configuration.interval.totalSeconds)",
                    "--channels", (0..<configuration.channels).map { "nemesis.room\($0 + 1)" }.joined(separator: ","),
                ],
                logFile: "\(directory)/worker-\(name).log"
            )
        }
        for worker in workers { try worker.start() }
        defer { for worker in workers { worker.kill() } }
        say(
            "\(nodes == 1 ? "a gateway on SQLite" : "\(nodes) nodes on PostgreSQL"); \(workers.count) workers, \(everyone.count) clients"
                + (configuration.everyTransport ? " over TCP, WebSocket and the HTTP stream" : " over TCP")
                + (configuration.channels > 0 ? ", \(configuration.channels) channels" : "")
                + "; faults until \(configuration.faultySeconds) s, seed \(configuration.seed)"
        )

        // The faults, until the workers stop sending.
        let counts = TetherLock<[String: Int]>([:])
        let readyRefusals = TetherLock<[String: Int]>([:])
        let delayed = TetherLock<(packets: Int, reordered: Int)>((0, 0))
        let busy = TetherLock<Set<String>>([])
        var generator = SplitMix64(seed: configuration.seed)
        try await withThrowingTaskGroup(of: Void.self) { group in
            while true {
                let mean = Double(configuration.meanGap.totalSeconds)
                let gap = mean * (0.25 + 1.5 * generator.nextUnit())
                let drawn = 0.2 + (configuration.longestFault.totalSeconds - 0.2) * generator.nextUnit()
                let kind = faults.isEmpty ? nil : faults[Int(generator.next() % UInt64(faults.count))]
                let worker = workers[Int(generator.next() % UInt64(workers.count))]
                let node = Int(generator.next() % UInt64(nodes))
                let gateway = gateways[node]
                try await Task.sleep(for: .milliseconds(Int64(gap * 1000)))
                let length = kind == .partitionNode || kind == .blockTCP ? drawn * 2 : drawn
                // A delay's mean, jitter and seed (drawn for a delay only).
                let delay = kind == .delayPackets ? 0.02 + 0.23 * generator.nextUnit() : 0
                let jitter = kind == .delayPackets ? delay * generator.nextUnit() : 0
                let delaySeed = kind == .delayPackets ? generator.next() : 0
                guard HistoryWriter.now() + Int64(length * 1000) < sendUntil else { break }
                guard let kind else { continue }  // no kind of fault: a run without faults
                let nodeName = nodes == 1 ? "gateway" : "node-\(node + 1)"
                let target: String
                switch kind {
                case .killWorker, .pauseWorker: target = worker.name
                case .killNode, .pauseNode: target = nodeName
                case .restartPostgres, .terminateConnections, .readOnlyPostgres: target = "postgres"
                // A process's network is a target apart from the process: a node may be cut
                // off and killed at once.
                case .partitionNode, .losePackets, .delayPackets: target = "network of \(nodeName)"
                case .partitionPostgres: target = "\(nodeName) to postgres"
                case .fillDisk, .readOnlyDisk: target = "disk"
                case .blockTCP: target = "tcp"
                }
                // One fault at a time on a process: a draw that finds it busy is skipped. The
                // read-only disk's repair stops and starts the gateway: it takes both.
                let claims = kind == .readOnlyDisk ? [target, nodeName] : [target]
                let claimed = busy.withLockedValue { busy in
                    guard busy.isDisjoint(with: claims) else { return false }
                    busy.formUnion(claims)
                    return true
                }
                guard claimed else { continue }
                counts.withLockedValue { $0[kind.rawValue, default: 0] += 1 }
                group.addTask {
                    defer { busy.withLockedValue { $0.subtract(claims) } }
                    let detail =
                        "\(kind.rawValue) \(target) for \(Int(length * 1000)) ms"
                        + (kind == .delayPackets ? " (\(Int(delay * 1000)) ± \(Int(jitter * 1000)) ms a packet)" : "")
                    nemesis.record(.fault, .invoke, detail: detail)
                    switch kind {
                    case .killWorker:
                        worker.kill()
                        nemesis.record(.kill, .ok, peer: worker.name)
                        try await Task.sleep(for: .milliseconds(Int64(length * 1000)))
                        try worker.start()
                    case .pauseWorker:
                        worker.signal(SIGSTOP)
                        try await Task.sleep(for: .milliseconds(Int64(length * 1000)))
                        worker.signal(SIGCONT)
                    case .killNode:
                        gateway.kill()
                        try await Task.sleep(for: .milliseconds(Int64(length * 1000)))
                        try await Self.restart(gateway, named: target, nemesis)
                    case .pauseNode:
                        gateway.signal(SIGSTOP)
                        try await Task.sleep(for: .milliseconds(Int64(length * 1000)))
                        gateway.signal(SIGCONT)
                    case .restartPostgres:
                        try postgres?.stop(immediately: true)
                        try await Task.sleep(for: .milliseconds(Int64(length * 1000)))
                        try postgres?.start(fsync: false)
                    case .terminateConnections:
                        _ = try await postgres?.terminateConnections()
                    case .readOnlyPostgres:
                        try await postgres?.setReadOnly(true)
                        try await Task.sleep(for: .milliseconds(Int64(length * 1000)))
                        try await postgres?.setReadOnly(false)
                    case .partitionNode, .losePackets, .partitionPostgres, .blockTCP:
                        guard let filter else { break }
                        // A gateway's ports: TCP, and WebSocket and the HTTP stream.
                        let ports = [gateway.port] + (gateway.httpPort.map { [$0] } ?? [])
                        let rules =
                            switch kind {
                            case .partitionPostgres:
                                try filter.block(port: postgres?.port ?? 0, address: Self.postgresAddress(node: node + 1))
                            case .blockTCP: try observed.flatMap { try filter.block(port: $0.port, reset: true) }  // every gateway's
                            default: try ports.flatMap { try filter.block(port: $0, probability: kind == .losePackets ? 0.3 : 1) }
                            }
                        try await Task.sleep(for: .milliseconds(Int64(length * 1000)))
                        try filter.remove(rules)
                    case .delayPackets:
                        guard let filter else { break }
                        // The lab's program, not Tether, failed: said, and the run goes on.
                        func programFailed(_ error: any Error) {
                            nemesis.record(.fault, .info, detail: "\(detail): the delaying program failed: \(error)")
                            say("delay-packets: the delaying program failed: \(error)")
                        }
                        // A queue per node: one fault at a time on a node's network.
                        let queue = node + 1
                        let holder: PacketDelay
                        do {
                            holder = try await PacketDelay.start(
                                queue: queue,
                                mean: .milliseconds(Int64(delay * 1000)),
                                jitter: .milliseconds(Int64(jitter * 1000)),
                                seed: delaySeed,
                                directory: directory
                            )
                        } catch is CancellationError {
                            throw CancellationError()
                        } catch {
                            programFailed(error)
                            break
                        }
                        do {
                            let ports = [gateway.port] + (gateway.httpPort.map { [$0] } ?? [])
                            let rules = try ports.flatMap { try filter.queue(port: $0, queue: queue) }
                            try await Task.sleep(for: .milliseconds(Int64(length * 1000)))
                            try filter.remove(rules)
                        } catch {
                            _ = try? await holder.stop()  // SIGTERM: it lets its packets go and ends
                            throw error
                        }
                        do {
                            let summary = try await holder.stop()
                            delayed.withLockedValue { $0 = ($0.packets + summary.delayed, $0.reordered + summary.reordered) }
                            nemesis.record(.fault, .info, detail: "\(detail): \(summary)")
                        } catch is CancellationError {
                            throw CancellationError()
                        } catch {
                            programFailed(error)
                        }
                    case .fillDisk, .readOnlyDisk:
                        guard let disk else { break }
                        if kind == .fillDisk { try disk.fill() } else { try disk.turnReadOnly() }
                        // Whether /ready says the store is failing meanwhile (if a commit
                        // needed the disk: SQLite reuses its log's space).
                        let until = ContinuousClock.now + .milliseconds(Int64(length * 1000))
                        var said: String?
                        while ContinuousClock.now < until {
                            if said == nil, let ready = await gateway.readiness(), ready.status == 503, ready.body.contains("store failing")
                            {
                                said = ready.body
                            }
                            try await Task.sleep(for: .milliseconds(100))
                        }
                        if kind == .fillDisk {
                            disk.free()
                        } else {
                            gateway.kill()
                            if let fixed = try disk.repair() {
                                let lines = fixed.split(separator: "\n").filter { !$0.hasPrefix("Pass ") && !$0.hasPrefix("e2fsck ") }
                                nemesis.record(
                                    .fault,
                                    .info,
                                    detail: "e2fsck after \(detail): \(lines.joined(separator: "; ").prefix(600))"
                                )
                            }
                            try await Self.restart(gateway, named: nodeName, nemesis)
                        }
                        if let said {
                            readyRefusals.withLockedValue { $0[kind.rawValue, default: 0] += 1 }
                            nemesis.record(.fault, .info, detail: "while \(detail): /ready 503 \(said.prefix(200))")
                        }
                    }
                    nemesis.record(.fault, .ok, detail: detail)
                }
            }
            try await group.waitForAll()
        }
        say(
            "faults over: \(counts.withLockedValue { $0 }.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))"
        )

        // The quiet period: the workers receive until they stop on their own.
        for worker in workers {
            let deadline = ContinuousClock.now + .seconds(configuration.quietSeconds + 30)
            while worker.isRunning && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(100)) }
            if worker.isRunning { say("\(worker.name) did not stop on its own: killed") }
        }

        // The last sample: the workers have stopped and closed their connections.
        try await Task.sleep(for: .seconds(1))
        sampling.cancel()
        sampler.sample(zip(gatewayNames, gateways).map { ($0, $1.processIdentifier) })
        let records = try HistoryWriter.read(directory: directory)
        let result = HistoryChecker.check(records, convergenceBound: configuration.convergenceBound)
        var anomalies: [String] = []
        for anomaly in result.anomalies {
            let excerpt = anomaly.records.compactMap { try? String(decoding: JSONEncoder().encode($0), as: UTF8.self) }
            let faults = anomaly.faultsInForce.isEmpty ? "none" : anomaly.faultsInForce.joined(separator: "; ")
            anomalies.append(
                ([anomaly.description, "  faults in force: \(faults)"] + excerpt.map { "    \($0)" }).joined(separator: "\n")
            )
        }
        // A process that crashed (the nemesis only kills with SIGKILL, which leaves no trace in
        // a log): an anomaly even when the others covered for it and nothing was lost.
        let logs = zip(gatewayNames, gateways.map(\.logFile)) + workers.map { ($0.name, $0.logFile) }
        for (name, log) in logs {
            for crash in Self.crashes(inLog: log) {
                anomalies.append("\(name) crashed (\(log)):\n" + crash.map { "    \($0)" }.joined(separator: "\n"))
            }
        }
        let report = Report(
            seed: configuration.seed,
            seconds: (ContinuousClock.now - started).totalSeconds,
            operations: records.filter { $0.phase == .invoke && ($0.kind == .send || $0.kind == .request || $0.kind == .publish) }.count,
            sends: Dictionary(uniqueKeysWithValues: result.sends.map { ($0.key.rawValue, $0.value) }),
            delivered: result.delivered,
            repeatsAfterKills: result.repeatsAfterKills,
            requestsAnswered: result.requestsAnswered,
            publishes: Dictionary(uniqueKeysWithValues: result.publishes.map { ($0.key.rawValue, $0.value) }),
            received: result.received,
            receivedAgainAfterKills: result.receivedAgainAfterKills,
            gapPositions: result.gapPositions,
            slowestChannelConvergenceMs: result.slowestChannelConvergence,
            connections: result.connections,
            connectionsElsewhere: result.connectionsElsewhere,
            connectionsBackOnFirst: result.connectionsBackOnFirst,
            disconnects: result.disconnects,
            faults: counts.withLockedValue { $0 },
            packetsDelayed: delayed.withLockedValue { $0.packets },
            packetsReordered: delayed.withLockedValue { $0.reordered },
            readyRefusedWhileDiskFull: readyRefusals.withLockedValue { $0[Fault.fillDisk.rawValue] ?? 0 },
            readyRefusedWhileReadOnly: readyRefusals.withLockedValue { $0[Fault.readOnlyDisk.rawValue] ?? 0 },
            slowestConvergenceMs: result.slowestConvergence,
            gateways: sampler.snapshot.mapValues {
                ProcessFigures(
                    peakResidentBytes: $0.peakResidentBytes,
                    firstDescriptors: $0.firstDescriptors,
                    lastDescriptors: $0.lastDescriptors
                )
            },
            anomalies: anomalies
        )
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
        try encoder.encode(report).write(to: URL(fileURLWithPath: "\(directory)/report.json"))
        try ThroughputPlot(records: records).svg().write(toFile: "\(directory)/throughput.svg", atomically: true, encoding: .utf8)
        if !anomalies.isEmpty {
            try anomalies.joined(separator: "\n\n").write(toFile: "\(directory)/anomalies.txt", atomically: true, encoding: .utf8)
        }
        say(
            "\(report.operations) operations: messages \(report.sends), \(report.delivered) delivered (\(report.repeatsAfterKills) again after a kill), \(report.requestsAnswered) requests answered; publications \(report.publishes), \(report.received) received (\(report.receivedAgainAfterKills) again after a kill), \(report.gapPositions) in gaps; slowest convergence \(report.slowestConvergenceMs.map { "\($0) ms" } ?? "-"); \(anomalies.count) anomalies"
        )
        if report.faults[Fault.delayPackets.rawValue] != nil {
            say("packets delayed: \(report.packetsDelayed), \(report.packetsReordered) of them reordered")
        }
        say(
            "connections: \(report.connections.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")); \(report.connectionsElsewhere) to a fallback or another node, \(report.connectionsBackOnFirst) back on the first; \(report.disconnects) ended"
        )
        for (name, figures) in report.gateways.sorted(by: { $0.key < $1.key }) {
            say(
                "\(name): peak resident memory \(figures.peakResidentBytes >> 20) MiB; descriptors \(figures.firstDescriptors.map(String.init) ?? "-") at the start, \(figures.lastDescriptors.map(String.init) ?? "-") at the end"
            )
        }
        return report
    }
}

extension NemesisRun {
    /// Starts a gateway the nemesis stopped. A node starting while PostgreSQL is away (crashed,
    /// cut off) waits for it before it listens, and gives up after 15 s: slow, not a failure of
    /// the run (seed 4403, three nodes, took more than 20 s once). Started again until it
    /// listens, for up to 3 minutes, each failed attempt recorded.
    static func restart(_ gateway: GatewayProcess, named name: String, _ nemesis: HistoryWriter) async throws {
        let restarting = ContinuousClock.now
        while true {
            do {
                try await gateway.start()
                return
            } catch {
                guard ContinuousClock.now - restarting < .seconds(180) else { throw error }
                gateway.kill()
                nemesis.record(.fault, .info, detail: "\(name) did not start (\(error)); started again")
                try await Task.sleep(for: .seconds(1))
            }
        }
    }

    /// `tether serve`'s channels: history in the store, long enough that a subscriber away for
    /// a fault's length misses nothing; clients may publish.
    static let channelArguments = ["--channel-history", "10000", "--channel-history-age", "3600", "--channel-clients-publish"]

    /// The crashes a process's log shows: each the Swift runtime's backtrace header (`*** Signal
    /// 4: Backtracing from …`) or, without the backtracer, its `Fatal error:` line, with the
    /// lines that say what failed and where (the crashed thread's first frames).
    static func crashes(inLog path: String) -> [[String]] {
        guard let data = FileManager.default.contents(atPath: path) else { return [] }
        let lines = String(decoding: data, as: UTF8.self).split(separator: "\n", omittingEmptySubsequences: false).map(String.init)
        func isBacktrace(_ line: String) -> Bool { line.contains("*** Signal ") && line.contains("Backtracing") }
        var crashes: [[String]] = []
        for (index, line) in lines.enumerated() {
            // A fatal error is followed by its backtrace where the backtracer runs: one crash.
            let fatal = line.contains("Fatal error:") && !lines[(index + 1)..<min(lines.count, index + 6)].contains(where: isBacktrace)
            guard isBacktrace(line) || fatal else { continue }
            var excerpt = [line]
            // What failed, and the crashed thread's first frames, within the next 200 lines.
            let window = lines[(index + 1)..<min(lines.count, index + 200)]
            excerpt += window.filter { $0.contains("runtime failure") }.prefix(1)
            if let thread = window.firstIndex(where: { $0.hasSuffix(" crashed:") }) {
                excerpt += lines[thread..<min(lines.count, thread + 6)].filter { !$0.isEmpty }
            }
            crashes.append(excerpt)
        }
        return crashes
    }

    /// The loopback address node `node` (from 1) reaches PostgreSQL at.
    static func postgresAddress(node: Int) -> String { "127.0.0.\(node + 1)" }
}
