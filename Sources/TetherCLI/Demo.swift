import ArgumentParser
import Foundation
import Logging
import NIOCore
import Tether
import TetherCore
import TetherFaultProxy
import TetherGateway
import TetherNIO

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Start a gateway and two clients in this process and show Tether at work.",
        discussion: """
            Shows requests and responses, pushes to a room, a dropped connection that heals itself,
            a silent (blackholed) link found by the heartbeat, reliable messages that survive
            dropped connections, timeouts, cancellation and a graceful shutdown, then a summary.
            Both clients' traffic goes through fault-injecting TCP proxies.
            """
    )

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try self.logging.bootstrap(default: .critical)
        let demo = DemoRun()
        do {
            try await demo.run()
        } catch {
            demo.say("✗ the demo failed: \(error)")
            throw ExitCode.failure
        }
    }
}

/// One run of the demo.
final class DemoRun: Sendable {
    let start = ContinuousClock.now
    let observations = DemoService.Observations()
    let requestsOK = Counter()
    let requestsFailedAsExpected = Counter()
    let pushesReceived = Counter()
    let reliable = ReliableTally()

    func say(_ text: String) {
        let elapsed = ContinuousClock.now - self.start
        let milliseconds = elapsed.components.seconds * 1000 + elapsed.components.attoseconds / 1_000_000_000_000_000
        print(String(format: "[%6.2fs] ", Double(milliseconds) / 1000) + text)
    }

    func step(_ title: String) {
        print("\n── \(title)")
    }

    func run() async throws {
        self.step("1. A gateway, and fault-injecting proxies for Alice's and Bob's \"mobile networks\"")
        var gatewayConfiguration = GatewayConfiguration.defaults
        gatewayConfiguration.listen = .init(host: "127.0.0.1", port: 0)
        gatewayConfiguration.timeouts.heartbeatInterval = .seconds(1)
        gatewayConfiguration.timeouts.idle = .seconds(5)
        gatewayConfiguration.timeouts.shutdownGracePeriod = .seconds(2)
        gatewayConfiguration.serverName = "demo-gateway"
        // Reliable messages are kept in a message store: in memory here; `tether serve` uses SQLite.
        let gateway = try Gateway(configuration: gatewayConfiguration, messageStore: InMemoryMessageStore())
        DemoService.install(on: gateway, observations: self.observations)

        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await gateway.run() }
            let address = try await gateway.listeningAddress
            let direct = Endpoint(host: "127.0.0.1", port: address.port!)
            let proxy = TCPFaultProxy(upstream: direct)
            let viaProxy = Endpoint(host: "127.0.0.1", port: try await proxy.start().port!)
            let aliceProxy = TCPFaultProxy(upstream: direct)
            let viaAliceProxy = Endpoint(host: "127.0.0.1", port: try await aliceProxy.start().port!)
            self.say("gateway listening on \(direct); alice's proxy on \(viaAliceProxy), bob's on \(viaProxy)")
            self.say("the demo gateway is open: no authentication (tether serve --jwt-key requires JWTs)")

            let alice = try self.client("alice", endpoint: viaAliceProxy)
            let bob = try self.client("bob", endpoint: viaProxy)
            let aliceEvents = EventLog(name: "alice", client: alice, demo: self)
            let bobEvents = EventLog(name: "bob", client: bob, demo: self)
            group.addTask { try await alice.run() }
            group.addTask { try await bob.run() }
            group.addTask { await aliceEvents.record() }
            group.addTask { await bobEvents.record() }
            let bobPushes = bob.pushes(topic: "chat.message")
            group.addTask {
                for await push in bobPushes {
                    self.say("bob ⇐ push \(push.topic): \(String(buffer: push.body))")
                    self.pushesReceived.increment()
                }
            }
            group.addTask {
                for try await delivery in bob.deliveries() { self.reliable.received(String(buffer: delivery.body)) }
            }

