import Foundation
import Testing
import TetherLab
import TetherTestSupport

/// The short version of the weak-network lab (`tether lab run --quick`), run as a real child
/// process: a gateway process, real clients, real dropped packets where the machine allows.
extension IntegrationTests {
    @Suite("Weak-network lab (quick)")
    struct LabTests {
        /// Why packet loss cannot be injected on this machine (`nil` if it can).
        static let packetFilterUnavailable = PacketFilter.unavailableReason()

        /// Runs a test that drops real packets where the machine can, and in CI (where it
        /// fails if it cannot); elsewhere skips it, saying how to install what it needs.
        static let needsPacketLoss = ConditionTrait.enabled(
            if: Self.packetFilterUnavailable == nil || OutsideTool.isCI,
            "skipped: \(Self.packetFilterUnavailable ?? ""); install with `scripts/install-test-tools` and run as root"
        )

        /// Whether packets can be dropped here; in CI, an issue says why not.
        static func packetLossAvailable() -> Bool {
            guard let reason = Self.packetFilterUnavailable else { return true }
            Issue.record("CI: real packet loss is unavailable: \(reason); install with `scripts/install-test-tools` and run as root")
            return false
        }

        static func run(_ scenarios: [String], in harness: Harness) async throws -> [String: ScenarioResult] {
            let output = FileManager.default.temporaryDirectory.appendingPathComponent("tether-lab-\(UUID().uuidString)").path
            harness.onExit { try? FileManager.default.removeItem(atPath: output) }
            let lab = try ChildProcess(["lab", "run", "--quick", "--output", output] + scenarios, in: harness)
            let status = try await lab.exitStatus(timeout: .seconds(240))
            try #require(status == 0, "tether lab run failed:\n\(lab.lines.suffix(30).joined(separator: "\n"))")
            let data = try Data(contentsOf: URL(fileURLWithPath: "\(output)/results.json"))
            let results = try JSONDecoder().decode([ScenarioResult].self, from: data)
            #expect(FileManager.default.fileExists(atPath: "\(output)/REPORT.md"))
            return Dictionary(uniqueKeysWithValues: results.map { ($0.name, $0) })
        }

        /// Every accepted message reached Bob's app, once, in order.
        static func expectEverythingDelivered(_ result: ScenarioResult?, sourceLocation: SourceLocation = #_sourceLocation) throws {
            let result = try #require(result, sourceLocation: sourceLocation)
            #expect(result.skipped == nil, sourceLocation: sourceLocation)
            let delivery = try #require(result.delivery, sourceLocation: sourceLocation)
            #expect(delivery.accepted > 0, sourceLocation: sourceLocation)
            #expect(delivery.eventually == delivery.accepted, "\(result.name): not all delivered", sourceLocation: sourceLocation)
            #expect(delivery.duplicates == 0, sourceLocation: sourceLocation)
            #expect(delivery.orderViolations == 0, sourceLocation: sourceLocation)
        }

