import Foundation
import Histogram
import NIOCore
import TetherCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// What one drive measured, printed by `tether-bench drive` as one JSON line.
struct Measurement: Codable, Sendable {
    var peer: String
    var bodyBytes: Int
    /// Requests on the wire at once (1: sequential).
    var inFlight: Int
    /// Whether this is the latency run (a fixed number of sequential requests).
    var sequential: Bool
    var completed: Int
    var seconds: Double
    var perSecond: Double { Double(self.completed) / self.seconds }
    /// Microseconds; from the latency run (or the floor's handler, which times every request).
    var p50: Double?
    var p90: Double?
    var p99: Double?
    var p999: Double?
    var max: Double?
    /// CPU time of the client process over the measured part.
    var clientCPUSeconds: Double
    /// CPU time of the server process over the same part (filled in by the runner).
    var serverCPUSeconds: Double?

    mutating func setLatency(_ histogram: Histogram<UInt64>) {
        func micro(_ percentile: Double) -> Double { Double(histogram.valueAtPercentile(percentile)) / 1000 }
        self.p50 = micro(50)
        self.p90 = micro(90)
        self.p99 = micro(99)
        self.p999 = micro(99.9)
        self.max = Double(histogram.max) / 1000
    }

    /// CPU seconds, client and server, per 100,000 requests.
    var cpuPer100k: Double? {
        guard let server = self.serverCPUSeconds, self.completed > 0 else { return nil }
        return (self.clientCPUSeconds + server) / Double(self.completed) * 100_000
    }
}

/// CPU seconds (user + system) this process has used.
func processCPUSeconds() -> Double {
    var usage = rusage()
    getrusage(__rusage_who_t(RUSAGE_SELF.rawValue), &usage)
    func seconds(_ time: timeval) -> Double { Double(time.tv_sec) + Double(time.tv_usec) / 1e6 }
    return seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

/// CPU seconds (user + system) process `pid` has used, from /proc (Linux).
func processCPUSeconds(pid: Int32) -> Double? {
    guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
        let close = stat.lastIndex(of: ")")
    else { return nil }
    // Fields after the command name: state is field 3; utime and stime are fields 14 and 15.
    let fields = stat[stat.index(after: close)...].split(separator: " ")
    guard fields.count > 13, let user = Double(fields[11]), let system = Double(fields[12]) else { return nil }
    return (user + system) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// CPU seconds the processes `pids` have used together (those /proc no longer knows count 0).
func processCPUSeconds(pids: [Int32]) -> Double {
    pids.reduce(0) { $0 + (processCPUSeconds(pid: $1) ?? 0) }
}

/// Runs the async peers' clients: a fixed number of sequential requests (latency), or
/// `inFlight` tasks each sending one request after another until `seconds` pass (throughput).
enum AsyncDriver {
    static func sequential(_ client: any EchoClient, body: ByteBuffer, requests: Int) async throws -> (Histogram<UInt64>, Double) {
        try await withTaskExecutorPreference(client.preferredExecutor) {
            try await Self.sequentialLoop(client, body: body, requests: requests)
        }
    }

    private static func sequentialLoop(
        _ client: any EchoClient,
        body: ByteBuffer,
        requests: Int
    ) async throws -> (Histogram<UInt64>, Double) {
        var histogram = Histogram<UInt64>(highestTrackableValue: 60_000_000_000)
        let clock = ContinuousClock()
        let start = clock.now
        for _ in 0..<requests {
            let began = clock.now
            let size = try await client.echo(body)
            let elapsed = clock.now - began
            guard size == body.readableBytes else { throw BenchError("echoed \(size) bytes for \(body.readableBytes)") }
            _ = histogram.record(UInt64(elapsed.components.seconds * 1_000_000_000 + elapsed.components.attoseconds / 1_000_000_000))
        }
        let total = clock.now - start
        return (histogram, total.totalSeconds)
    }

    static func throughput(_ client: any EchoClient, body: ByteBuffer, inFlight: Int, seconds: Double) async throws -> (Int, Double) {
        let clock = ContinuousClock()
        let start = clock.now
        let deadline = start + .nanoseconds(Int64(seconds * 1e9))
        let completed = try await withThrowingTaskGroup(of: Int.self) { group in
            for _ in 0..<inFlight {
                group.addTask(executorPreference: client.preferredExecutor) {
                    var count = 0
                    while clock.now < deadline {
                        _ = try await client.echo(body)
                        count += 1
                    }
                    return count
                }
            }
            return try await group.reduce(0, +)
        }
        let total = clock.now - start
        return (completed, total.totalSeconds)
    }
}

/// Writes `value` as pretty-printed JSON to `path`, creating its directory.
func writeJSON(_ value: some Encodable, to path: String) throws {
    let url = URL(fileURLWithPath: path)
    try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.prettyPrinted, .sortedKeys]
    try encoder.encode(value).write(to: url)
}

/// Writes one line to standard output at once (a pipe would otherwise buffer it).
func emit(_ line: String) {
    FileHandle.standardOutput.write(Data((line + "\n").utf8))
}

struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ description: String) { self.description = description }
}
