import Foundation
import NIOCore
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherNIO
import TetherTestSupport

extension IntegrationTests {
    /// The memory budget and the body timeout on the TCP transport, with frames sent by hand.
    @Suite("Memory budget and body timeout over TCP", .timeLimit(.minutes(2)))
    struct MemoryBudgetIntegrationTests {
        /// A REQUEST frame of `size` body bytes, encoded (with a checksum).
        static func request(id: UInt64, size: Int) throws -> ByteBuffer {
            var buffer = ByteBuffer()
            let body = ByteBuffer(repeating: 0x61, count: max(0, size - 4 - 4))
            try FrameEncoder().encode(Frame(.request(.init(id: id, method: "echo", body: body)), flags: .checksum), into: &buffer)
            return buffer
        }

        @Test("a frame trickled a byte at a time is refused at the body timeout: ERROR resource exhausted, then a close")
        func trickledFrame() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    configure: { $0.timeouts.body = .seconds(1) },
                    routes: TransportTests.echo
                )
                let connection = try await RawConnection.connect(to: endpoint)
                defer { connection.close() }
                #expect(try await connection.handshake() != nil)
                var frame = try Self.request(id: 1, size: 2000)
                let started = ContinuousClock.now
                let trickle = Task {
                    while let byte = frame.readSlice(length: 1), connection.channel.isActive {
                        try? await connection.send(bytes: byte)
                        try? await Task.sleep(for: .milliseconds(100))
                    }
                }
                defer { trickle.cancel() }
                guard case .error(let report)? = await connection.next(where: { if case .error = $0 { true } else { false } }) else {
                    Issue.record("no ERROR")
                    return
                }
                let elapsed = ContinuousClock.now - started
                #expect(report.code == .resourceExhausted)
                #expect(report.message.contains("took longer than"), "\(report.message)")
                #expect(elapsed >= .milliseconds(900) && elapsed < .seconds(3), "refused after \(elapsed)")
                try await connection.waitForClose()
            }
        }

        @Test(
            "at the budget, connections holding frames pause and new ones are refused; a client already connected is served; a paused frame is refused once the budget stayed full for the body timeout, and room returns"
        )
        func budgetPacesThenRefuses() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    configure: {
                        $0.limits.maxBodySize = 1 << 20
                        $0.limits.maxBufferedInboundBytes = 2 << 20
                        $0.limits.memoryBudget = 4 << 20  // exhausted at 3 MiB
                        $0.timeouts.body = .seconds(2)
                    },
                    routes: TransportTests.echo
                )
                let good = try harness.client([endpoint], clientID: "good")
                #expect(try await good.request("echo", body: ByteBuffer(string: "before")).string == "before")

                // Four connections each send 900 KiB of a 1 MiB frame: 3.6 MiB held.
                var holders: [RawConnection] = []
                for index in 0..<4 {
                    let connection = try await RawConnection.connect(to: endpoint)
                    #expect(try await connection.handshake(clientID: "holder-\(index)") != nil)
                    var frame = try Self.request(id: 1, size: 1000 << 10)
                    try await connection.send(bytes: frame.readSlice(length: 900 << 10)!)
                    holders.append(connection)
                }
                defer { for holder in holders { holder.close() } }
                try await eventually("the budget is exhausted") { gateway.health.memoryHeld >= 3 << 20 }

                let refused = try await RawConnection.connect(to: endpoint)
                guard case .error(let report)? = await refused.next()?.payload else {
                    Issue.record("a new connection was not refused")
                    return
                }
                #expect(report.code == .resourceExhausted && report.message.contains("memory budget"), "\(report.message)")
                #expect(
                    try await good.request("echo", body: ByteBuffer(string: "during")).string == "during",
                    "the connected client is served"
                )

                // At the body timeout the holders are refused, and the budget has room again.
                for holder in holders {
                    guard case .error(let report)? = await holder.next(where: { if case .error = $0 { true } else { false } }) else {
                        Issue.record("a paused holder was not refused")
                        continue
                    }
                    // Refused at the body timeout: paused by the full budget, or waiting for the
                    // rest of its frame (one that read its last bytes before the budget filled).
                    #expect(
                        report.code == .resourceExhausted
                            && (report.message.contains("memory budget stayed full") || report.message.contains("took longer than")),
                        "\(report.message)"
                    )
                }
                try await eventually("the budget has room again") { gateway.health.memoryHeld < 1 << 20 }
                let later = try await RawConnection.connect(to: endpoint)
                defer { later.close() }
                #expect(try await later.handshake(clientID: "later") != nil, "new connections are admitted again")
            }
        }

        @Test(
            "a WebSocket message begun and never finished is refused at the body timeout: ERROR resource exhausted, close 1013 (a Python websockets peer)",
            .requires(.pythonWebsockets)
        )
        func unfinishedWebSocketMessage() async throws {
            try OutsideTool.pythonWebsockets.require()
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: .webSocket,
                    configure: {
                        $0.timeouts.body = .seconds(1)
                        $0.timeouts.handshake = .seconds(30)
                    },
                    routes: TransportTests.echo
                )
                let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Peers/websocket_slow.py")
                    .path
                let peer = try ChildProcess(
                    executable: "/usr/bin/env",
                    ["python3", script, "ws://127.0.0.1:\(endpoint.port)\(endpoint.path!)"],
                    in: harness
                )
                #expect(try await peer.exitStatus(timeout: .seconds(40)) == 0, "\(peer.lines)")
                let result = peer.lines.last ?? ""
                #expect(result.contains("\"ok\": true"), "\(peer.lines.joined(separator: "\n"))")
            }
        }
    }
}