        @Test(
            "clean, network switch with a path signal, gateway restart with 300 clients; restrictive networks: fallback to the HTTP stream and back"
        )
        func withoutPacketLoss() async throws {
            try await withHarness(timeLimit: .seconds(150)) { harness in
                let restricted = ["restricted-rejected", "restricted-blackholed"]
                let results = try await Self.run(["clean", "switch", "herd"] + restricted, in: harness)
                for name in ["clean", "switch", "herd"] + restricted { try Self.expectEverythingDelivered(results[name]) }

                // The gateway's own view (its /metrics) agrees with what the lab measured.
                for name in ["clean", "switch", "herd"] {
                    let view = try #require(results[name]?.gateway, "\(name): no gateway view")
                    #expect(view.disagreements.isEmpty, "\(name): \(view.disagreements)")
                    #expect(view.connectionsOpen == view.clients && view.clients > 0, "\(name)")
                }
                let clean = try #require(results["clean"]?.gateway)
                #expect(!clean.restarted && clean.messagesProcessed == results["clean"]?.delivery?.accepted)
                #expect(clean.deliveriesAcknowledged > 0 && clean.deliveriesAcknowledged <= clean.deliveriesSent)
                #expect(results["herd"]?.gateway?.restarted == true)

                // The raw port rejected (or blackholed) and WebSocket refused: every client's first
                // request succeeds over the HTTP stream within 2 s (3 s), and every client is back
                // on the raw port within one heartbeat interval of it opening.
                for (name, limit) in zip(restricted, [2.0, 3.0]) {
                    let run = try #require(results[name]?.restricted, "\(name)")
                    #expect(run.noFirstRequest == 0, "\(name)")
                    #expect(run.firstTransports["http"] == run.clients, "\(name): \(run.firstTransports)")
                    #expect(try #require(run.firstRequest).p90 <= limit, "\(name): \(String(describing: run.firstRequest))")
                    #expect(run.neverMovedUp == 0, "\(name)")
                    #expect(try #require(run.movedUp).max <= run.heartbeatIntervalSeconds, "\(name): \(String(describing: run.movedUp))")
                    // One move up per client: a probe that passes only because the port accepts
                    // (while it swallows everything) would send clients up and back every interval.
                    let disconnects = results[name]?.disconnects.values.reduce(0, +) ?? 0
                    #expect(disconnects <= run.clients, "\(name): \(disconnects) disconnections for \(run.clients) clients")
                }

                let switched = try #require(results["switch"]?.reconnection)
                #expect(switched.signalled)
                #expect(switched.neverReconnected == 0)
                let restored = try #require(switched.restoredToConnected)
                #expect(restored.count >= 10, "every client lost its silent connection and came back")
                // With the signal the client reconnects at once, not after a heartbeat timeout.
                #expect(restored.max < 3, "restored → connected took up to \(restored.max) s")

                let herd = try #require(results["herd"]?.herd)
                #expect(herd.clients == 300)
                #expect(herd.secondsToAllReconnected != nil, "every client reconnected after the restart")
                #expect(results["herd"]?.reconnection?.neverReconnected == 0)
            }
        }

        @Test(
            "30 % packet loss and a blackhole without signal (real dropped packets), over TCP and over WSS; 30 % loss over the HTTP stream",
            Self.needsPacketLoss
        )
        func withPacketLoss() async throws {
            guard Self.packetLossAvailable() else { return }
            try await withHarness(timeLimit: .seconds(210)) { harness in
                let results = try await Self.run(["loss-30", "blackhole", "loss-30-wss", "blackhole-wss", "loss-30-http"], in: harness)
                try Self.expectEverythingDelivered(results["loss-30-http"])
                #expect(results["loss-30-http"]?.backlog?.drainSeconds != nil, "the 1,000-message backlog drained over the HTTP stream")
                for suffix in ["", "-wss"] {
                    try Self.expectEverythingDelivered(results["loss-30" + suffix])
                    #expect(results["loss-30" + suffix]?.backlog?.drainSeconds != nil, "the 1,000-message backlog drained")

                    try Self.expectEverythingDelivered(results["blackhole" + suffix])
                    let blackhole = try #require(results["blackhole" + suffix])
                    let reconnection = try #require(blackhole.reconnection)
                    #expect(!reconnection.signalled)
                    #expect(reconnection.neverReconnected == 0)
                    // Detected by the heartbeat: 2 s interval + at most 5 s timeout, plus a second.
                    let detection = try #require(reconnection.detection)
                    #expect(detection.count >= 10)
                    #expect(detection.max <= 8, "a blackholed link was detected only after \(detection.max) s (\(blackhole.name))")
                    #expect(blackhole.ttlProbe == "expired", "a message that missed its TTL fails visibly")
                }
            }
        }

        @Test(
            "channels: 30 subscribers cut off once each for 1–8 s under 30 % loss while publications go on: each ends with every publication once and in order, or a gap event exactly where the history ran out",
            Self.needsPacketLoss
        )
        func channelsCutOff() async throws {
            guard Self.packetLossAvailable() else { return }
            try await withHarness(timeLimit: .seconds(200)) { harness in
                let results = try await Self.run(["channels"], in: harness)
                let run = try #require(results["channels"]?.channels)
                #expect(run.published > 0 && run.received > 0)
                #expect(run.duplicates == 0 && run.silentlyLost == 0 && run.epochChanges == 0)
                #expect(run.inexactGaps == 0 && run.unjustifiedGaps == 0)
                #expect(run.notCaughtUp == 0)
                // Every publication of a subscriber's channel reached it, or was in a gap it was told of.
                #expect(run.received + run.missedInGaps == run.expected)
                // Each subscribed again after its cut: told `.subscribed`, or `.gap` when its history ran out.
                #expect(run.subscriptions + run.gaps >= 2 * run.clients)
            }
        }
    }
}
