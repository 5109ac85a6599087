import Foundation
import NIOCore
import Testing
import Tether
import TetherCore
import TetherLab
import TetherNIO
import TetherTestSupport
import TetherTesting

extension IntegrationTests {
    /// Unfinished POST bodies against a real `tether serve` process with a memory budget: over
    /// HTTP/1.1, 3,000 connections each sending all but the last byte of a declared 1 MiB body;
    /// over HTTP/2, 10 connections of 99 such streams. Loopback only, bounded in count and time.
    ///
    /// Asserted: the gateway's resident memory grows by less than its budget, a well-behaved
    /// client's round trips stay under 50 ms at the median, and the body timeout ends every
    /// unfinished POST (`408`, or `503` for one paused by the full budget that long).
    @Suite("Abuse: unfinished bodies against the memory budget", .timeLimit(.minutes(4)))
    struct BudgetAbuseTests {
        static let budget = 256 << 20
        static let declared = 1 << 20
        static let bodyTimeout = 15

        @Test("3,000 connections holding unfinished 1 MiB POST bodies: memory within the budget, another client served")
        func unfinishedPosts() async throws {
            try await self.attack(http2: false)
        }

        @Test("10 HTTP/2 connections of 99 unfinished 1 MiB POST streams: memory within the budget, another client served")
        func unfinishedHTTP2Streams() async throws {
            try await self.attack(http2: true)
        }

        /// What the gateway's `/metrics` says its connections hold of the budget.
        static func heldBytes(adminPort: Int) async throws -> Int {
            let peer = try await HTTPPeer.connect(port: adminPort)
            defer { peer.close() }
            let text = try await peer.send(.GET, "/metrics").wait().body
            return Int(MetricsSamples(parsing: text).total("tether_memory_held_bytes"))
        }

        /// `/ready`'s status and reasons.
        static func ready(adminPort: Int) async throws -> String {
            let peer = try await HTTPPeer.connect(port: adminPort)
            defer { peer.close() }
            let response = try await peer.send(.GET, "/ready").wait()
            return "\(response.status.code) \(response.body.trimmingCharacters(in: .whitespacesAndNewlines))"
        }

        func attack(http2: Bool) async throws {
            try await withHarness(timeLimit: .seconds(200)) { harness in
                let port = try await freePort()
                let httpPort = try await freePort()
                let adminPort = try await freePort()
                var arguments = [
                    "serve", "--port", "\(port)", "--ws-port", "\(httpPort)", "--store", ":memory:",
                    "--handshake-timeout", "120", "--memory-budget", "\(Self.budget)", "--body-timeout", "\(Self.bodyTimeout)",
                    "--admin-port", "\(adminPort)",
                    "--max-connections-per-address", "100000", "--max-unauthenticated", "100000",
                    "--handshakes-per-second", "100000", "--handshakes-per-second-per-address", "100000",
                ]
                if http2 {
                    let certificates = TestCertificates.shared
                    arguments += [
                        "--tls-cert", try TestCertificates.write(certificates.server.certificatePEM, name: "budget-cert.pem"),
                        "--tls-key", try TestCertificates.write(certificates.server.keyPEM, name: "budget-key.pem"),
                    ]
                }
                let gateway = try ChildProcess(arguments, in: harness)
                try await eventually("the gateway listens", timeout: .seconds(60)) {
                    gateway.lines.filter { $0.contains("listening") }.count >= 2
                }
                let good = try harness.client([Endpoint(host: "127.0.0.1", port: port, transport: http2 ? .tls : .tcp)], clientID: "good")
                try await eventually("the good client is connected") { if case .connected = good.connectionState { true } else { false } }
                let calls = WellBehavedCalls(good, in: harness)

                // The attacker's own stream: its token is what its POSTs name (they never end,
                // so their proofs are never checked).
                let stream = try await HTTPPeer.connect(port: httpPort, tls: http2)
                defer { stream.close() }
                let token = try await stream.openStream().token
                try await Task.sleep(for: .milliseconds(500))
                let baseline = try #require(gateway.residentBytes)
                let memory = MemoryWatch(gateway, in: harness)

                let started = ContinuousClock.now
                let flood =
                    http2
                    ? try await UnfinishedPosts.http2(connections: 10, streams: 99, port: httpPort, token: token, declared: Self.declared)
                    : try await UnfinishedPosts.http1(count: 3000, port: httpPort, token: token, declared: Self.declared)
                let opening = ContinuousClock.now - started
                try await Task.sleep(for: .seconds(3))  // the bodies pour in until the budget pauses them
                calls.mark = calls.count
                try await Task.sleep(for: .seconds(5))
                let held = try await Self.heldBytes(adminPort: adminPort)
                let ready = try await Self.ready(adminPort: adminPort)
                let p50 = calls.percentile(50, since: calls.mark)
                let p99 = calls.percentile(99, since: calls.mark)
                let measured = calls.calls(since: calls.mark)
                let open = flood.open
                let peak = memory.finish()
                let growth = peak - baseline
                print(
                    "budget abuse (\(http2 ? "HTTP/2" : "HTTP/1.1")): opened in \(opening.milliseconds) ms, \(open) open; the gateway counts \(held >> 20) MiB held (/ready: \(ready)); gateway RSS \(baseline >> 20) → peak \(peak >> 20) MiB (+\(growth >> 20) MiB, budget \(Self.budget >> 20) MiB); good client \(measured.count) calls, p50 \(p50.milliseconds) ms, p99 \(p99.milliseconds) ms, \(measured.failures) failed"
                )
                #expect(gateway.isRunning)
                #expect(growth < Self.budget, "the gateway grew by \(growth >> 20) MiB, over its budget of \(Self.budget >> 20) MiB")
                #expect(p50 < .milliseconds(50), "the good client's median round trip was \(p50.milliseconds) ms")
                #expect(measured.count > 50)

                // The body timeout ends the unfinished POSTs it holds (over HTTP/2, the attacker's
                // queued streams then take their places, and are timed out in turn).
                try await eventually("the body timeout ends the unfinished POSTs", timeout: .seconds(Self.bodyTimeout * 3)) {
                    flood.endings["408"] ?? 0 >= (http2 ? 100 : open)
                }
                let endings = flood.endings
                print(
                    "budget abuse (\(http2 ? "HTTP/2" : "HTTP/1.1")): the unfinished POSTs ended with \(endings.sorted { $0.key < $1.key })"
                )
                #expect(endings.keys.allSatisfy { ["408", "503"].contains($0) }, "\(endings)")
                await flood.stop()
                // Polled every 100 ms, one admin connection at a time: at `eventually`'s pace each
                // poll's connection (closed without waiting) could pile up at the admin listener's
                // 64 while the gateway tears the flood down, and one GET then went unanswered.
                // A gateway that kept the attack's bytes fails this at any bound.
                try await eventually("the gateway holds nothing of the attack once it stopped", timeout: .seconds(30)) {
                    try? await Task.sleep(for: .milliseconds(100))
                    return (try? await Self.heldBytes(adminPort: adminPort)).map { $0 < 1 << 20 } ?? false
                }
                print(
                    "budget abuse (\(http2 ? "HTTP/2" : "HTTP/1.1")): after the attack the gateway's RSS is \((gateway.residentBytes ?? 0) >> 20) MiB"
                )
                let after = calls.finish()
                #expect(after.failures == 0, "\(after.failureSamples)")
            }
        }
    }
}
