import CompressNIO
import Foundation
import NIOCore
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherTestSupport

extension IntegrationTests {
    @Suite("Negotiated compression", .timeLimit(.minutes(2)))
    struct CompressionTests {
        /// A 1 KiB JSON document of the kind a chat or trading app sends.
        static let json: ByteBuffer = {
            var items: [String] = []
            var index = 0
            while items.joined(separator: ",").utf8.count < 1100 {
                items.append(#"{"id":\#(1000 + index),"user":"user-\#(index % 7)","text":"hello there","ts":17000000\#(index)}"#)
                index += 1
            }
            return ByteBuffer(string: String(("[" + items.joined(separator: ",")).prefix(1024)))
        }()

        /// The bytes the gateway received and sent, from its metrics.
        static func bytes(_ admin: String) async throws -> (received: Double, sent: Double) {
            let samples = AdminTests.samples(try await AdminTests.get(admin + "/metrics").body)
            return (
                samples[#"tether_bytes_received_total{transport="tcp"}"#] ?? 0,
                samples[#"tether_bytes_sent_total{transport="tcp"}"#] ?? 0
            )
        }

        @Test(
            "1 KiB JSON requests and replies take at least 3 times fewer bytes on the wire with compression than without, and arrive intact"
        )
        func savesBytes() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    configure: { $0.admin = .init(port: 0) },
                    metrics: .prometheus(),
                    routes: { gateway in gateway.handleInline("echo") { request, _ in request.body } }
                )
                let admin = "http://127.0.0.1:\(try await gateway.adminAddress.port!)"
                var used: [Bool: (received: Double, sent: Double)] = [:]
                for compressed in [false, true] {
                    let before = try await Self.bytes(admin)
                    let client = try harness.client([endpoint], clientID: "c\(compressed)") {
                        $0.connection.compression = compressed ? .defaults : nil
                    }
                    for _ in 0..<50 { #expect(try await client.request("echo", body: Self.json) == Self.json) }
                    client.shutdown()
                    try await eventually("the connection closed") { gateway.connections.isEmpty }
                    let after = try await Self.bytes(admin)
                    used[compressed] = (after.received - before.received, after.sent - before.sent)
                }
                let plain = try #require(used[false]), compressed = try #require(used[true])
                #expect(
                    plain.received / compressed.received >= 3,
                    "requests: \(plain.received) bytes plain, \(compressed.received) compressed"
                )
                #expect(plain.sent / compressed.sent >= 3, "replies: \(plain.sent) bytes plain, \(compressed.sent) compressed")
            }
        }

        @Test("a gateway that does not offer compression serves a client that offers it, uncompressed")
        func notOffered() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    configure: { $0.compression = nil },
                    routes: { gateway in gateway.handleInline("echo") { request, _ in request.body } }
                )
                let raw = try await RawConnection.connect(to: endpoint)
                defer { raw.close() }
                let welcome = try #require(try await raw.handshake(features: [.checksum, .compression]))
                #expect(!welcome.features.contains(.compression))
                let client = try harness.client([endpoint])
                #expect(try await client.request("echo", body: Self.json) == Self.json)
            }
        }

        @Test("a 1 MiB payload that inflates to 1 GiB gets ERROR frame too large and a close, within the limit's cost")
        func bomb() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    configure: {
                        $0.limits.maxBodySize = 4 << 20
                        $0.limits.maxBufferedInboundBytes = 8 << 20
                        $0.limits.maxBufferedOutboundBytes = max($0.limits.maxBufferedOutboundBytes, 4 << 20)
                    },
                    routes: { gateway in gateway.handleInline("echo") { request, _ in request.body } }
                )
                let compressor = try ZlibCompressor(algorithm: .deflate, configuration: .init(compressionLevel: 9))
                let zeros = ByteBuffer(repeating: 0, count: 1 << 20)
                var bomb = ByteBuffer()
                for step in 0..<1024 {
                    var input = zeros
                    bomb.reserveCapacity(minimumWritableBytes: compressor.maxSize(from: input))
                    try compressor.deflate(from: &input, to: &bomb, flush: step == 1023 ? .finish : .no)
                }
                #expect(bomb.readableBytes < 2 << 20)

                let raw = try await RawConnection.connect(to: endpoint)
                defer { raw.close() }
                let welcome = try #require(try await raw.handshake(features: .compression))
                #expect(welcome.features.contains(.compression))
                var frame = ByteBuffer()
                try FrameEncoder().encode(Frame(.request(.init(id: 1, method: "echo", body: bomb)), flags: []), into: &frame)
                frame.setInteger(FrameFlags.compressed.rawValue, at: frame.readerIndex + FrameHeader.flagsOffset)
                try await raw.send(bytes: frame)
                let answer = await raw.next(where: { if case .error = $0 { true } else { false } })
                guard case .error(let report)? = answer else {
                    Issue.record("expected an ERROR, got \(String(describing: answer))")
                    return
                }
                #expect(report.code == .frameTooLarge)
                #expect(report.message.contains("inflates beyond the limit of \(4 << 20) bytes"), "\(report.message)")
                try await raw.waitForClose()
                try await eventually("the gateway let the connection go") { gateway.connections.isEmpty }
            }
        }
    }
}
