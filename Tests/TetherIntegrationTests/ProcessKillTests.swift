import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Testing
import Tether
import TetherGateway
import TetherTestSupport
import TetherTesting

extension IntegrationTests {
    /// Real processes killed with SIGKILL: the `tether` command line sends (or serves) in a
    /// child process, with its SQLite file, while the test watches what the other side receives.
    @Suite("Killed processes", .timeLimit(.minutes(3)))
    struct ProcessKillTests {
        @Test("the sending process is killed mid-stream, twice, and run again: every message it accepted arrives once, in order")
        func senderKilled() async throws {
            try await withHarness { harness in
                let store = try SQLiteMessageStore(path: temporaryFile("killed-sender-gateway", in: harness))
                // What `tether serve` does with topic dm: deliver the body to the client named by the conversation.
                let processed = NIOLockedValueBox<[String]>([])
                let (_, endpoint) = try await harness.gateway(
                    messageStore: store,
                    routes: { gateway in
                        gateway.onMessage("dm") { message, context in
                            processed.withLockedValue { $0.append(message.body.string) }
                            try context.deliver(to: message.conversation, topic: "dm", body: message.body)
                        }
                    }
                )
                let bob = try harness.client([endpoint], clientID: "bob") { $0.reliability = try! .init(outbox: InMemoryOutboxStore()) }
                let inbox = DeliveryCollector(bob, in: harness)
                let send = [
                    "send", "--as", "alice", "--to", "bob", "--host", "127.0.0.1", "--port", "\(endpoint.port)",
                    "--store", temporaryFile("killed-sender-alice", in: harness),
                ]
                @Sendable func accepted(_ process: ChildProcess) -> [String] {
                    process.lines.filter { $0.hasPrefix("accepted ") }.map { String($0.split(separator: " ")[3]) }
                }

                // Killed once it accepted some messages and the gateway processed some.
                let first = try ChildProcess(send + ["--count", "5000", "a"], in: harness)
                try await eventually("the first run is under way", timeout: .seconds(60)) {
                    accepted(first).count >= 300 && processed.withLockedValue { $0.count } >= 100
                }
                first.kill()
                #expect(try await first.exitStatus() == SIGKILL)
                let acceptedFirst = accepted(first)
                #expect(acceptedFirst == (1...acceptedFirst.count).map { "a-\($0)" })

                // Run again with new messages: the leftovers go first; killed again.
                let second = try ChildProcess(send + ["--count", "3000", "b"], in: harness)
                try await eventually("the second run is under way", timeout: .seconds(60)) { accepted(second).count >= 200 }
                second.kill()
                #expect(try await second.exitStatus() == SIGKILL)
                let resumed = second.lines.first { $0.hasPrefix("resuming") }
                #expect(resumed != nil, "the second run found the first run's messages in its outbox")
                let acceptedSecond = accepted(second)

                // A third run only sends what is left, and succeeds once all is acknowledged.
                let third = try ChildProcess(send + ["--timeout", "60"], in: harness)
                #expect(try await third.exitStatus() == 0, "\(third.lines.suffix(3))")
                #expect(!third.lines.contains { $0.hasPrefix("refused") || $0.hasPrefix("expired") })

                let handled = processed.withLockedValue { $0 }
                try await eventually("bob has everything the gateway processed (\(handled.count) handler runs)") {
                    inbox.count >= handled.count
                }
                let bodies = inbox.bodies
                let fromFirst = bodies.prefix { $0.hasPrefix("a-") }.count
                let fromSecond = bodies.count - fromFirst
                #expect(fromFirst >= acceptedFirst.count, "everything the first run accepted arrived")
                #expect(fromSecond >= acceptedSecond.count, "everything the second run accepted arrived")
                print(
                    "killed sender: run 1 accepted \(acceptedFirst.count), run 2 accepted \(acceptedSecond.count) after \(resumed ?? "-");",
                    "bob got \(fromFirst) + \(fromSecond), handler ran \(handled.count) times"
                )
                let expected = (0..<fromFirst).map { "a-\($0 + 1)" } + (0..<fromSecond).map { "b-\($0 + 1)" }
                #expect(firstDifference(bodies, expected) == nil, "once each, in the order they were accepted")
                #expect(firstDifference(handled, expected) == nil, "the handler ran once per message")
                #expect(inbox.violations.isEmpty)
            }
        }

        @Test(
            "the gateway process is killed and restarted mid-stream, twice: nothing accepted is lost or doubled",
            arguments: Endpoint.Transport.allCases
        )
        func gatewayKilled(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let port = try await freePort()
                let endpoint = Endpoint(host: "127.0.0.1", port: port, transport: transport)
                var serve = ["serve", "--store", temporaryFile("killed-gateway", in: harness)]
                serve += transport.isHTTP ? ["--no-tcp", "--ws-port", "\(port)"] : ["--port", "\(port)"]
                if transport.isSecure {
                    let certificates = TestCertificates.shared
                    serve += [
                        "--tls-cert", try TestCertificates.write(certificates.server.certificatePEM, name: "server.pem"),
                        "--tls-key", try TestCertificates.write(certificates.server.keyPEM, name: "server-key.pem"),
                    ]
                }
                var gateway = try ChildProcess(serve, in: harness)
                func reliableClient(_ id: String) throws -> TetherClient {
                    try harness.client([endpoint], clientID: id) { $0.reliability = try! .init(outbox: InMemoryOutboxStore()) }
                }
                let alice = try reliableClient("alice")
                let bob = try reliableClient("bob")
                let inbox = DeliveryCollector(bob, in: harness)
                let aliceEvents = harness.events(of: alice)

                let total = 3_000
                let texts = (1...total).map { "m-\($0)" }
                let sender = Task {
                    var receipts: [MessageReceipt] = []
                    for text in texts { receipts.append(try await alice.send("dm", body: ByteBuffer(string: text), conversation: "bob")) }
                    return receipts
                }
                for threshold in [300, 1_500] {
                    try await eventually("bob has \(threshold) messages", timeout: .seconds(60)) { inbox.count >= threshold }
                    gateway.kill()
                    #expect(try await gateway.exitStatus() == SIGKILL)
                    print("killed the gateway with \(inbox.count) delivered, \(try await alice.pendingMessages().count) unacknowledged")
                    gateway = try ChildProcess(serve, in: harness)
                }
                let receipts = try await sender.value
                if let failure = await firstUnacknowledged(receipts, of: alice) {
                    Issue.record(Comment(rawValue: failure))
                    return
                }
                try await eventually("bob has every message", timeout: .seconds(60)) { inbox.count >= total }
                // A duplicate of an earlier message would be delivered before a later one in the
                // same conversation: once this one is in, none can still come.
                _ = try await alice.send("dm", body: ByteBuffer(string: "last"), conversation: "bob")
                try await eventually("bob has the last message", timeout: .seconds(60)) { inbox.count >= total + 1 }
                // Alice reconnected after the kills (her "last" message went through the third
                // process). Not necessarily to the second: she may have sent everything before the
                // first kill and still been backing off when the second came. Her connection
                // events reach the collector a moment after the fact.
                try await eventually("alice's reconnection is reported") { aliceEvents.connects >= 2 }
                #expect(inbox.count == total + 1)
                #expect(firstDifference(inbox.bodies, texts + ["last"]) == nil, "once each, in order")
                #expect(inbox.violations.isEmpty)
            }
        }
    }
}
