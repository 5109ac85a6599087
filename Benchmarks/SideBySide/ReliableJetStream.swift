import Foundation
import TetherPostgres

#if canImport(Glibc)
    import Glibc
#endif

/// NATS JetStream beside Tether in `tether-bench reliable`: nats-server with file storage (its
/// default flush policy, as loose as Tether's SQLite at `synchronous = NORMAL`), a publisher
/// process and a consumer process (`jetstream-bench`, a Go program on nats.go built by
/// `Benchmarks/setup-jetstream` from Debian's packages), as alice and bob are for Tether.
///
/// The publisher sends from `senders` goroutines, each to a subject of its own, asynchronously
/// with at most 256 unacknowledged messages each; with one sender, each publish waits for the
/// stream's acknowledgement. The consumer is a durable push consumer that acknowledges every
/// message and counts each once. Delivered: from the first publish until the consumer had the
/// last message. Bodies are at least 8 bytes (each starts with its message's number).
struct ReliableJetStream {
    var messages: Int
    var senders: Int
    var body: Int

    /// The run's result, or `nil` (with a line saying why) when JetStream is not installed.
    func run() async throws -> Reliable.Result? {
        guard let server = Self.find("nats-server"), let driver = Self.find("jetstream-bench") else {
            emit("jetstream: skipped, nats-server or jetstream-bench not found; Benchmarks/setup-jetstream installs them (as root)")
            return nil
        }
        let scratch = FileManager.default.temporaryDirectory.appendingPathComponent("tether-jetstream-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: scratch, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: scratch) }

        let bodyBytes = max(8, self.body)  // each body starts with its message's number
        let port = try LocalPostgres.freePort()  // any free port, not only PostgreSQL's
        let nats = try ChildProcess(server, ["-js", "-sd", scratch.path, "-a", "127.0.0.1", "-p", "\(port)"])
        defer { nats.terminate() }
        try await Self.waitForListener(port: port, process: nats)
        let url = "nats://127.0.0.1:\(port)"

        let consumer = try ChildProcess(driver, ["consume", "-url", url, "-messages", "\(self.messages)"])
        defer { consumer.terminate() }
        guard consumer.readLine() == "ready" else { throw BenchError("the JetStream consumer did not start: \(consumer.errors())") }

        let serverCPU = processCPUSeconds(pid: nats.pid) ?? 0
        let startedAt = Date().timeIntervalSince1970
        let publisher = try ChildProcess(
            driver,
            ["publish", "-url", url, "-messages", "\(self.messages)", "-senders", "\(self.senders)", "-body", "\(bodyBytes)"]
                + (self.senders == 1 ? ["-await"] : [])
        )
        defer { publisher.terminate() }
        // "published N SECONDS CPU", then "received N AT CPU DUPLICATES".
        guard let published = publisher.readLine()?.split(separator: " "), published.count == 4, published[0] == "published",
            Int(published[1]) == self.messages, let accepted = Double(published[2]), let publisherCPU = Double(published[3])
        else { throw BenchError("the JetStream publisher failed: \(publisher.errors())") }
        guard let received = consumer.readLine()?.split(separator: " "), received.count == 5, received[0] == "received",
            let last = Double(received[2]), let consumerCPU = Double(received[3]), let duplicates = Int(received[4])
        else { throw BenchError("the JetStream consumer failed: \(consumer.errors())") }
        guard Int(received[1]) == self.messages else {
            throw BenchError("the JetStream consumer had \(received[1]) of \(self.messages) messages after 300 s")
        }
        let delivered = last - startedAt
        let result = Reliable.Result(
            peer: .jetstream,
            limits: nil,
            limitPerConnection: nil,
            messages: self.messages,
            senders: self.senders,
            bodyBytes: bodyBytes,
            acceptedSeconds: accepted,
            deliveredSeconds: delivered,
            deliveredPerSecond: Double(self.messages) / delivered,
            aliceCPUSeconds: publisherCPU,
            gatewayCPUSeconds: (processCPUSeconds(pid: nats.pid) ?? 0) - serverCPU,
            bobCPUSeconds: consumerCPU
        )
        emit(
            "jetstream\(self.senders == 1 ? " (each publish awaited)" : ""): \(self.messages) messages of \(bodyBytes) B from \(self.senders) publishers: "
                + "acknowledged by the stream in \(String(format: "%.2f", accepted)) s (\(Int(Double(self.messages) / accepted))/s), "
                + "delivered in \(String(format: "%.2f", delivered)) s = \(Int(result.deliveredPerSecond))/s; "
                + "CPU publisher \(String(format: "%.2f", publisherCPU)) s, nats-server \(String(format: "%.2f", result.gatewayCPUSeconds)) s, "
                + "consumer \(String(format: "%.2f", consumerCPU)) s"
                + (duplicates > 0 ? "; \(duplicates) duplicates received (publishes sent again after a lost acknowledgement)" : "")
        )
        return result
    }

    /// `name` on `PATH`, or in /usr/sbin and /usr/local/bin (where Debian and the setup put them).
    static func find(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? ""
        let directories = path.split(separator: ":").map(String.init) + ["/usr/sbin", "/usr/local/bin"]
        return directories.map { "\($0)/\(name)" }.first { FileManager.default.isExecutableFile(atPath: $0) }
    }

    /// Returns once something accepts connections on `port` (or throws after 10 s).
    static func waitForListener(port: Int, process: ChildProcess) async throws {
        for _ in 0..<200 {
            let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
            var address = sockaddr_in()
            address.sin_family = sa_family_t(AF_INET)
            address.sin_addr.s_addr = inet_addr("127.0.0.1")
            address.sin_port = UInt16(port).bigEndian
            let connected = withUnsafePointer(to: &address) { pointer in
                pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                    connect(descriptor, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
                }
            }
            close(descriptor)
            if connected { return }
            try await Task.sleep(for: .milliseconds(50))
        }
        throw BenchError("nats-server did not listen on \(port) within 10 s: \(process.errors())")
    }
}
