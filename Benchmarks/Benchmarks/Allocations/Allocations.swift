import Benchmark
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOPosix
import Tether
import TetherGateway

// Allocation budgets: heap allocations (malloc calls, counted by package-benchmark's
// MallocInterposer) per operation on Tether's hot paths, one process holding the gateway and its
// clients over loopback TCP, in-memory stores. The counts are the whole process's: client and
// gateway together, both event loops and Swift's executor.
//
// Thresholds (Thresholds/Allocations.*.p90.json) are checked by CI:
//
//     cd Benchmarks && swift package benchmark thresholds check --target Allocations
//
// and rewritten, after a change that should move them, with
//
//     cd Benchmarks && swift package --allow-writing-to-package-directory benchmark thresholds update --target Allocations
//
// One iteration is 1,000 operations done one after another (nothing batched: the worst case);
// the tables show them per operation (scalingFactor .kilo), the threshold files per 1,000.
// (Names without spaces: package-benchmark 1.38 writes threshold files with spaces replaced
// and reads them by the name as it is.)
//
// - Request.taskHandler: `request("echo")` to a task handler (the default path), until the
//   response is back in the calling task;
// - Request.inlineHandler: the same to an inline handler (`handleInline`);
// - Request.callbackAPI: `dataTask("echo.inline") { … }.resume()`, each completion handler
//   sending the next request from the client's event loop, as an app chains callbacks;
// - Push.toClient: `Gateway.push` to alice's client id, until her `pushes()` yields it;
// - Channel.publication: `Gateway.publish` to a channel alice subscribed to (its history kept),
//   until her subscription yields it;
// - Reliable.message: alice's `send("dm")` to bob until its outcome is acknowledged, bob's
//   `deliveries()` yields it and he acknowledges it (the DELIVERY_ACK).

/// One gateway and two clients, alice and bob, on event loops of their own.
struct Peers: Sendable {
    var gateway: Gateway
    var alice: TetherClient
    var bob: TetherClient
    var tasks: [Task<Void, Never>]

    static func start() async throws -> Peers {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = .init(host: "127.0.0.1", port: 0)
        let gateway = try Gateway(configuration: configuration, messageStore: InMemoryMessageStore())
        gateway.handle("echo") { request, _ in request.body }
        gateway.handleInline("echo.inline") { request, _ in request.body }
        gateway.onMessage("dm") { message, context in
            try context.deliver(to: message.conversation, topic: "dm", body: message.body)
        }
        var tasks: [Task<Void, Never>] = [Task { try? await gateway.run() }]
        let port = try await gateway.listeningAddress.port!
        func client(_ id: String) throws -> TetherClient {
            var configuration = try ClientConfiguration(endpoints: ["127.0.0.1:\(port)"], clientID: id)
            configuration.reliability = try .init(outbox: InMemoryOutboxStore())
            return try TetherClient(configuration: configuration, eventLoopGroup: MultiThreadedEventLoopGroup(numberOfThreads: 1))
        }
        let alice = try client("alice")
        let bob = try client("bob")
        tasks.append(Task { try? await alice.run() })
        tasks.append(Task { try? await bob.run() })
        _ = try await alice.request("echo", body: ByteBuffer())  // connected
        _ = try await bob.request("echo", body: ByteBuffer())
        return Peers(gateway: gateway, alice: alice, bob: bob, tasks: tasks)
    }

