import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Testing
import Tether
import TetherGateway
import TetherGatewayTesting
import TetherTestSupport

/// Collects a client's deliveries, checking order and uniqueness as they arrive.
final class DeliveryCollector: Sendable {
    private struct State {
        var bodies: [String] = []
        var sequences: [UInt64] = []
        var violations: [String] = []
    }

    private let state = NIOLockedValueBox(State())

    init(_ client: TetherClient, in harness: Harness) {
        harness.spawn {
            do {
                for try await delivery in client.deliveries() {
                    self.state.withLockedValue { state in
                        if let last = state.sequences.last, delivery.sequence != last + 1 {
                            state.violations.append("sequence \(delivery.sequence) after \(last)")
                        }
                        state.sequences.append(delivery.sequence)
                        state.bodies.append(delivery.body.string)
                    }
                }
            } catch {
                self.state.withLockedValue { $0.violations.append("\(error)") }
            }
        }
    }

    var bodies: [String] { self.state.withLockedValue { $0.bodies } }
    var count: Int { self.state.withLockedValue { $0.bodies.count } }
    var violations: [String] { self.state.withLockedValue { $0.violations } }
}

extension Harness {
    /// Installs a `chat.send` message handler that delivers each message to the client id named
    /// by its conversation (topic `chat.message`) and refuses bodies starting with "refuse".
    /// - Returns: The bodies the handler processed, in order.
    @discardableResult
    func installChatHandler(on gateway: Gateway) -> NIOLockedValueBox<[String]> {
        let processed = NIOLockedValueBox<[String]>([])
        gateway.onMessage("chat.send") { message, context in
            let text = message.body.string
            if text.hasPrefix("refuse") { throw RequestError(.permissionDenied, "not allowed") }
            processed.withLockedValue { $0.append(text) }
            try context.deliver(to: message.conversation, topic: "chat.message", body: message.body)
        }
        return processed
    }

    /// A gateway with reliable messaging and the chat handler, reachable at `endpoint` on `networks`.
    func messagingGateway(
        at endpoint: Endpoint,
        on networks: LocalNetwork...,
        store: any MessageStore = InMemoryMessageStore()
    ) throws -> (Gateway, NIOLockedValueBox<[String]>) {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = nil
        let gateway = try Gateway(configuration: configuration, messageStore: store, logger: testLogger("gateway"))
        let processed = self.installChatHandler(on: gateway)
        for network in networks { network.attach(gateway, at: endpoint) }
        self.spawn { try? await gateway.run() }
        self.onExit { gateway.shutdown() }
        return (gateway, processed)
    }

    /// A running client with reliable messaging.
    func messagingClient(
        network: LocalNetwork,
        endpoint: Endpoint,
        id: String,
        outbox: any OutboxStore = InMemoryOutboxStore(),
        configure: (inout ClientConfiguration.Reliability) -> Void = { _ in }
    ) throws -> TetherClient {
        try self.client([endpoint], clientID: id, transport: network.transport) {
            var reliability = try! ClientConfiguration.Reliability(outbox: outbox)
            configure(&reliability)
            $0.reliability = reliability
        }
    }
}

extension IntegrationTests {
    @Suite("Reliable messaging", .timeLimit(.minutes(3)))
    struct ReliableMessagingTests {
        @Test("messages reach the handler once and the recipient in order; outcomes and events report it")
        func basics() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let (_, processed) = try harness.messagingGateway(at: endpoint, on: network)
                let alice = try harness.messagingClient(network: network, endpoint: endpoint, id: "alice")
                let bob = try harness.messagingClient(network: network, endpoint: endpoint, id: "bob")
                let events = alice.messageEvents
                let inbox = DeliveryCollector(bob, in: harness)

                var receipts: [MessageReceipt] = []
                for index in 1...3 {
                    receipts.append(try await alice.send("chat.send", body: ByteBuffer(string: "hello \(index)"), conversation: "bob"))
                }
                #expect(receipts.map(\.sequence) == [1, 2, 3])
                #expect(Set(receipts.map(\.id)).count == 3)
                for receipt in receipts {
                    #expect(await alice.outcome(of: receipt) == .acknowledged)
                }
                try await eventually("bob gets them") { inbox.count == 3 }
                #expect(inbox.bodies == ["hello 1", "hello 2", "hello 3"])
                #expect(processed.withLockedValue { $0 } == ["hello 1", "hello 2", "hello 3"])

