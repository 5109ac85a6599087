import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherGatewayTesting
import TetherTestSupport

/// Waits until `condition` holds or `timeout` passes; returns whether it held.
func waitUntil(timeout: Duration, _ condition: @Sendable () -> Bool) async throws -> Bool {
    let deadline = ContinuousClock.now + timeout
    while !condition() {
        guard ContinuousClock.now < deadline else { return false }
        try await Task.sleep(for: .milliseconds(1))
    }
    return true
}

/// Where two lists first differ, described briefly; `nil` if they are equal.
func firstDifference(_ actual: [String], _ expected: [String]) -> String? {
    guard actual != expected else { return nil }
    let index = (0..<min(actual.count, expected.count)).first { actual[$0] != expected[$0] } ?? min(actual.count, expected.count)
    let got = index < actual.count ? actual[index] : "nothing"
    let wanted = index < expected.count ? expected[index] : "nothing"
    return "at \(index): got \(got), expected \(wanted) (\(actual.count) vs \(expected.count) items)"
}

/// The first message whose outcome is not `.acknowledged`, described; `nil` if all are.
/// (One line for the first failure, rather than one per message of thousands.)
func firstUnacknowledged(_ receipts: [MessageReceipt], of client: TetherClient) async -> String? {
    for receipt in receipts {
        let outcome = await client.outcome(of: receipt)
        if outcome != .acknowledged { return "message \(receipt.id): \(String(describing: outcome))" }
    }
    return nil
}

/// A temporary file path that is removed when the test ends.
func temporaryFile(_ name: String, in harness: Harness) -> String {
    let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-\(name)-\(UUID().uuidString).sqlite").path
    harness.onExit {
        for suffix in ["", "-wal", "-shm", ".lock"] { try? FileManager.default.removeItem(atPath: path + suffix) }
    }
    return path
}

extension IntegrationTests {
    @Suite("Delivery under faults", .timeLimit(.minutes(3)))
    struct DeliveryFaultTests {
        /// The seed of the fault schedule: `TETHER_CHAOS_SEED` if set (to replay a failure), random otherwise.
        static let seed: UInt64 =
            ProcessInfo.processInfo.environment["TETHER_CHAOS_SEED"].flatMap { UInt64($0) }
            ?? UInt64.random(in: 1...UInt64.max)

        @Test("10,000 messages while connections drop at random points: each processed once, delivered once, in order")
        func chaos() async throws {
            let seed = Self.seed
            print("chaos seed \(seed) (TETHER_CHAOS_SEED=\(seed) replays this schedule)")
            var generator = SplitMix64(seed: seed)
            let total = 10_000
            let texts = (1...total).map { "m-\($0)" }
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let (_, processed) = try harness.messagingGateway(
                    at: endpoint,
                    on: network,
                    store: try SQLiteMessageStore(path: temporaryFile("chaos-gateway", in: harness))
                )
                let alice = try harness.messagingClient(
                    network: network,
                    endpoint: endpoint,
                    id: "alice",
                    outbox: try SQLiteOutboxStore(path: temporaryFile("chaos-alice", in: harness))
                )
                let bob = try harness.messagingClient(network: network, endpoint: endpoint, id: "bob")
                let connections = harness.events(of: alice)
                let inbox = DeliveryCollector(bob, in: harness)
                try await eventually("alice is connected") { connections.connects == 1 }

                // The fault schedule: at 30 random points of progress, one of three faults.
                enum Fault: CaseIterable { case drop, acknowledgementsLost, writesLost }
                let schedule = (0..<30).map { _ in
                    (Int.random(in: 20..<total - 100, using: &generator), Fault.allCases.randomElement(using: &generator)!)
                }
                .sorted { $0.0 < $1.0 }
                let writesLostFor = schedule.map { _ in Duration.milliseconds(Int.random(in: 1...20, using: &generator)) }

                let sender = Task {
                    var receipts: [MessageReceipt] = []
                    for text in texts {
                        receipts.append(try await alice.send("chat.send", body: ByteBuffer(string: text), conversation: "bob"))
                    }
                    return receipts
                }

                var drops = 0
                var processedWhileAcknowledgementsLost = 0
                for ((threshold, fault), pause) in zip(schedule, writesLostFor) {
                    try await eventually("the gateway processed \(threshold) messages", timeout: .seconds(60)) {
                        processed.withLockedValue { $0.count } >= threshold
                    }
                    switch fault {
                    case .drop:
                        break
                    case .acknowledgementsLost:
                        // Frames reach the gateway, which processes them, but its ACKs and
                        // DELIVERYs are lost: the cut comes between the write and the ACK.
                        // Only once alice is connected again after the last drop: blackholed
                        // mid-handshake, she would send nothing for the gateway to process.
                        _ = try await waitUntil(timeout: .seconds(5)) {
                            if case .connected = alice.connectionState { true } else { false }
                        }
                        network.faults.blackhole(.toClient)
                        let before = processed.withLockedValue { $0.count }
                        if try await waitUntil(timeout: .milliseconds(500), { processed.withLockedValue { $0.count } > before }) {
                            processedWhileAcknowledgementsLost += 1
                        }
                    case .writesLost:
                        // What the clients write is lost (MESSAGEs, DELIVERY_ACKs, PINGs).
                        network.faults.blackhole(.toGateway)
                        try await Task.sleep(for: pause)
                    }
                    network.faults.dropConnections()
                    network.faults.heal()
                    drops += 1
                }

                let receipts = try await sender.value
                #expect(receipts.map(\.sequence) == (1...UInt64(total)).map { $0 })
                if let failure = await firstUnacknowledged(receipts, of: alice) {
                    Issue.record(Comment(rawValue: failure))
                    return
                }
                try await eventually("bob has every message", timeout: .seconds(60)) { inbox.count >= total }
                try await Task.sleep(for: .milliseconds(100))  // time for a duplicate to show up

                #expect(drops >= 20)
                #expect(connections.connects > drops / 2, "the drops cut alice's connection (\(connections.connects) connects)")
                #expect(processedWhileAcknowledgementsLost > 0, "some messages were processed while their ACK was being lost")
                // Compared by summary: printing 10,000 strings on failure helps nobody.
                let handled = processed.withLockedValue { $0 }
                #expect(handled.count == total, "the handler ran once per message")
                #expect(firstDifference(handled, texts) == nil, "the handler saw them in the order of the sends")
                #expect(inbox.count == total)
                #expect(firstDifference(inbox.bodies, texts) == nil, "bob's app got each message once, in order")
                #expect(inbox.violations.isEmpty)
            }
        }