            try await self.requests(alice: alice, bob: bob)
            try await self.pushes(alice: alice, bob: bob)
            let reconnect = try await self.networkDrop(bob: bob, events: bobEvents, proxy: proxy)
            let detection = try await self.blackhole(bob: bob, events: bobEvents, proxy: proxy, gateway: gatewayConfiguration)
            try await self.reliableMessages(alice: alice, bob: bob, proxies: [aliceProxy, proxy], bobEvents: bobEvents)
            try await self.timeoutsAndCancellation(alice: alice)
            try await self.shutdown(gateway: gateway, alice: alice, events: aliceEvents)

            alice.shutdown()
            bob.shutdown()
            await proxy.stop()
            await aliceProxy.stop()
            try await group.waitForAll()
            self.summary(reconnect: reconnect, detection: detection, alice: aliceEvents, bob: bobEvents)
        }
    }

    private func client(_ name: String, endpoint: Endpoint) throws -> TetherClient {
        var configuration = ClientConfiguration(endpoints: [endpoint], clientID: name)
        configuration.heartbeat.timeout = .seconds(1)
        configuration.connection.handshakeTimeout = .seconds(1)
        configuration.reconnect.backoff = try Backoff(initial: .milliseconds(100), maximum: .seconds(1))
        configuration.requests.defaultTimeout = .seconds(5)
        configuration.reliability = try .init(outbox: InMemoryOutboxStore())  // an app passes SQLiteOutboxStore(path:)
        return try TetherClient(configuration: configuration)
    }

    private func call(
        _ client: TetherClient,
        _ who: String,
        _ method: String,
        _ body: String,
        timeout: Duration? = nil
    ) async throws -> String {
        let started = ContinuousClock.now
        let reply = try await client.request(method, body: ByteBuffer(string: body), timeout: timeout)
        self.requestsOK.increment()
        let text = String(buffer: reply)
        self.say("\(who) → \(method) \(body.isEmpty ? "" : "\"\(body)\" ")← \"\(text)\" in \(Self.format(ContinuousClock.now - started))")
        return text
    }

    private func requests(alice: TetherClient, bob: TetherClient) async throws {
        self.step("2. Requests over the long connection, like HTTP calls")
        _ = try await self.call(alice, "alice", "echo", "hello")
        _ = try await self.call(bob, "bob", "time.now", "")
        do {
            _ = try await alice.request("no.such.method")
        } catch {
            self.requestsFailedAsExpected.increment()
            self.say("alice → no.such.method ← \(error.code): \(error.message) (status \(error.status?.rawValue ?? 0))")
        }
        let count = 1000
        let started = ContinuousClock.now
        let answers = try await withThrowingTaskGroup(of: Bool.self) { group in
            for index in 0..<count {
                group.addTask { String(buffer: try await alice.request("echo", body: ByteBuffer(string: "#\(index)"))) == "#\(index)" }
            }
            return try await group.reduce(0) { $0 + ($1 ? 1 : 0) }
        }
        self.requestsOK.increment(by: answers)
        self.say(
            "alice sent \(count) requests at once on one connection: \(answers) correct answers in \(Self.format(ContinuousClock.now - started))"
        )
    }

    private func pushes(alice: TetherClient, bob: TetherClient) async throws {
        self.step("3. Pushes to everyone in a room")
        _ = try await self.call(alice, "alice", "chat.join", "lobby")
        _ = try await self.call(bob, "bob", "chat.join", "lobby")
        let before = self.pushesReceived.count
        _ = try await self.call(alice, "alice", "chat.send", #"{"room":"lobby","text":"hi Bob!"}"#)
        try await self.waitUntil("bob receives the push") { self.pushesReceived.count > before }
    }

    private func networkDrop(bob: TetherClient, events: EventLog, proxy: TCPFaultProxy) async throws -> Duration {
        self.step("4. Bob's network drops every connection")
        let connectedBefore = events.connects
        let cut = ContinuousClock.now
        proxy.cutAll()
        self.say("proxy: all connections cut")
        try await self.waitUntil("bob reconnects") { events.connects > connectedBefore }
        let reconnect = ContinuousClock.now - cut
        self.say("bob is back after \(Self.format(reconnect)), without the app doing anything")
        _ = try await self.call(bob, "bob", "chat.join", "lobby")  // rooms belong to connections
        _ = try await self.call(bob, "bob", "echo", "still here")
        return reconnect
    }

    private func blackhole(
        bob: TetherClient,
        events: EventLog,
        proxy: TCPFaultProxy,
        gateway: GatewayConfiguration
    ) async throws -> Duration {
        self.step("5. Bob's link goes silent: TCP stays open, no byte gets through (half-open)")
        let disconnectsBefore = events.disconnects
        let silenced = ContinuousClock.now
        proxy.mode = .blackhole
        self.say("proxy: blackhole (heartbeat every \(gateway.timeouts.heartbeatInterval.shortDescription), PONG timeout 1 s)")
        try await self.waitUntil("bob's heartbeat notices", timeout: .seconds(10)) { events.disconnects > disconnectsBefore }
        let detection = ContinuousClock.now - silenced
        self.say("bob's heartbeat declared the link dead after \(Self.format(detection))")
        let connectsBefore = events.connects
        proxy.mode = .forward
        self.say("proxy: forwarding again")
        try await self.waitUntil("bob reconnects", timeout: .seconds(10)) { events.connects > connectsBefore }
        _ = try await self.call(bob, "bob", "echo", "back again")
        return detection
    }

    private func reliableMessages(alice: TetherClient, bob: TetherClient, proxies: [TCPFaultProxy], bobEvents: EventLog) async throws {
        self.step("6. Reliable messages: alice sends 2,000 to bob; both connections are cut twice on the way")
        let total = 2_000
        let started = ContinuousClock.now
        let sender = Task {
            var receipts: [MessageReceipt] = []
            for index in 1...total {
                receipts.append(try await alice.send("dm", body: ByteBuffer(string: "message \(index)"), conversation: "bob"))
            }
            return receipts
        }
        for threshold in [total / 4, total * 2 / 3] {
            try await self.waitUntil("bob has \(threshold) messages", timeout: .seconds(30)) { self.reliable.count >= threshold }
            for proxy in proxies { proxy.cutAll() }
            let pending = try await alice.pendingMessages().count
            self.say("proxies: all connections cut, with bob at \(self.reliable.count) messages and \(pending) not yet acknowledged")
        }
        let receipts = try await sender.value
        var acknowledged = 0
        for receipt in receipts where await alice.outcome(of: receipt) == .acknowledged { acknowledged += 1 }
        try await self.waitUntil("bob has every message", timeout: .seconds(30)) { self.reliable.count >= total }
        let elapsed = ContinuousClock.now - started
        let expected = (1...total).map { "message \($0)" }
        self.reliable.verdict =
            self.reliable.bodies == expected ? "all \(total) delivered once each, in order" : "NOT in order or not once each"
        self.say("alice: \(acknowledged) of \(total) acknowledged; bob: \(self.reliable.verdict), in \(Self.format(elapsed))")
        guard self.reliable.bodies == expected, acknowledged == total else {
            throw DemoError(message: "reliable delivery failed: \(self.reliable.count) received, \(acknowledged) acknowledged")
        }
    }

    private func timeoutsAndCancellation(alice: TetherClient) async throws {
        self.step("7. Timeouts and cancellation")
        // Step 6's last cut may have left alice reconnecting: a request that times out before it
        // is sent starts no handler for the gateway to stop.
        try await self.waitUntil("alice is connected") {
            if case .connected = alice.connectionState { true } else { false }
        }
        let stoppedBefore = self.observations.cancelledHandlers.count
        do {
            _ = try await alice.request("demo.slow", body: ByteBuffer(string: "2000"), timeout: .milliseconds(300))
        } catch {
            self.requestsFailedAsExpected.increment()
            self.say("alice → demo.slow (2 s) with a 300 ms timeout ← \(error.code)")
        }
        let task = Task { try await alice.request("demo.slow", body: ByteBuffer(string: "5000")) }
        try await Task.sleep(for: .milliseconds(100))
        task.cancel()
        do {
            _ = try await task.value
        } catch {
            self.requestsFailedAsExpected.increment()
            self.say("alice cancels a demo.slow request after 100 ms ← \((error as? TetherError)?.code.description ?? "\(error)")")
        }
        try await self.waitUntil("the gateway stops both handlers") {
            self.observations.cancelledHandlers.count >= stoppedBefore + 2
        }
        self.say("the gateway stopped both handlers: one at its deadline, one on the CANCEL frame")
    }

    private func shutdown(gateway: Gateway, alice: TetherClient, events: EventLog) async throws {
        self.step("8. Graceful shutdown: GOAWAY, requests in flight finish")
        async let slow = alice.request("demo.slow", body: ByteBuffer(string: "500"))
        try await Task.sleep(for: .milliseconds(100))
        gateway.shutdown()
        self.say("gateway: shutting down with a request in flight")
        let reply = try await slow
        self.requestsOK.increment()
        self.say("alice ← \"\(String(buffer: reply))\": the request in flight was answered before the connection closed")
        try await self.waitUntil("alice sees GOAWAY") { events.goAways > 0 }
    }

    private func summary(reconnect: Duration, detection: Duration, alice: EventLog, bob: EventLog) {
        self.step("Summary")
        print("  requests answered:              \(self.requestsOK.count)")
        print("  requests failed as intended:    \(self.requestsFailedAsExpected.count) (unknown method, timeout, cancellation)")
        print("  pushes received by bob:         \(self.pushesReceived.count)")
        print("  bob reconnected after a cut in: \(Self.format(reconnect))")
        print("  silent link detected after:     \(Self.format(detection))")
        print("  reliable messages through cuts: \(self.reliable.verdict)")
        print("  connections: alice \(alice.connects), bob \(bob.connects)")
        print("\nDone. Run `swift run tether serve` and `swift run tether chat --user you` to try it by hand,")
        print("or `tether send --as alice --to bob hello` and `tether receive --as bob` for reliable messages.")
    }

    func waitUntil(_ what: String, timeout: Duration = .seconds(5), _ condition: @Sendable () -> Bool) async throws {
        let deadline = ContinuousClock.now + timeout
        while !condition() {
            guard ContinuousClock.now < deadline else {
                throw DemoError(message: "timed out waiting until \(what)")
            }
            try await Task.sleep(for: .milliseconds(10))
        }
    }

    static func format(_ duration: Duration) -> String {
        let seconds = duration.totalSeconds
        return seconds < 1 ? String(format: "%.1f ms", seconds * 1000) : String(format: "%.2f s", seconds)
    }
}

