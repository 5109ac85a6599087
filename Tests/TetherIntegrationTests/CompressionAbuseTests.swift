import CompressNIO
import Foundation
import NIOCore
import Testing
import Tether
import TetherCompression
import TetherCore
import TetherGateway
import TetherTestSupport

extension IntegrationTests {
    /// Compression priced honestly: what a compressed request costs the gateway in zlib is paced
    /// per connection, and a payload may inflate at most 64 times its size.
    @Suite("Compression priced: paced work, a ratio cap", .timeLimit(.minutes(2)))
    struct CompressionAbuseTests {
        /// About 1,000 KiB of text that DEFLATE shrinks between 10 and 64 times: what an attacker
        /// sends to make the gateway inflate (and deflate an echo of) near its body limit.
        static let nearLimit: ByteBuffer = {
            let words = ["price", "bid", "ask", "symbol", "volume", "time", "trade", "quote"]
            var generator = SplitMix64(seed: 40)
            var body = ByteBuffer()
            while body.readableBytes < 1000 * 1024 { body.writeString(words[Int(generator.next() % 8)] + " ") }
            return body.getSlice(at: 0, length: 1000 * 1024)!
        }()

        /// A HELLO offering compression, then `count` compressed `echo` requests of
        /// ``nearLimit``, encoded once, in a file for Peers/flood.py.
        static func floodFile(as clientID: String, count: Int, in harness: Harness) throws -> String {
            var frames = ByteBuffer()
            let hello = Frame.Hello(versions: 1...1, features: [.checksum, .compression], maxBodySize: 2 << 20, clientID: clientID)
            try FrameEncoder().encode(Frame(.hello(hello), flags: .checksum), into: &frames)
            let deflater = try PayloadDeflater(threshold: 512)
            for id in 1...UInt64(count) {
                try FrameEncoder().encode(
                    Frame(.request(.init(id: id, method: "echo", body: Self.nearLimit)), flags: .checksum),
                    into: &frames,
                    deflater: deflater
                )
            }
            let path = FileManager.default.temporaryDirectory.appendingPathComponent("tether-compressed-flood-\(UUID().uuidString)").path
            try Data(frames.readableBytesView).write(to: URL(fileURLWithPath: path))
            harness.onExit { try? FileManager.default.removeItem(atPath: path) }
            return path
        }

        @Test(
            "four processes writing compressed near-limit requests at once are paced at their connections' compression rate, none refused; another client's median round trip stays under 50 ms",
            .requires(.python3)
        )
        func pacedFlood() async throws {
            try OutsideTool.python3.require()
            let deflater = try PayloadDeflater(threshold: 512)
            var compressed = ByteBuffer()
            #expect(deflater.deflate(Self.nearLimit, into: &compressed))
            let ratio = Self.nearLimit.readableBytes / max(1, compressed.readableBytes)
            #expect((3...Compression.maximumRatio).contains(ratio), "the body compresses \(ratio) times")

            try await withHarness(timeLimit: .seconds(90)) { harness in
                let (_, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handleInline("echo") { request, _ in request.body }
                })
                let good = try harness.client([endpoint], clientID: "good") { $0.connection.compression = nil }
                #expect(try await good.request("echo", body: ByteBuffer(string: "hi")).string == "hi")
                let count = 20
                let files = try (0..<4).map { try Self.floodFile(as: "flood-\($0)", count: count, in: harness) }
                let calls = WellBehavedCalls(good, in: harness)
                try await Task.sleep(for: .milliseconds(300))
                calls.mark = calls.count
                let flooders = try FloodProcess.start(endpoint, files: files, perConnection: count, in: harness)
                var seconds: [Double] = []
                var answered: [String] = []
                for flooder in flooders {
                    #expect(try await flooder.exitStatus(timeout: .seconds(60)) == 0, "\(flooder.lines)")
                    let line = flooder.lines.last ?? ""
                    answered.append(line)
                    #expect(line.hasPrefix("answered \(count) ") && line.hasSuffix("ok=\(count)"), "every request answered ok: \(line)")
                    if let field = line.split(separator: " ").first(where: { $0.hasPrefix("seconds=") }) {
                        seconds.append(Double(field.dropFirst("seconds=".count)) ?? 0)
                    }
                }
                let p50 = calls.percentile(50, since: calls.mark)
                let measured = calls.calls(since: calls.mark)
                let rate = Double(GatewayConfiguration.Limits.defaults.compressionBytesPerSecondPerConnection)
                // Each request costs an inflate and a deflate of ~1,000 KiB; the first second's
                // worth is the burst.
                let paced = (Double(count * 2 * Self.nearLimit.readableBytes) - rate) / rate
                print(
                    "compression flood: \(answered); requests of \(Self.nearLimit.readableBytes >> 10) KiB compressed \(ratio)x; paced to at least \(String(format: "%.1f", paced)) s; the good client's p50 \(p50.milliseconds) ms over \(measured.count) calls"
                )
                #expect(seconds.allSatisfy { $0 >= paced * 0.8 }, "paced to the compression rate: \(seconds) s")
                #expect(p50 < .milliseconds(50), "the good client's median round trip was \(p50.milliseconds) ms")
                #expect(measured.failures == 0)
                _ = calls.finish()
            }
        }

        @Test("a payload that inflates more than 64 times its size gets ERROR protocol error and a close, as soon as it passes the ratio")
        func ratioCap() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(routes: { gateway in
                    gateway.handleInline("echo") { request, _ in request.body }
                })
                let compressor = try ZlibCompressor(algorithm: .deflate, configuration: .init(compressionLevel: 9))
                var input = ByteBuffer(repeating: 0, count: 1000 * 1024)
                var payload = ByteBuffer()
                payload.reserveCapacity(minimumWritableBytes: compressor.maxSize(from: input))
                try compressor.deflate(from: &input, to: &payload, flush: .finish)
                #expect(payload.readableBytes < 2048, "about 1 KiB that inflates to 1,000 KiB")

                let raw = try await RawConnection.connect(to: endpoint)
                defer { raw.close() }
                #expect(try await raw.handshake(features: .compression)?.features.contains(.compression) == true)
                var frame = ByteBuffer()
                try FrameEncoder().encode(Frame(.request(.init(id: 1, method: "echo", body: payload)), flags: []), into: &frame)
                frame.setInteger(FrameFlags.compressed.rawValue, at: frame.readerIndex + FrameHeader.flagsOffset)
                try await raw.send(bytes: frame)
                guard case .error(let report)? = await raw.next(where: { if case .error = $0 { true } else { false } }) else {
                    Issue.record("no ERROR")
                    return
                }
                #expect(report.code == .protocolError && report.message.contains("more than 64 times"), "\(report.message)")
                try await raw.waitForClose()
                try await eventually("the gateway let the connection go") { gateway.connections.isEmpty }
            }
        }
    }
}