        @Test("a message whose ACK is lost is processed once, and acknowledged on the next connection")
        func acknowledgementLost() async throws {
            try await withHarness { harness in
                let network = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let (_, processed) = try harness.messagingGateway(at: endpoint, on: network)
                let alice = try harness.messagingClient(network: network, endpoint: endpoint, id: "alice")
                let events = harness.events(of: alice)
                try await eventually("alice is connected") { events.connects == 1 }

                network.faults.blackhole(.toClient)
                var receipts: [MessageReceipt] = []
                for index in 1...20 {
                    receipts.append(try await alice.send("chat.send", body: ByteBuffer(string: "\(index)"), conversation: "c"))
                }
                try await eventually("the gateway processed them") { processed.withLockedValue { $0.count } == 20 }
                let pending = try await alice.pendingMessages()
                #expect(pending.count == 20, "no ACK arrived, so all are still pending")

                network.faults.dropConnections()
                network.faults.heal()
                for receipt in receipts {
                    #expect(await alice.outcome(of: receipt) == .acknowledged)
                }
                // The recorder reads the client's events from a stream of its own, and may see
                // the reconnection after the ACKs it brought.
                try await eventually("the reconnection is recorded") { events.connects >= 2 }
                #expect(events.connects == 2)
                #expect(processed.withLockedValue { $0 } == (1...20).map { "\($0)" }, "resent, deduplicated: processed once")
                #expect(try await alice.pendingMessages().isEmpty)
            }
        }

        @Test("deliveries whose DELIVERY_ACK is lost come again, and the app still sees each once")
        func deliveryAcknowledgementLost() async throws {
            try await withHarness { harness in
                let alicePath = LocalNetwork()
                let bobPath = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let store = InMemoryMessageStore()
                _ = try harness.messagingGateway(at: endpoint, on: alicePath, bobPath, store: store)
                @Sendable func stored() async throws -> Int { try await store.deliveries(for: "bob", after: 0, limit: 1_000).count }
                let alice = try harness.messagingClient(network: alicePath, endpoint: endpoint, id: "alice")
                let bob = try harness.messagingClient(network: bobPath, endpoint: endpoint, id: "bob")
                let bobEvents = harness.events(of: bob)
                let inbox = DeliveryCollector(bob, in: harness)
                try await eventually("bob is connected") { bobEvents.connects == 1 }

                bobPath.faults.blackhole(.toGateway)  // bob hears everything, the gateway hears nothing from bob
                for index in 1...30 {
                    let receipt = try await alice.send("chat.send", body: ByteBuffer(string: "\(index)"), conversation: "bob")
                    #expect(await alice.outcome(of: receipt) == .acknowledged)
                }
                try await eventually("bob got them") { inbox.count == 30 }
                #expect(try await stored() == 30, "not acknowledged, so the gateway keeps them")

                bobPath.faults.dropConnections()
                bobPath.faults.heal()
                try await eventually("bob is back") { bobEvents.connects == 2 }
                try await eventually("bob's acknowledgement arrives") { (try? await stored()) == 0 }
                _ = try await alice.send("chat.send", body: ByteBuffer(string: "31"), conversation: "bob")
                try await eventually("bob got the next one") { inbox.count >= 31 }
                #expect(inbox.bodies == (1...31).map { "\($0)" })
                #expect(inbox.violations.isEmpty)
            }
        }

