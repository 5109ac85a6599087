import ArgumentParser
import Foundation
import TetherCore
import TetherFaultProxy

struct Proxy: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "A TCP proxy that degrades the path to a gateway: latency, jitter, bandwidth, blackholes, cuts, flapping, NAT timeouts.",
        discussion: """
            Point a client at the proxy's port. While it runs, type a command and Enter:
              forward | blackhole | refuse      what happens to bytes and new connections
              cut                               close every connection (both sides)
              abandon                           current connections go silent for good (a network switch)
              latency MS | jitter MS | bandwidth BYTES_PER_S|off
              nat SECONDS|off                   forget connections idle that long, silently (a NAT)
              status | quit
            Examples:
              tether proxy --upstream 127.0.0.1:7700 --port 7701 --latency 150 --jitter 100
              tether proxy --upstream 127.0.0.1:7700 --port 7701 --flap 5,3
              tether proxy --upstream 127.0.0.1:7700 --port 7701 --nat-timeout 30
              tether proxy --upstream 127.0.0.1:7443 --upstream 127.0.0.1:7444 --port 8080   (round robin, no affinity)
            """
    )

    @Option(help: "The gateway, HOST:PORT; repeated, each new connection goes to the next one (a load balancer without affinity).")
    var upstream: [String] = ["127.0.0.1:7700"]

    @Option(help: "The address to listen on.")
    var host = "127.0.0.1"

    @Option(help: "The port to listen on (0 picks one).")
    var port = 7701

    @Option(help: "One-way delay added each way, milliseconds.")
    var latency: Int = 0

    @Option(help: "Largest extra random one-way delay, milliseconds (bytes are never reordered).")
    var jitter: Int = 0

    @Option(help: "Bandwidth cap per direction and connection, bytes per second.")
    var bandwidth: Int?

    @Option(help: "Flap the link: UP,DOWN seconds (blackholed while down), until stopped.")
    var flap: String?

    @Option(help: "Forget a connection idle (no bytes either way) this many seconds, as a NAT does: its bytes then go nowhere.")
    var natTimeout: Double?

    func validate() throws {
        _ = try self.impairment()
        _ = try self.flapTimes()
        if let natTimeout, !(natTimeout > 0 && natTimeout.isFinite) {
            throw ValidationError("--nat-timeout must be a positive number of seconds")
        }
        for upstream in self.upstream {
            do {
                _ = try Endpoint(parsing: upstream)
            } catch {
                throw ValidationError("--upstream '\(upstream)': \(error)")
            }
        }
    }

    func run() async throws {
        let proxy = TCPFaultProxy(upstreams: try self.upstream.map { try Endpoint(parsing: $0) })
        proxy.impairment = try self.impairment()
        proxy.natTimeout = self.natTimeout.map { .milliseconds(Int64($0 * 1000)) }
        let address = try await proxy.start(host: self.host, port: self.port)
        print(
            "proxying \(address) → \(self.upstream.joined(separator: ", ")); type 'status', 'blackhole', 'forward', 'cut', 'abandon' or 'quit'"
        )
        try await withThrowingDiscardingTaskGroup { group in
            if let (up, down) = try self.flapTimes() {
                group.addTask {
                    while !Task.isCancelled {
                        try await Task.sleep(for: up)
                        proxy.mode = .blackhole
                        print("flap: down")
                        try await Task.sleep(for: down)
                        proxy.mode = .forward
                        print("flap: up")
                    }
                }
            }
            // Commands from standard input; end of input or 'quit' stops the proxy.
            for await line in standardInputLines() {
                if !Self.perform(line, on: proxy) { break }
            }
            group.cancelAll()
        }
        await proxy.stop()
    }

    /// Applies one command; returns `false` for quit.
    static func perform(_ line: String, on proxy: TCPFaultProxy) -> Bool {
        let words = line.split(separator: " ").map(String.init)
        guard let command = words.first else { return true }
        let value = words.count > 1 ? Int(words[1]) : nil
        switch command {
        case "quit", "exit": return false
        case "forward": proxy.mode = .forward
        case "blackhole": proxy.mode = .blackhole
        case "refuse": proxy.mode = .refuse
        case "cut": proxy.cutAll()
        case "abandon": proxy.abandonAll()
        case "nat":
            if words.count > 1, words[1] == "off" {
                proxy.natTimeout = nil
            } else if words.count > 1, let seconds = Double(words[1]), seconds > 0, seconds.isFinite {
                proxy.natTimeout = .milliseconds(Int64(seconds * 1000))
            } else {
                print("usage: nat SECONDS|off")
                return true
            }
        case "latency", "jitter", "bandwidth":
            var impairment = proxy.impairment
            if command == "bandwidth", words.count > 1, words[1] == "off" {
                impairment.bytesPerSecond = nil
            } else if let value, value >= (command == "bandwidth" ? 1 : 0) {
                switch command {
                case "latency": impairment.latency = .milliseconds(value)
                case "jitter": impairment.jitter = .milliseconds(value)
                default: impairment.bytesPerSecond = value
                }
            } else {
                print("usage: \(command) \(command == "bandwidth" ? "BYTES_PER_S|off" : "MILLISECONDS")")
                return true
            }
            proxy.impairment = impairment
        case "status": break
        default:
            print("unknown command '\(command)'")
            return true
        }
        let bytes = proxy.forwardedBytes
        print(
            "mode \(proxy.mode), \(proxy.openConnections) open, \(proxy.acceptedConnections) accepted, "
                + "\(bytes.toUpstream) bytes up, \(bytes.toClient) down, impairment \(proxy.impairment)"
                + (proxy.natTimeout.map { ", NAT timeout \($0), \(proxy.natExpiredConnections) forgotten" } ?? "")
        )
        return true
    }

    private func impairment() throws -> TCPFaultProxy.Impairment {
        guard self.latency >= 0, self.jitter >= 0 else { throw ValidationError("--latency and --jitter must not be negative") }
        if let bandwidth, bandwidth < 1 { throw ValidationError("--bandwidth must be at least 1 byte per second") }
        return try TCPFaultProxy.Impairment(
            latency: .milliseconds(self.latency),
            jitter: .milliseconds(self.jitter),
            bytesPerSecond: self.bandwidth
        )
    }

    private func flapTimes() throws -> (Duration, Duration)? {
        guard let flap else { return nil }
        let parts = flap.split(separator: ",").compactMap { Double($0) }
        guard parts.count == 2, parts.allSatisfy({ $0 > 0 && $0.isFinite }) else {
            throw ValidationError("--flap takes UP,DOWN in seconds, e.g. 5,3")
        }
        return (.milliseconds(Int(parts[0] * 1000)), .milliseconds(Int(parts[1] * 1000)))
    }
}
