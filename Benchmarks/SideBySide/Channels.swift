import ArgumentParser
import Foundation
import NIOCore
import Tether

/// `tether-bench channels`: what issue 42 asks of channels, measured against a gateway in its
/// own process — 10,000 missed publications recovered on reconnect (history in memory, in a
/// SQLite file, or in PostgreSQL with `--postgres`), and the presence of a channel of 10,000
/// members (the first page of 1,000, and the whole list).
struct ChannelsBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "channels",
        abstract: "Recovery of missed channel publications on reconnect, and presence of a large channel."
    )

    @Option(help: "Publications missed while away, recovered in each run.")
    var missed = 10_000

    @Option(help: "The size of each publication's body.")
    var body = 32

    @Option(help: "Recoveries measured per storage (after one warm-up).")
    var runs = 5

    @Option(help: "Members subscribed to the presence channel; 0 skips the presence run.")
    var members = 10_000

    @Option(help: "Presence queries measured.")
    var queries = 20

    @Option(help: "Keep the stored history in this PostgreSQL database instead of a SQLite file.")
    var postgres: String?

    @Option(help: "Publications each node's publisher makes in the publish-rate run (the channel's history in the store); 0 skips it.")
    var publications = 20_000

    @Option(help: "With --postgres: the nodes of the publish-rate run, each with a publisher and a subscriber.")
    var nodes = 3

    @Option(help: "Publications a publisher's request makes at once (as that many publishers would).")
    var perRequest = 100

    @Option(help: "Where the results go.")
    var output = "bench-results"

    enum Storage: String, Codable, CaseIterable {
        case memory
        case sqlite
        case postgresql
    }

    struct Recovery: Codable {
        var storage: Storage
        var missed: Int
        var bodyBytes: Int
        /// From the subscription made (with the position before the missed ones) until the
        /// last missed publication reached the subscription's reader, each run.
        var milliseconds: [Double]
        var medianMilliseconds: Double
        var maxMilliseconds: Double
    }

    struct Presence: Codable {
        var members: Int
        /// One `client.presence(of:limit: 1000)` (the first page), each query.
        var firstPageMilliseconds: [Double]
        var firstPageMedianMilliseconds: Double
        /// Every member, page by page.
        var allMembersMilliseconds: Double
    }

    struct PublishRate: Codable {
        var storage: Storage
        var nodes: Int
        var publications: Int
        var perRequest: Int
        /// From the first publish request until every node's subscriber had every publication.
        var seconds: Double
        var publicationsPerSecond: Double
    }

    struct Results: Codable {
        var recovery: [Recovery]
        var presence: Presence?
        var publishRate: PublishRate?
    }

    func run() async throws {
        let store = self.postgres == nil ? Storage.sqlite : .postgresql
        var recoveries: [Recovery] = []
        for storage in [Storage.memory, store] {
            recoveries.append(try await self.recovery(storage))
        }
        let presence = self.members > 0 ? try await self.presence() : nil
        let rate = self.publications > 0 ? try await self.publishRate(store) : nil
        try writeJSON(Results(recovery: recoveries, presence: presence, publishRate: rate), to: "\(self.output)/channels.json")
    }

    /// The body of a `channel.publish` request (see `TetherPeer.installRoom`): `count`
    /// publications of `size` bytes to `channel`.
    static func publishRequest(_ count: Int, of size: Int, to channel: String) -> ByteBuffer {
        var body = ByteBuffer()
        body.writeInteger(UInt32(count))
        body.writeInteger(UInt32(size))
        body.writeInteger(UInt32(0))  // not JSON
        body.writeString(channel)
        return body
    }

    /// Starts the gateway with a store (a new SQLite file, or `--postgres`).
    private func server(node: Int = 1) throws -> (ChildProcess, port: Int) {
        if self.postgres == nil, node == 1 {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-bench-channels-\(UUID().uuidString).sqlite")
                .path
            setenv("TETHER_BENCH_CHANNEL_STORE", path, 1)  // read by the gateway process
        }
        let arguments = self.postgres.map { ["--postgres", $0, "--node-name", "n\(node)"] } ?? []
        return try ChildProcess.server(.tether, executable: try ChildProcess.thisExecutable(), arguments: arguments)
    }

    /// Publishers on every node at once, into one channel whose history is in the store; a
    /// subscriber on every node counts what it gets.
    private func publishRate(_ storage: Storage) async throws -> PublishRate {
        let nodeCount = self.postgres == nil ? 1 : max(1, self.nodes)
        var servers: [(process: ChildProcess, port: Int)] = []
        defer { for server in servers { server.process.terminate() } }
        for node in 1...nodeCount { servers.append(try self.server(node: node)) }
        let (perNode, perRequest, bodySize) = (self.publications, self.perRequest, self.body)
        let total = perNode * nodeCount
        let channel = "bench.store"
        let started = ContinuousClock.now
        try await withThrowingTaskGroup { group in
            for server in servers {
                let port = server.port
                group.addTask {
                    try await TetherPeer.withClient(port: port) { client in
                        var received = 0
                        for try await event in client.subscribe(channel, bufferSize: 1 << 20) {
                            if case .publication = event { received += 1 }
                            if case .gap(let gap) = event { throw BenchError("a gap: \(gap)") }
                            if received == total { return }
                        }
                    }
                }
            }
            // The subscribers first (they count from the top).
            try await Task.sleep(for: .milliseconds(500))
            for server in servers {
                let port = server.port
                group.addTask {
                    try await TetherPeer.withClient(port: port) { client in
                        var sent = 0
                        while sent < perNode {
                            let count = min(perRequest, perNode - sent)
                            let publish = Self.publishRequest(count, of: bodySize, to: channel)
                            _ = try await client.request("channel.publish", body: publish, timeout: .seconds(120))
                            sent += count
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        let elapsed = ContinuousClock.now - started - .milliseconds(500)
        let seconds = elapsed.totalSeconds
        let result = PublishRate(
            storage: storage,
            nodes: nodeCount,
            publications: total,
            perRequest: perRequest,
            seconds: seconds,
            publicationsPerSecond: Double(total) / seconds
        )
        emit(
            "publish rate, history in \(storage.rawValue), \(nodeCount) node(s) publishing at once (\(perRequest) per request): "
                + "\(total) publications, every node's subscriber had all in \(String(format: "%.2f", seconds)) s = "
                + "\(Int(result.publicationsPerSecond)) publications/s"
        )
        return result
    }

    private func recovery(_ storage: Storage) async throws -> Recovery {
        let (server, port) = try self.server()
        defer { server.terminate() }
        let channel = storage == .memory ? "bench.recovery.memory" : "bench.recovery.store"
        let (missed, bodySize, runs) = (self.missed, self.body, self.runs)
        let times = try await TetherPeer.withClient(port: port) { client in
            var times: [Double] = []
            for run in 0...runs {
                // Where the subscriber was when it left: the channel's top now.
                let before = try await client.history(of: channel, limit: 1)
                var sent = 0
                while sent < missed {
                    let count = min(1_000, missed - sent)
                    let publish = Self.publishRequest(count, of: bodySize, to: channel)
                    _ = try await client.request("channel.publish", body: publish, timeout: .seconds(120))
                    sent += count
                }
                let after = try await client.history(of: channel, limit: 1)
                guard after.top == before.top + UInt64(missed), before.epoch == 0 || after.epoch == before.epoch else {
                    throw BenchError(
                        "the channel went from \(before.epoch):\(before.top) to \(after.epoch):\(after.top), not \(missed) further"
                    )
                }
                let position = ChannelPosition(epoch: after.epoch, offset: before.top)
                let started = ContinuousClock.now
                var received = 0
                subscription: for try await event in client.subscribe(channel, from: position, bufferSize: missed + 16) {
                    switch event {
                    case .publication(let publication):
                        received += 1
                        guard publication.position.offset == before.top + UInt64(received) else {
                            throw BenchError("offset \(publication.position.offset) after \(received - 1) recovered")
                        }
                        if received == missed { break subscription }
                    case .gap(let gap):
                        throw BenchError("a gap in the recovery: \(gap)")
                    case .subscribed, .joined, .left:
                        break
                    }
                }
                let elapsed = ContinuousClock.now - started
                if run > 0 { times.append(elapsed.totalSeconds * 1e3) }
            }
            return times
        }
        let sorted = times.sorted()
        let result = Recovery(
            storage: storage,
            missed: missed,
            bodyBytes: bodySize,
            milliseconds: times,
            medianMilliseconds: sorted[sorted.count / 2],
            maxMilliseconds: sorted.last ?? 0
        )
        emit(
            "recovery of \(missed) missed publications of \(bodySize) B, history in \(storage.rawValue): median "
                + "\(String(format: "%.1f", result.medianMilliseconds)) ms, max \(String(format: "%.1f", result.maxMilliseconds)) ms "
                + "(\(runs) runs)"
        )
        return result
    }

    private func presence() async throws -> Presence {
        let (server, port) = try self.server()
        defer { server.terminate() }
        let executable = try ChildProcess.thisExecutable()
        var generators: [ChildProcess] = []
        var remaining = self.members
        while remaining > 0 {
            let count = min(5_000, remaining)
            generators.append(
                try ChildProcess(
                    executable,
                    ["listen", "--port", "\(port)", "--count", "\(count)", "--messages", "1", "--channel", "bench.presence"]
                )
            )
            remaining -= count
        }
        for generator in generators {
            guard let line = generator.readLine(), line.hasPrefix("joined ") else {
                throw BenchError("a generator failed: \(generator.errors())")
            }
        }
        let (members, queries) = (self.members, self.queries)
        let (firstPages, all) = try await TetherPeer.withClient(port: port) { client in
            var firstPages: [Double] = []
            for _ in 0...queries {
                let started = ContinuousClock.now
                let page = try await client.presence(of: "bench.presence", limit: 1_000)
                let elapsed = ContinuousClock.now - started
                guard page.total == members, page.members.count == 1_000 else {
                    throw BenchError("the presence page says \(page.total) members and holds \(page.members.count)")
                }
                firstPages.append(elapsed.totalSeconds * 1e3)
            }
            let started = ContinuousClock.now
            var seen = 0
            var after = ""
            while true {
                let page = try await client.presence(of: "bench.presence", after: after, limit: 1_000)
                seen += page.members.count
                guard let last = page.members.last else { break }
                after = last.clientID
            }
            let elapsed = ContinuousClock.now - started
            guard seen == members else { throw BenchError("\(seen) members listed of \(members)") }
            // The generators wait for one publication each before they exit.
            let publish = Self.publishRequest(1, of: 8, to: "bench.presence")
            _ = try await client.request("channel.publish", body: publish, timeout: .seconds(60))
            return (Array(firstPages.dropFirst()), elapsed.totalSeconds * 1e3)
        }
        for generator in generators {
            _ = generator.readLine()
            generator.wait()
        }
        let median = firstPages.sorted()[firstPages.count / 2]
        emit(
            "presence of a channel of \(members) members: first page of 1,000 in \(String(format: "%.1f", median)) ms (median of \(queries)), "
                + "every member in \(String(format: "%.1f", all)) ms"
        )
        return Presence(
            members: members,
            firstPageMilliseconds: firstPages,
            firstPageMedianMilliseconds: median,
            allMembersMilliseconds: all
        )
    }
}