        @Test("two devices of one client id, each with its own outbox, send 1,000 messages each through lost ACKs and reconnects")
        func twoDevicesOfOneClient() async throws {
            let total = 1_000
            try await withHarness { harness in
                let phoneNetwork = LocalNetwork()
                let tabletNetwork = LocalNetwork()
                let bobNetwork = LocalNetwork()
                let endpoint = Endpoint(host: "gateway", port: 1)
                let (_, processed) = try harness.messagingGateway(
                    at: endpoint,
                    on: phoneNetwork,
                    tabletNetwork,
                    bobNetwork,
                    store: try SQLiteMessageStore(path: temporaryFile("two-devices", in: harness))
                )
                let phone = try harness.messagingClient(network: phoneNetwork, endpoint: endpoint, id: "alice")
                let tablet = try harness.messagingClient(network: tabletNetwork, endpoint: endpoint, id: "alice")
                let bob = try harness.messagingClient(network: bobNetwork, endpoint: endpoint, id: "bob")
                let inbox = DeliveryCollector(bob, in: harness)
                let phoneEvents = harness.events(of: phone)
                let tabletEvents = harness.events(of: tablet)
                try await eventually("both devices are connected") { phoneEvents.connects == 1 && tabletEvents.connects == 1 }

                func sender(_ device: TetherClient, _ name: String) -> Task<[MessageReceipt], any Error> {
                    Task {
                        var receipts: [MessageReceipt] = []
                        for index in 1...total {
                            receipts.append(
                                try await device.send("chat.send", body: ByteBuffer(string: "\(name)-\(index)"), conversation: "bob")
                            )
                        }
                        return receipts
                    }
                }
                let phoneSender = sender(phone, "phone")
                let tabletSender = sender(tablet, "tablet")

                // Twelve times, one device's ACKs are lost while the gateway processes its
                // messages, then its connection drops: the devices take turns.
                var processedWhileAcknowledgementsLost = 0
                for round in 0..<12 {
                    let (device, network) = round.isMultiple(of: 2) ? (phone, phoneNetwork) : (tablet, tabletNetwork)
                    let threshold = (round + 1) * 2 * total / 14
                    try await eventually("the gateway processed \(threshold) messages", timeout: .seconds(60)) {
                        processed.withLockedValue { $0.count } >= threshold
                    }
                    _ = try await waitUntil(timeout: .seconds(5)) {
                        if case .connected = device.connectionState { true } else { false }
                    }
                    network.faults.blackhole(.toClient)
                    let before = processed.withLockedValue { $0.count }
                    if try await waitUntil(timeout: .milliseconds(300), { processed.withLockedValue { $0.count } > before }) {
                        processedWhileAcknowledgementsLost += 1
                    }
                    network.faults.dropConnections()
                    network.faults.heal()
                }

                for (device, receipts) in [(phone, try await phoneSender.value), (tablet, try await tabletSender.value)] {
                    if let failure = await firstUnacknowledged(receipts, of: device) {
                        Issue.record(Comment(rawValue: failure))
                        return
                    }
                }
                try await eventually("bob has every message", timeout: .seconds(60)) { inbox.count >= 2 * total }
                try await Task.sleep(for: .milliseconds(100))  // time for a duplicate to show up

                #expect(processedWhileAcknowledgementsLost > 0, "some messages were processed while their ACK was being lost")
                #expect(phoneEvents.connects > 3 && tabletEvents.connects > 3, "both devices reconnected")
                let handled = processed.withLockedValue { $0 }
                #expect(handled.count == 2 * total, "the handler ran once per message")
                #expect(firstDifference(handled.filter { $0.hasPrefix("phone") }, (1...total).map { "phone-\($0)" }) == nil)
                #expect(firstDifference(handled.filter { $0.hasPrefix("tablet") }, (1...total).map { "tablet-\($0)" }) == nil)
                #expect(inbox.count == 2 * total)
                #expect(firstDifference(inbox.bodies.filter { $0.hasPrefix("phone") }, (1...total).map { "phone-\($0)" }) == nil)
                #expect(firstDifference(inbox.bodies.filter { $0.hasPrefix("tablet") }, (1...total).map { "tablet-\($0)" }) == nil)
                #expect(inbox.violations.isEmpty)
            }
        }
    }
}