/// Prints a client's connection events and counts them.
final class EventLog: Sendable {
    let name: String
    let client: TetherClient
    let demo: DemoRun
    private let connectCount = Counter()
    private let disconnectCount = Counter()
    private let goAwayCount = Counter()
    private let stream: AsyncStream<ConnectionEvent>

    init(name: String, client: TetherClient, demo: DemoRun) {
        self.name = name
        self.client = client
        self.demo = demo
        self.stream = client.events
    }

    var connects: Int { self.connectCount.count }
    var disconnects: Int { self.disconnectCount.count }
    var goAways: Int { self.goAwayCount.count }

    func record() async {
        for await event in self.stream {
            switch event {
            case .connected:
                self.connectCount.increment()
            case .disconnected(let reason):
                self.disconnectCount.increment()
                if case .goingAway = reason { self.goAwayCount.increment() }
            case .connecting, .connectFailed, .endpointBlocked, .backingOff, .waitingForNetwork, .failed, .alert:
                break
            }
            self.demo.say("\(self.name): \(event)")
        }
    }
}

/// What bob's app received as reliable deliveries.
final class ReliableTally: Sendable {
    private let state = TetherLock((bodies: [String](), verdict: "not run"))

    func received(_ body: String) { self.state.withLockedValue { $0.bodies.append(body) } }
    var bodies: [String] { self.state.withLockedValue { $0.bodies } }
    var count: Int { self.state.withLockedValue { $0.bodies.count } }
    var verdict: String {
        get { self.state.withLockedValue { $0.verdict } }
        set { self.state.withLockedValue { $0.verdict = newValue } }
    }
}

struct DemoError: Error, CustomStringConvertible {
    var message: String
    var description: String { self.message }
}
