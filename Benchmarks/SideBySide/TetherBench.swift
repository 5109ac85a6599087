import ArgumentParser
import Foundation
import NIOCore

/// `tether-bench`: Tether side by side with a raw SwiftNIO echo, HTTP/1.1, gRPC and a
/// WebSocket, every server and every client in a process of its own.
///
///     swift run -c release tether-bench run --output results     # all peers, 32 B and 4 KiB
///     swift run -c release tether-bench serve tether --port 7000 # one server, by hand
@main
struct TetherBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "tether-bench",
        abstract: "Tether side by side with raw NIO, HTTP/1.1, gRPC and WebSocket peers.",
        subcommands: [
            Run.self, Serve.self, Drive.self, Idle.self, Hold.self, FanOut.self, Listen.self, Reliable.self, ReliableGateway.self,
            ReliableReceiver.self, ClusterBench.self, CompressionBench.self, ChannelsBench.self, BackendBench.self,
            BackendServe.self, BackendGateway.self,
        ]
    )
}

extension Peer: ExpressibleByArgument {}

struct Serve: AsyncParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Run one peer's server; prints 'ready PORT'.")

    @Argument(help: "The peer: \(Peer.allCases.map(\.rawValue).joined(separator: ", ")).")
    var peer: Peer

    @Option(help: "The port (0 picks one).")
    var port = 0

    @Flag(help: "Tether only: listen with SO_REUSEPORT, so that several gateway processes share the port.")
    var reusePort = false

    @Option(help: "Tether only: be a node of the cluster on this PostgreSQL database.")
    var postgres: String?

    @Option(help: "With --postgres: the node's name.")
    var nodeName = "node"

    func run() async throws {
        guard !self.reusePort || self.peer == .tether else { throw BenchError("--reuse-port is for the tether peer only") }
        guard self.postgres == nil || self.peer == .tether else { throw BenchError("--postgres is for the tether peer only") }
        let cluster = self.postgres.map { ClusterNodeOptions(url: $0, name: self.nodeName) }
        try await self.peer.serve(port: self.port, reusePort: self.reusePort, cluster: cluster) { port in
            emit("ready \(port)")
        }
    }
}

struct Drive: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Drive one peer's server; prints 'start' when the measured part begins, then one JSON line."
    )

    @Argument(help: "The peer.")
    var peer: Peer

    @Option(help: "The server's port.")
    var port: Int

    @Option(help: "Request body size in bytes.")
    var body = 32

    @Option(help: "Requests in flight on the one connection; 0 for the sequential latency run.")
    var inFlight = 0

    @Option(help: "Sequential run: requests measured (after as many warm-up requests / 10).")
    var requests = 20_000

    @Option(help: "Throughput run: seconds measured (after one warm-up second).")
    var seconds = 3.0

    func run() async throws {
        let body = ByteBuffer(repeating: UInt8(ascii: "x"), count: self.body)
        let sequential = self.inFlight == 0
        var measurement = Measurement(
            peer: self.peer.rawValue,
            bodyBytes: self.body,
            inFlight: max(1, self.inFlight),
            sequential: sequential,
            completed: 0,
            seconds: 0,
            clientCPUSeconds: 0
        )
        let base = measurement
        let (requestCount, measuredSeconds) = (self.requests, self.seconds)
        @Sendable func start() -> Double {
            emit("start")
            return processCPUSeconds()
        }
        /// The drivers that work like the floor's (a fixed number of requests, or until a deadline).
        @Sendable func measureHandlerDriven(
            _ drive: @escaping @Sendable (_ requests: Int?, _ seconds: Double) async throws -> RawEcho.Outcome
        ) async throws -> Measurement {
            var measurement = base
            _ = try await drive(nil, 1)
            let cpu = start()
            let began = Date()
            let outcome = try await drive(sequential ? requestCount : nil, sequential ? 3600 : measuredSeconds)
            measurement.seconds = Date().timeIntervalSince(began)
            measurement.clientCPUSeconds = processCPUSeconds() - cpu
            measurement.completed = outcome.completed
            measurement.setLatency(outcome.latency)
            return measurement
        }
        let inFlight = max(1, self.inFlight)
        let port = self.port
        if self.peer == .rawNIO {
            measurement = try await measureHandlerDriven { requests, seconds in
                try await RawEcho.drive(port: port, body: body, inFlight: inFlight, requests: requests, seconds: seconds)
            }
        } else if self.peer == .tetherCallback {
            measurement = try await TetherPeer.withClient(port: port) { client in
                try await measureHandlerDriven { requests, seconds in
                    try await CallbackDriver.drive(
                        client,
                        method: "echo.inline",
                        body: body,
                        inFlight: inFlight,
                        requests: requests,
                        seconds: seconds
                    )
                }
            }
        } else {
            let requests = self.requests
            let seconds = self.seconds
            let inFlight = self.inFlight
            let initial = measurement
            measurement = try await self.peer.withClient(port: self.port) { client in
                var measurement = initial
                if sequential {
                    _ = try await AsyncDriver.sequential(client, body: body, requests: max(100, requests / 10))
                    let cpu = start()
                    let (histogram, elapsed) = try await AsyncDriver.sequential(client, body: body, requests: requests)
                    measurement.clientCPUSeconds = processCPUSeconds() - cpu
                    measurement.completed = requests
                    measurement.seconds = elapsed
                    measurement.setLatency(histogram)
                } else {
                    _ = try await AsyncDriver.throughput(client, body: body, inFlight: inFlight, seconds: 1)
                    let cpu = start()
                    let (completed, elapsed) = try await AsyncDriver.throughput(client, body: body, inFlight: inFlight, seconds: seconds)
                    measurement.clientCPUSeconds = processCPUSeconds() - cpu
                    measurement.completed = completed
                    measurement.seconds = elapsed
                }
                return measurement
            }
        }
        let encoder = JSONEncoder()
        encoder.outputFormatting = .sortedKeys
        emit(String(decoding: try encoder.encode(measurement), as: UTF8.self))
    }
}
