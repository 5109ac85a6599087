import ArgumentParser
import Foundation

struct Run: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run every peer, server and client in processes of their own, and write the comparison."
    )

    @Option(parsing: .upToNextOption, help: "The peers (all by default).")
    var peers: [Peer] = Peer.allCases

    @Option(parsing: .upToNextOption, help: "Body sizes in bytes.")
    var bodies: [Int] = [32, 4096]

    @Option(parsing: .upToNextOption, help: "Requests in flight for the throughput runs.")
    var inFlight: [Int] = [1, 16, 256]

    @Option(help: "Sequential requests measured per peer and body.")
    var requests = 20_000

    @Option(help: "Seconds measured per throughput run.")
    var seconds = 3.0

    @Option(help: "Where results.json and results.md go.")
    var output = "bench-results"

    func run() async throws {
        let executable = try ChildProcess.thisExecutable()
        // Made here, so that each TLS server and its drivers share one certificate.
        if self.peers.contains(where: { $0.transport.isSecure }) { _ = try BenchCertificate.files() }
        var measurements: [Measurement] = []
        for body in self.bodies {
            for peer in self.peers {
                let (server, port) = try ChildProcess.server(peer, executable: executable)
                defer { server.terminate() }
                for inFlight in [0] + self.inFlight {
                    var arguments = ["drive", peer.rawValue, "--port", "\(port)", "--body", "\(body)", "--in-flight", "\(inFlight)"]
                    arguments += ["--requests", "\(self.requests)", "--seconds", "\(self.seconds)"]
                    let driver = try ChildProcess(executable, arguments)
                    guard driver.readLine() == "start" else { throw BenchError("\(peer.rawValue) driver failed: \(driver.errors())") }
                    let serverBefore = processCPUSeconds(pid: server.pid)
                    guard let line = driver.readLine(), var measurement = try? JSONDecoder().decode(Measurement.self, from: Data(line.utf8))
                    else { throw BenchError("\(peer.rawValue) driver failed: \(driver.errors())") }
                    if let before = serverBefore, let after = processCPUSeconds(pid: server.pid) {
                        measurement.serverCPUSeconds = after - before
                    }
                    driver.wait()
                    measurements.append(measurement)
                    print(Report.line(measurement))
                }
            }
        }
        try writeJSON(measurements, to: "\(self.output)/results.json")
        let markdown = Report.markdown(measurements)
        try markdown.write(toFile: "\(self.output)/results.md", atomically: true, encoding: .utf8)
        print("\n" + markdown)
    }
}

/// A child process whose standard output is read line by line.
final class ChildProcess {
    let process = Process()
    private let output = Pipe()
    private let errorOutput = Pipe()
    private var buffer = Data()

    init(_ executable: String, _ arguments: [String]) throws {
        self.process.executableURL = URL(fileURLWithPath: executable)
        self.process.arguments = arguments
        self.process.standardOutput = self.output
        self.process.standardError = self.errorOutput
        try self.process.run()
    }

    var pid: Int32 { self.process.processIdentifier }

    /// The running `tether-bench` executable, to start servers and drivers from.
    static func thisExecutable() throws -> String {
        try FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe")
    }

    /// Starts `peer`'s server (`tether-bench serve`) and returns it with the port it listens on.
    static func server(_ peer: Peer, executable: String, arguments: [String] = []) throws -> (ChildProcess, port: Int) {
        let server = try ChildProcess(executable, ["serve", peer.rawValue] + arguments)
        guard let ready = server.readLine(), ready.hasPrefix("ready "), let port = Int(ready.dropFirst(6)) else {
            server.terminate()
            throw BenchError("\(peer.rawValue) server did not start: \(server.errors())")
        }
        return (server, port)
    }

    /// The next line of standard output, or `nil` at its end.
    func readLine() -> String? {
        while true {
            if let newline = self.buffer.firstIndex(of: UInt8(ascii: "\n")) {
                let line = String(decoding: self.buffer[..<newline], as: UTF8.self)
                self.buffer.removeSubrange(...newline)
                return line
            }
            let chunk = self.output.fileHandleForReading.availableData
            if chunk.isEmpty { return nil }
            self.buffer.append(chunk)
        }
    }

    func errors() -> String {
        if self.process.isRunning { self.process.terminate() }
        return String(decoding: self.errorOutput.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
    }

    func wait() { self.process.waitUntilExit() }

    func terminate() {
        if self.process.isRunning {
            self.process.terminate()
            self.process.waitUntilExit()
        }
    }
}

enum Report {
    static func number(_ value: Double?, _ digits: Int = 0) -> String {
        guard let value else { return "–" }
        return String(format: "%.\(digits)f", value)
    }

    static func line(_ m: Measurement) -> String {
        let what = m.sequential ? "sequential" : "\(m.inFlight) in flight"
        var text = "\(m.peer) \(m.bodyBytes) B \(what): \(number(m.perSecond)) req/s"
        if let p50 = m.p50, let p99 = m.p99 { text += ", p50 \(number(p50, 1)) µs, p99 \(number(p99, 1)) µs" }
        if let cpu = m.cpuPer100k { text += ", \(number(cpu, 2)) CPU s / 100k" }
        return text
    }

    /// One table per body size; ratios are the peer's figure over Tether's.
    static func markdown(_ measurements: [Measurement]) -> String {
        var lines: [String] = []
        let inFlights = Array(Set(measurements.filter { !$0.sequential }.map(\.inFlight))).sorted()
        for body in Array(Set(measurements.map(\.bodyBytes))).sorted() {
            let rows = measurements.filter { $0.bodyBytes == body }
            func find(_ peer: String, _ inFlight: Int?) -> Measurement? {
                rows.first { $0.peer == peer && (inFlight == nil ? $0.sequential : (!$0.sequential && $0.inFlight == inFlight)) }
            }
            lines.append("### \(body)-byte body")
            lines.append("")
            var header = "| Peer | p50 µs (× Tether) | p99 µs | CPU s / 100k (sequential) |"
            var rule = "|---|---|---|---|"
            for inFlight in inFlights {
                header += " \(inFlight) in flight, req/s (× Tether) |"
                rule += "---|"
            }
            lines.append(header)
            lines.append(rule)
            let peers = rows.map(\.peer).reduce(into: [String]()) { if !$0.contains($1) { $0.append($1) } }
            let tetherSequential = find("tether", nil)
            for peer in peers {
                let sequential = find(peer, nil)
                var row = "| \(peer) | \(number(sequential?.p50, 1))"
                if let p50 = sequential?.p50, let base = tetherSequential?.p50 { row += " (\(number(p50 / base, 2))×)" }
                row += " | \(number(sequential?.p99, 1)) | \(number(sequential?.cpuPer100k, 2)) |"
                for inFlight in inFlights {
                    let measurement = find(peer, inFlight)
                    row += " \(number(measurement?.perSecond))"
                    if let rate = measurement?.perSecond, let base = find("tether", inFlight)?.perSecond {
                        row += " (\(number(rate / base, 2))×)"
                    }
                    row += " |"
                }
                lines.append(row)
            }
            lines.append("")
        }
        return lines.joined(separator: "\n")
    }
}
