import Benchmark
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Tether
import TetherGateway

// Reliable delivery with the embedded SQLite stores (files in a temporary directory, WAL,
// synchronous = NORMAL, as shipped):
//
// - "persisted sends": `client.send` until it returns, i.e. until the message is stored in the
//   client's outbox. No gateway: this is the outbox's write path alone (group commit).
// - "end to end": alice sends, the gateway processes each message once (dedup record and the
//   delivery committed in its SQLite store) and delivers it to bob over loopback TCP; an
//   iteration ends when bob's app has received every message.
//
// Throughput is reported per message (scalingFactor .kilo: one iteration = 1,000 messages).

/// Temporary SQLite files, removed at exit.
enum Scratch {
    static let directory: URL = {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("tether-bench-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        atexit { try? FileManager.default.removeItem(at: Scratch.directory) }
        return url
    }()

    static func path(_ name: String) -> String {
        Self.directory.appendingPathComponent("\(name)-\(UUID().uuidString).sqlite").path
    }
}

/// What a benchmark keeps between its setup, iterations and teardown.
final class Box<Value: Sendable>: Sendable {
    private let value = NIOLockedValueBox<Value?>(nil)
    var current: Value {
        get { self.value.withLockedValue { $0! } }
        set { self.value.withLockedValue { $0 = newValue } }
    }
    func clear() { self.value.withLockedValue { $0 = nil } }
}

/// Sends `count` messages from `senders` concurrent tasks, each its own conversation.
func sendAll(_ client: TetherClient, count: Int, senders: Int, body: ByteBuffer) async throws {
    try await withThrowingDiscardingTaskGroup { group in
        for sender in 0..<senders {
            let share = count / senders + (sender < count % senders ? 1 : 0)
            group.addTask {
                for _ in 0..<share {
                    _ = try await client.send("dm", body: body, conversation: "bob-\(sender)")
                }
            }
        }
    }
}

/// Counts what bob's app receives.
final class Inbox: Sendable {
    private let received = NIOLockedValueBox(0)
    var count: Int { self.received.withLockedValue { $0 } }
    func add() { self.received.withLockedValue { $0 += 1 } }

    func wait(until target: Int) async throws {
        while self.count < target { try await Task.sleep(for: .microseconds(200)) }
    }
}

struct EndToEnd: Sendable {
    var gateway: Gateway
    var alice: TetherClient
    var bob: TetherClient
    var inbox: Inbox
    var tasks: [Task<Void, Never>]
}

let benchmarks: @Sendable () -> Void = {
    Benchmark.defaultConfiguration = .init(
        metrics: [.wallClock, .throughput, .cpuTotal, .mallocCountTotal],
        timeUnits: .microseconds,
        scalingFactor: .kilo,
        maxDuration: .seconds(10),
        maxIterations: 40
    )
    let body = ByteBuffer(repeating: 0x61, count: 32)

    for senders in [1, 16, 256] {
        let outbox = Box<TetherClient>()
        Benchmark(
            "Persisted sends, \(senders) concurrent sender\(senders == 1 ? "" : "s") (SQLite outbox)",
            closure: { benchmark in
                try await sendAll(outbox.current, count: benchmark.scaledIterations.count, senders: senders, body: body)
            },
            setup: {
                var configuration = ClientConfiguration(endpoints: [Endpoint(host: "127.0.0.1", port: 1)], clientID: "alice")
                // Never connected, so nothing is acknowledged: room for every iteration.
                configuration.reliability = try .init(outbox: try SQLiteOutboxStore(path: Scratch.path("outbox")), capacity: 10_000_000)
                outbox.current = try TetherClient(configuration: configuration)
            },
            teardown: { outbox.clear() }
        )
    }

    for senders in [1, 64] {
        let state = Box<EndToEnd>()
        Benchmark(
            "End to end, \(senders) concurrent sender\(senders == 1 ? "" : "s"): alice → gateway (SQLite) → bob, TCP loopback",
            closure: { benchmark in
                let state = state.current
                let target = state.inbox.count + benchmark.scaledIterations.count
                try await sendAll(state.alice, count: benchmark.scaledIterations.count, senders: senders, body: body)
                try await state.inbox.wait(until: target)
            },
            setup: {
                var gatewayConfiguration = GatewayConfiguration.defaults
                gatewayConfiguration.listen = .init(host: "127.0.0.1", port: 0)
                let gateway = try Gateway(
                    configuration: gatewayConfiguration,
                    messageStore: try SQLiteMessageStore(path: Scratch.path("gateway"))
                )
                gateway.onMessage("dm") { _, context in
                    try context.deliver(to: "bob", topic: "dm", body: body)
                }
                var tasks: [Task<Void, Never>] = [Task { try? await gateway.run() }]
                let port = try await gateway.listeningAddress.port!
                func client(_ id: String) throws -> TetherClient {
                    var configuration = ClientConfiguration(endpoints: [Endpoint(host: "127.0.0.1", port: port)], clientID: id)
                    configuration.reliability = try .init(outbox: try SQLiteOutboxStore(path: Scratch.path(id)), capacity: 100_000)
                    return try TetherClient(configuration: configuration)
                }
                let alice = try client("alice")
                let bob = try client("bob")
                let inbox = Inbox()
                tasks.append(Task { try? await alice.run() })
                tasks.append(Task { try? await bob.run() })
                tasks.append(
                    Task {
                        do {
                            for try await _ in bob.deliveries() { inbox.add() }
                        } catch {
                            fatalError("bob's deliveries failed: \(error)")
                        }
                    }
                )
                state.current = EndToEnd(gateway: gateway, alice: alice, bob: bob, inbox: inbox, tasks: tasks)
            },
            teardown: {
                let running = state.current
                running.alice.shutdown()
                running.bob.shutdown()
                running.gateway.shutdown()
                for task in running.tasks { await task.value }
                state.clear()
            }
        )
    }
}