                var states: [UInt64: [MessageEvent.State]] = [:]
                for await event in events {
                    states[event.id, default: []].append(event.state)
                    if states.values.reduce(0, { $0 + $1.count }) == 9 { break }
                }
                for receipt in receipts {
                    #expect(states[receipt.id] == [.queued, .sent, .finished(.acknowledged)])
                }

                // The events end when the client stops (they did not, until the nemesis's worker
                // waited for them to).
                let ended = NIOLockedValueBox(false)
                let reader = Task {
                    for await _ in events {}
                    ended.withLockedValue { $0 = true }
                }
                defer { reader.cancel() }
                alice.shutdown()
                try await eventually("alice's message events end when she stops", timeout: .seconds(5)) { ended.withLockedValue { $0 } }
                var after = alice.messageEvents.makeAsyncIterator()
                #expect(await after.next() == nil, "a subscription after the end ends at once")
            }
        }

        @Test("a recipient offline while 1,000 messages are sent gets all of them, in order, when it connects")
        func offlineRecipient() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                _ = try harness.messagingGateway(at: endpoint, on: network)
                let alice = try harness.messagingClient(network: network, endpoint: endpoint, id: "alice")
                var last: MessageReceipt?
                for index in 1...1000 {
                    last = try await alice.send("chat.send", body: ByteBuffer(string: "\(index)"), conversation: "bob")
                }
                #expect(await alice.outcome(of: last!) == .acknowledged)

                let bob = try harness.messagingClient(network: network, endpoint: endpoint, id: "bob")
                let inbox = DeliveryCollector(bob, in: harness)
                try await eventually("bob catches up", timeout: .seconds(30)) { inbox.count == 1000 }
                #expect(inbox.bodies == (1...1000).map { "\($0)" })
                #expect(inbox.violations.isEmpty)
            }
        }

        @Test("a refused message fails visibly and does not block its conversation")
        func refusal() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                _ = try harness.messagingGateway(at: endpoint, on: network)
                let alice = try harness.messagingClient(network: network, endpoint: endpoint, id: "alice")
                let refused = try await alice.send("chat.send", body: ByteBuffer(string: "refuse me"), conversation: "bob")
                let fine = try await alice.send("chat.send", body: ByteBuffer(string: "fine"), conversation: "bob")
                let unknown = try await alice.send("no.such.topic", body: ByteBuffer(), conversation: "bob")
                #expect(await alice.outcome(of: refused) == .refused(.permissionDenied))
                #expect(await alice.outcome(of: fine) == .acknowledged)
                #expect(await alice.outcome(of: unknown) == .refused(.unknownMethod))
            }
        }

        @Test("a message whose TTL runs out while the gateway is unreachable expires, and unblocks its conversation")
        func expiry() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let (_, processed) = try harness.messagingGateway(at: endpoint, on: network)
                network.faults.refuse(endpoint)
                let alice = try harness.messagingClient(network: network, endpoint: endpoint, id: "alice")
                let stale = try await alice.send(
                    "chat.send",
                    body: ByteBuffer(string: "stale"),
                    conversation: "bob",
                    ttl: .milliseconds(200)
                )
                let after = try await alice.send("chat.send", body: ByteBuffer(string: "after"), conversation: "bob")
                let started = ContinuousClock.now
                #expect(await alice.outcome(of: stale) == .expired)
                #expect(ContinuousClock.now - started < .seconds(5))

                network.faults.heal()
                #expect(await alice.outcome(of: after) == .acknowledged, "the expired message's tombstone unblocked the conversation")
                #expect(processed.withLockedValue { $0 } == ["after"])
            }
        }

        @Test("a full outbox fails a send at once, or makes it wait for room, as configured")
        func fullOutbox() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                _ = try harness.messagingGateway(at: endpoint, on: network)
                network.faults.refuse(endpoint)
                let failing = try harness.messagingClient(network: network, endpoint: endpoint, id: "failing") {
                    $0.capacity = 3
                    $0.whenFull = .fail
                }
                for index in 1...3 { _ = try await failing.send("chat.send", body: ByteBuffer(string: "\(index)"), conversation: "x") }
                let error = await #expect(throws: TetherError.self) {
                    try await failing.send("chat.send", body: ByteBuffer(string: "4"), conversation: "x")
                }
                #expect(error?.code == .outboxFull)

                let waiting = try harness.messagingClient(network: network, endpoint: endpoint, id: "waiting") {
                    $0.capacity = 3
                    $0.whenFull = .wait
                }
                for index in 1...3 { _ = try await waiting.send("chat.send", body: ByteBuffer(string: "\(index)"), conversation: "y") }
                let blocked = Task { try await waiting.send("chat.send", body: ByteBuffer(string: "4"), conversation: "y") }
                try await Task.sleep(for: .milliseconds(200))
                network.faults.heal()
                let receipt = try await blocked.value
                #expect(receipt.sequence == 4)
                #expect(await waiting.outcome(of: receipt) == .acknowledged)

                network.faults.refuse(endpoint)
                let cancelled = try harness.messagingClient(network: network, endpoint: endpoint, id: "cancelled") {
                    $0.capacity = 1
                }
                _ = try await cancelled.send("chat.send", body: ByteBuffer(string: "1"), conversation: "z")
                let task = Task { try await cancelled.send("chat.send", body: ByteBuffer(string: "2"), conversation: "z") }
                try await Task.sleep(for: .milliseconds(50))
                task.cancel()
                let cancellation = await #expect(throws: TetherError.self) { try await task.value }
                #expect(cancellation?.code == .cancelled)
                network.faults.heal()
            }
        }

        @Test("messages accepted before the app stops are sent when it starts again (SQLite outbox)")
        func restart() async throws {
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-restart-\(UUID().uuidString).sqlite").path
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let (_, processed) = try harness.messagingGateway(at: endpoint, on: network)
                network.faults.refuse(endpoint)
                do {
                    let first = try TetherClient(
                        configuration: {
                            var configuration = ClientConfiguration(endpoints: [endpoint], clientID: "alice")
                            configuration.reliability = try! .init(outbox: try! SQLiteOutboxStore(path: path))
                            return configuration
                        }(),
                        transport: network.transport,
                        logger: testLogger("first")
                    )
                    let run = Task { try? await first.run() }
                    for index in 1...5 { _ = try await first.send("chat.send", body: ByteBuffer(string: "\(index)"), conversation: "bob") }
                    first.shutdown()
                    await run.value
                }
                network.faults.heal()
                let second = try harness.messagingClient(
                    network: network,
                    endpoint: endpoint,
                    id: "alice",
                    outbox: try SQLiteOutboxStore(path: path)
                )
                try await eventually("the messages of the first run are processed") { processed.withLockedValue { $0.count } == 5 }
                #expect(processed.withLockedValue { $0 } == ["1", "2", "3", "4", "5"])
                let next = try await second.send("chat.send", body: ByteBuffer(string: "6"), conversation: "bob")
                #expect(next.sequence == 6 && next.id == 6, "numbering continues where the first run stopped")
                #expect(await second.outcome(of: next) == .acknowledged)
            }
        }

        @Test("a delivery whose processing throws is handed out again: to the next loop, and after a restart")
        func throwingConsumer() async throws {
            struct SaveFailed: Error {}
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-inbox-\(UUID().uuidString).sqlite").path
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let (gateway, _) = try harness.messagingGateway(at: endpoint, on: network)
                for body in ["a", "b", "c"] { try await gateway.deliver(to: "bob", topic: "t", body: ByteBuffer(string: body)) }

                do {  // the first run of the app; its outbox file is released at the end
                    let outbox = try SQLiteOutboxStore(path: path)
                    let first = try TetherClient(
                        configuration: {
                            var configuration = ClientConfiguration(endpoints: [endpoint], clientID: "bob")
                            configuration.reliability = try! .init(outbox: outbox)
                            return configuration
                        }(),
                        transport: network.transport,
                        logger: testLogger("first")
                    )
                    let run = Task { try? await first.run() }
                    /// Processes deliveries until `failing` comes, and throws there, like `try save(d)`.
                    func consume(failingOn failing: String) async throws -> [String] {
                        var saved: [String] = []
                        do {
                            for try await delivery in first.deliveries() {
                                guard delivery.body.string != failing else { throw SaveFailed() }
                                saved.append(delivery.body.string)
                            }
                        } catch is SaveFailed {}
                        return saved
                    }
                    #expect(try await consume(failingOn: "b") == ["a"])
                    #expect(try await consume(failingOn: "c") == ["b"], "the failed delivery comes first in the next loop")
                    first.shutdown()
                    await run.value
                }
                // The first client's connection lets go of its outbox as its channel closes, and
                // the store releases the file's lock at the end of its deinit, on whichever thread
                // let go last: open the file again once it can be.
                let reopened = NIOLockedValueBox<SQLiteOutboxStore?>(nil)
                try await eventually("the first run's outbox file is released") {
                    guard let store = try? SQLiteOutboxStore(path: path) else { return false }
                    reopened.withLockedValue { $0 = store }
                    return true
                }
                let second = try harness.messagingClient(
                    network: network,
                    endpoint: endpoint,
                    id: "bob",
                    outbox: reopened.withLockedValue { $0! }
                )
                var iterator = second.deliveries().makeAsyncIterator()
                let next = try await iterator.next()
                #expect(next?.body.string == "c", "after a restart, the unprocessed delivery comes again, and only it")
                #expect(next?.sequence == 3)
            }
        }

        @Test(
            "two devices of one client id, each with its own outbox, both processing deliveries: what one acknowledged the other is not sent, and it takes the next one for what it is, not for a gap (ACKED_ELSEWHERE; the nemesis found the loop of protocol errors)"
        )
        func twoDevicesProcessDeliveries() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let store = InMemoryMessageStore()
                let (gateway, _) = try harness.messagingGateway(at: endpoint, on: network, store: store)
                /// Each device's deliveries, as processed.
                func device(_ client: TetherClient) -> NIOLockedValueBox<[UInt64]> {
                    let sequences = NIOLockedValueBox<[UInt64]>([])
                    harness.spawn {
                        do {
                            for try await delivery in client.deliveries() { sequences.withLockedValue { $0.append(delivery.sequence) } }
                        } catch {}
                    }
                    return sequences
                }
                let phone = try harness.messagingClient(network: network, endpoint: endpoint, id: "bob")
                let onPhone = device(phone)
                for index in 1...20 { try await gateway.deliver(to: "bob", topic: "t", body: ByteBuffer(string: "\(index)")) }
                // The phone processed them, and acknowledged them: the store forgot them.
                try await eventually("the phone processed them") { onPhone.withLockedValue { $0.count } == 20 }
                let forgetting = ContinuousClock.now
                while try await !store.deliveries(for: "bob", after: 0, limit: 100).isEmpty {
                    try #require(ContinuousClock.now - forgetting < .seconds(10), "the store forgets what the phone acknowledged")
                    try await Task.sleep(for: .milliseconds(20))
                }

                let tablet = try harness.messagingClient(network: network, endpoint: endpoint, id: "bob")
                let tabletEvents = harness.events(of: tablet)
                let onTablet = device(tablet)
                try await eventually("the tablet is connected") { tablet.connectionState == .connected(endpoint) }
                for index in 21...40 { try await gateway.deliver(to: "bob", topic: "t", body: ByteBuffer(string: "\(index)")) }
                try await eventually("both devices have the last one") {
                    onPhone.withLockedValue { $0.last } == 40 && onTablet.withLockedValue { $0.last } == 40
                }
                #expect(onPhone.withLockedValue { $0 } == Array(1...40))
                let tabletSequences = onTablet.withLockedValue { $0 }
                #expect(tabletSequences.allSatisfy { $0 > 20 }, "1...20 were acknowledged by the phone: \(tabletSequences)")
                #expect(tabletSequences == tabletSequences.sorted() && Set(tabletSequences).count == tabletSequences.count)
                #expect(tabletEvents.disconnectReasons.isEmpty, "no protocol error: \(tabletEvents.disconnectReasons)")
            }
        }

        @Test("without reliability configured, send fails clearly")
        func notConfigured() async throws {
            let client = try TetherClient(configuration: .init(endpoints: [Endpoint(host: "x", port: 1)], clientID: "c"))
            let error = await #expect(throws: TetherError.self) { try await client.send("t", body: ByteBuffer()) }
            #expect(error?.code == .invalidConfiguration)
        }
    }
}
