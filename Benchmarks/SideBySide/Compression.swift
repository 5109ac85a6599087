import ArgumentParser
import Foundation
import NIOConcurrencyHelpers
import NIOCore
import Tether

/// `tether-bench compression`: the same JSON echo with negotiated compression off and on, one
/// run: requests per second at N in flight, bytes on the wire per request each way (the
/// client's statistics), and CPU per request (gateway process, driver process).
struct CompressionBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "compression",
        abstract: "JSON echo with compression off and on: throughput, wire bytes per request, CPU."
    )

    @Option(help: "The JSON body's size in bytes.")
    var body = 1024

    @Option(help: "Requests in flight.")
    var inFlight = 256

    @Option(help: "Seconds measured per run.")
    var seconds = 5.0

    @Option(help: "Runs of each (off, on, off, on, …).")
    var rounds = 2

    @Option(help: "zlib's level (1 to 9) on both sides.")
    var level = 6

    @Option(help: "Where results.md goes.")
    var output = "bench-results/compression"

    /// A JSON document of about `size` bytes, of the kind a chat or trading app sends.
    static func json(size: Int) -> ByteBuffer {
        var items: [String] = []
        var index = 0
        while items.joined(separator: ",").utf8.count < size {
            items.append(
                #"{"id":\#(1000 + index),"user":"user-\#(index % 7)","text":"hello there","price":\#(100 + index % 13).25,"ts":17000000\#(index)}"#
            )
            index += 1
        }
        return ByteBuffer(string: String(("[" + items.joined(separator: ",")).prefix(size)))
    }

    struct Row {
        var compressed: Bool
        var requestsPerSecond: Double
        var bytesSentPerRequest: Double
        var bytesReceivedPerRequest: Double
        var gatewayCPUPerRequest: Double
        var driverCPUPerRequest: Double
    }

    func run() async throws {
        let executable = try ChildProcess.thisExecutable()
        // The gateway processes (children) read it: TetherPeer.serve.
        setenv("TETHER_BENCH_COMPRESSION_LEVEL", "\(self.level)", 1)
        let body = Self.json(size: self.body)
        var rows: [Row] = []
        for _ in 0..<self.rounds {
            for compressed in [false, true] {
                let (server, port) = try ChildProcess.server(.tetherInline, executable: executable)
                defer { server.terminate() }
                let row = try await self.measure(port: port, server: server.pid, body: body, compressed: compressed)
                print(
                    "compression \(compressed ? "on " : "off"): \(Int(row.requestsPerSecond)) req/s, "
                        + "\(Int(row.bytesSentPerRequest)) B up / \(Int(row.bytesReceivedPerRequest)) B down per request"
                )
                rows.append(row)
            }
        }
        var markdown = "| Compression | req/s at \(self.inFlight) in flight | bytes up / request | bytes down / request "
        markdown += "| gateway CPU µs / request | driver CPU µs / request |\n|---|---|---|---|---|---|\n"
        for row in rows {
            markdown += "| \(row.compressed ? "on" : "off") | \(Int(row.requestsPerSecond)) | \(Int(row.bytesSentPerRequest)) "
            markdown += "| \(Int(row.bytesReceivedPerRequest)) | \(String(format: "%.2f", row.gatewayCPUPerRequest * 1e6)) "
            markdown += "| \(String(format: "%.2f", row.driverCPUPerRequest * 1e6)) |\n"
        }
        markdown += "\nBody: \(body.readableBytes) bytes of JSON; zlib level \(self.level); bytes are Tether frames as the client "
        markdown += "wrote and read them.\n"
        try FileManager.default.createDirectory(atPath: self.output, withIntermediateDirectories: true)
        try markdown.write(toFile: "\(self.output)/results.md", atomically: true, encoding: .utf8)
        print("\n" + markdown)
    }

    private func measure(port: Int, server: Int32, body: ByteBuffer, compressed: Bool) async throws -> Row {
        var configuration = ClientConfiguration(endpoints: [Endpoint(host: "127.0.0.1", port: port)], clientID: "bench")
        configuration.connection.compression = compressed ? try Compression(level: self.level) : nil
        let client = try TetherClient(configuration: configuration, logger: Peer.logger)
        return try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await client.run() }
            defer { client.shutdown() }
            _ = try await client.request("echo.inline", body: body)  // connected, warm
            let before = client.statistics
            let count = NIOLockedValueBox(0)
            let gatewayBefore = processCPUSeconds(pid: server) ?? 0
            let driverBefore = processCPUSeconds()
            let started = ContinuousClock.now
            let end = started + .milliseconds(Int(self.seconds * 1000))
            try await withThrowingTaskGroup(of: Void.self) { workers in
                for _ in 0..<self.inFlight {
                    workers.addTask {
                        while ContinuousClock.now < end {
                            let reply = try await client.request("echo.inline", body: body)
                            precondition(reply == body, "the echo changed the body")
                            count.withLockedValue { $0 += 1 }
                        }
                    }
                }
                try await workers.waitForAll()
            }
            let elapsed = started.duration(to: .now)
            let requests = Double(count.withLockedValue { $0 })
            let after = client.statistics
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            let row = Row(
                compressed: compressed,
                requestsPerSecond: requests / seconds,
                bytesSentPerRequest: Double(after.bytesSent - before.bytesSent) / requests,
                bytesReceivedPerRequest: Double(after.bytesReceived - before.bytesReceived) / requests,
                gatewayCPUPerRequest: ((processCPUSeconds(pid: server) ?? 0) - gatewayBefore) / requests,
                driverCPUPerRequest: (processCPUSeconds() - driverBefore) / requests
            )
            client.shutdown()
            try await group.waitForAll()
            return row
        }
    }
}