    func stop() async {
        self.alice.shutdown()
        self.bob.shutdown()
        self.gateway.shutdown()
        for task in self.tasks { await task.value }
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

/// An iterator used by one benchmark at a time (benchmarks run one after another).
final class Iterator<Base: AsyncIteratorProtocol>: @unchecked Sendable {
    var base: Base
    init(_ base: Base) { self.base = base }
}

struct BenchmarkFailure: Error, CustomStringConvertible {
    var description: String
}

let benchmarks: @Sendable () -> Void = {
    // Allocation counts are exact but not identical from run to run (which thread wins a race
    // decides whether a continuation suspends): 5 % either way is the same.
    let budget = BenchmarkThresholds(relative: [.p50: 5.0, .p90: 5.0])
    Benchmark.defaultConfiguration = .init(
        metrics: [.mallocCountTotal],
        warmupIterations: 2,
        scalingFactor: .kilo,
        maxDuration: .seconds(10),
        maxIterations: 10,
        thresholds: [.mallocCountTotal: budget]
    )
    let body = ByteBuffer(repeating: 0x61, count: 32)
    let peers = Box<Peers>()
    let setup: @Sendable () async throws -> Void = { peers.current = try await Peers.start() }
    let teardown: @Sendable () async throws -> Void = {
        await peers.current.stop()
        peers.clear()
    }

    for (name, method) in [("Request.taskHandler", "echo"), ("Request.inlineHandler", "echo.inline")] {
        Benchmark(
            name,
            closure: { benchmark in
                let alice = peers.current.alice
                for _ in benchmark.scaledIterations {
                    blackHole(try await alice.request(method, body: body))
                }
            },
            setup: setup,
            teardown: teardown
        )
    }

    Benchmark(
        "Request.callbackAPI",
        closure: { benchmark in
            // As an app chains callbacks: each completion handler, on the client's event loop,
            // sends the next request (no hop); the iteration waits once, for the last.
            let alice = peers.current.alice
            let count = benchmark.scaledIterations.count
            try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
                @Sendable func next(_ left: Int) {
                    guard left > 0 else {
                        done.resume()
                        return
                    }
                    alice.dataTask("echo.inline", body: body) { result in
                        switch result {
                        case .success(let answer): blackHole(answer)
                        case .failure(let error):
                            done.resume(throwing: error)
                            return
                        }
                        next(left - 1)
                    }.resume()
                }
                next(count)
            }
        },
        setup: setup,
        teardown: teardown
    )

    let pushes = Box<Iterator<AsyncStream<Push>.AsyncIterator>>()
    Benchmark(
        "Push.toClient",
        closure: { benchmark in
            let gateway = peers.current.gateway
            let iterator = pushes.current
            for _ in benchmark.scaledIterations {
                _ = try gateway.push("bench", body, to: .client("alice"))
                guard let push = await iterator.base.next() else { throw BenchmarkFailure(description: "pushes ended") }
                blackHole(push)
            }
        },
        setup: {
            try await setup()
            pushes.current = Iterator(peers.current.alice.pushes(topic: "bench").makeAsyncIterator())
        },
        teardown: {
            pushes.clear()
            try await teardown()
        }
    )

    let publications = Box<Iterator<ChannelSubscription.AsyncIterator>>()
    Benchmark(
        "Channel.publication",
        closure: { benchmark in
            let gateway = peers.current.gateway
            let iterator = publications.current
            for _ in benchmark.scaledIterations {
                try await gateway.publish(body, toChannel: "bench.channel")
                guard case .publication(let publication)? = try await iterator.base.next() else {
                    throw BenchmarkFailure(description: "the subscription ended")
                }
                blackHole(publication)
            }
        },
        setup: {
            try await setup()
            publications.current = Iterator(peers.current.alice.subscribe("bench.channel").makeAsyncIterator())
            guard case .subscribed? = try await publications.current.base.next() else {
                throw BenchmarkFailure(description: "alice was not subscribed")
            }
        },
        teardown: {
            publications.clear()
            try await teardown()
        }
    )

    let deliveries = Box<Iterator<DeliveryStream.AsyncIterator>>()
    Benchmark(
        "Reliable.message",
        closure: { benchmark in
            let alice = peers.current.alice
            let bob = peers.current.bob
            let iterator = deliveries.current
            for _ in benchmark.scaledIterations {
                let receipt = try await alice.send("dm", body: body, conversation: "bob")
                guard case .acknowledged = await alice.outcome(of: receipt) else {
                    throw BenchmarkFailure(description: "a message was not acknowledged")
                }
                guard let delivery = try await iterator.base.next() else { throw BenchmarkFailure(description: "deliveries ended") }
                try bob.acknowledge(delivery)
            }
        },
        setup: {
            try await setup()
            deliveries.current = Iterator(peers.current.bob.deliveries().makeAsyncIterator())
        },
        teardown: {
            deliveries.clear()
            try await teardown()
        }
    )
}
