import Foundation
import Logging
import NIOCore
import NIOPosix
import Tether
import TetherGateway
import TetherNIO

/// `tether-lock-probe`: counts the locks Tether takes on its hot paths, in a process of its own
/// (nothing else runs beside what is counted), and prints them as JSON for
/// `LockBudgetTests`.
///
/// One gateway (in-memory store, loopback TCP) and two clients, alice and bob, on their own
/// event loops. For each operation, after a warm-up, it counts every ``TetherLock`` acquisition
/// (by where the lock was made) over COUNT operations done one after another (the worst case:
/// nothing is batched) and reports them per operation:
/// - `request`: `request("echo")`, a task handler (the default path);
/// - `request.inline`: `request("echo.inline")`, an inline handler;
/// - `request.callback`: `dataTask("echo.inline") { … }.resume()`, the callback API;
/// - `push`: a `Gateway.push` to alice's client id, until alice's `pushes()` yields it;
/// - `publish`: a `Gateway.publish` to a channel alice subscribed to (its history kept),
///   until her subscription yields it;
/// - `reliable`: alice's `send("dm")` to bob, until its outcome is acknowledged and bob's
///   `deliveries()` yields it, and bob's acknowledgement.
///
/// Counting goes on for 200 ms after the last operation (for what it left in flight, such as
/// the last DELIVERY_ACK): timers and heartbeats in that time add a little to every figure.
///
/// Debug builds only (release builds do not count).
@main
struct LockProbe {
    static func main() async throws {
        guard LockAccounting.isAvailable else {
            FileHandle.standardError.write(Data("tether-lock-probe counts locks in debug builds only\n".utf8))
            exit(2)
        }
        let count = CommandLine.arguments.dropFirst().first.flatMap(Int.init) ?? 1000
        var logger = Logger(label: "tether-lock-probe")
        logger.logLevel = .critical

        var configuration = GatewayConfiguration.defaults
        configuration.listen = .init(host: "127.0.0.1", port: 0)
        let store = InMemoryMessageStore()
        let gateway = try Gateway(configuration: configuration, messageStore: store, logger: logger)
        gateway.handle("echo") { request, _ in request.body }
        gateway.handleInline("echo.inline") { request, _ in request.body }
        gateway.onMessage("dm") { message, context in
            try context.deliver(to: message.conversation, topic: "dm", body: message.body)
        }

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await gateway.run() }
            let port = try await gateway.listeningAddress.port!
            let alice = try Self.client("alice", port: port, logger: logger)
            let bob = try Self.client("bob", port: port, logger: logger)
            group.addTask { try await alice.run() }
            group.addTask { try await bob.run() }

            var report: [String: [String: Double]] = [:]
            let body = ByteBuffer(repeating: 0x61, count: 32)

            report["request"] = try await Self.measure(count) {
                _ = try await alice.request("echo", body: body)
            }
            report["request.inline"] = try await Self.measure(count) {
                _ = try await alice.request("echo.inline", body: body)
            }

            report["request.callback"] = try await Self.measure(count) {
                _ = try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<ByteBuffer, any Error>) in
                    alice.dataTask("echo.inline", body: body) { continuation.resume(with: $0.mapError { $0 as any Error }) }.resume()
                }
            }

            let pushes = alice.pushes(topic: "probe").makeAsyncIterator()
            let pushIterator = UnsafeBox(pushes)
            report["push"] = try await Self.measure(count) {
                _ = try gateway.push("probe", body, to: .client("alice"))
                _ = await pushIterator.value.next()
            }

            let publications = UnsafeBox(alice.subscribe("probe.channel").makeAsyncIterator())
            guard case .subscribed? = try await publications.value.next() else { throw ProbeError("alice was not subscribed") }
            report["publish"] = try await Self.measure(count) {
                try await gateway.publish(body, toChannel: "probe.channel")
                guard case .publication? = try await publications.value.next() else { throw ProbeError("no publication") }
            }

            let deliveries = UnsafeBox(bob.deliveries().makeAsyncIterator())
            var sent = 0
            report["reliable"] = try await Self.measure(count) {
                sent += 1
                let receipt = try await alice.send("dm", body: body, conversation: "bob")
                guard case .acknowledged = await alice.outcome(of: receipt) else {
                    throw ProbeError("message \(sent) was not acknowledged")
                }
                guard let delivery = try await deliveries.value.next() else { throw ProbeError("bob's deliveries ended") }
                try bob.acknowledge(delivery)  // its DELIVERY_ACK: the last one is in before the count ends
            }

            let json = try JSONSerialization.data(withJSONObject: report, options: [.sortedKeys, .prettyPrinted])
            print(String(decoding: json, as: UTF8.self))
            alice.shutdown()
            bob.shutdown()
            gateway.shutdown()
            try await group.waitForAll()
        }
    }

    static func client(_ id: String, port: Int, logger: Logger) throws -> TetherClient {
        var configuration = try ClientConfiguration(endpoints: ["127.0.0.1:\(port)"], clientID: id)
        configuration.reliability = try .init(outbox: InMemoryOutboxStore())
        return try TetherClient(
            configuration: configuration,
            eventLoopGroup: MultiThreadedEventLoopGroup(numberOfThreads: 1),
            logger: logger
        )
    }

    /// Runs `operation` 50 times to warm up, then three rounds of `count` times counting locks,
    /// and keeps the round that took the fewest: the acquisitions
    /// per operation, by module (`module`), by where each lock was made (`site`) and where it was
    /// taken (`at`), and in all.
    static func measure(
        _ count: Int,
        isolation: isolated (any Actor)? = #isolation,
        _ operation: () async throws -> Void
    ) async throws -> [String: Double] {
        for _ in 0..<50 { try await operation() }
        // Three rounds, the least kept: what timing adds (a consumer that had to wait, a
        // maintenance pass woken twice) varies from round to round; a lock on the path does not.
        var least: [String: Double]?
        for _ in 0..<3 {
            let round = try await Self.round(count, operation)
            if least == nil || round["total", default: 0] < least!["total", default: 0] { least = round }
        }
        return least!
    }

    /// One round of `count` operations, counted.
    static func round(
        _ count: Int,
        isolation: isolated (any Actor)? = #isolation,
        _ operation: () async throws -> Void
    ) async throws -> [String: Double] {
        LockAccounting.start()
        for _ in 0..<count { try await operation() }
        try await Task.sleep(for: .milliseconds(200))  // what the last operation left in flight (an acknowledgement)
        let counts = LockAccounting.stop()
        var perOperation: [String: Double] = ["total": 0]
        for (site, acquisitions) in counts.byLock {
            let share = Double(acquisitions) / Double(count)
            perOperation["total", default: 0] += share
            perOperation["module \(site.module)", default: 0] += share
            perOperation["site \(site)", default: 0] += share
        }
        for (place, acquisitions) in counts.byPlace {
            perOperation["at \(place)", default: 0] += Double(acquisitions) / Double(count)
        }
        return perOperation
    }

}

/// Holds a value a closure mutates (the probe is sequential).
final class UnsafeBox<Value>: @unchecked Sendable {
    var value: Value
    init(_ value: Value) { self.value = value }
}

struct ProbeError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
