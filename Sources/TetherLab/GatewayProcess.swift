import AsyncHTTPClient
import Foundation
import NIOCore
import NIOPosix
import TetherCore
import TetherNIO
import TetherProcess

/// A `tether serve` process with an SQLite store, which the lab can kill and start again.
final class GatewayProcess: @unchecked Sendable {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    let executable: String
    let port: Int
    let store: String
    let heartbeat: Duration
    /// `nil`: `tether serve`'s default (three heartbeats).
    let idleTimeout: Duration?
    let logFile: String
    /// `tether serve`'s options for the listeners: `--port`, or TLS and WebSocket options.
    let listenerArguments: [String]
    /// A cluster node's database and name (`tether serve --postgres`), instead of the SQLite store.
    let postgres: (url: String, node: String)?
    /// The admin listener's port (`/metrics`), if the lab reads the gateway's own view.
    let adminPort: Int?
    /// The WebSocket and HTTP-stream listener's port beside TCP, if it has one.
    let httpPort: Int?
    /// The running process, and how many times it was started.
    private let running = TetherLock<(process: SpawnedProgram?, starts: Int)>((nil, 0))

    /// How many times the process was started.
    var starts: Int { self.running.withLockedValue { $0.starts } }

    init(
        executable: String,
        port: Int,
        store: String,
        heartbeat: Duration,
        idleTimeout: Duration? = nil,
        logFile: String,
        transport: Endpoint.Transport = .tcp,
        certificate: LabCertificate? = nil,
        httpPort: Int? = nil,
        postgres: (url: String, node: String)? = nil,
        adminPort: Int? = nil,
        extraArguments: [String] = []
    ) {
        self.postgres = postgres
        self.adminPort = adminPort
        self.httpPort = httpPort
        self.executable = executable
        self.port = port
        self.store = store
        self.heartbeat = heartbeat
        self.idleTimeout = idleTimeout
        self.logFile = logFile
        var listener = transport.isHTTP ? ["--no-tcp", "--ws-port", "\(port)"] : ["--port", "\(port)"]
        if let httpPort { listener += ["--ws-port", "\(httpPort)"] }  // WebSocket and the HTTP stream beside TCP
        if transport.isSecure, let certificate {
            listener += ["--tls-cert", certificate.certificate, "--tls-key", certificate.key]
        }
        self.listenerArguments = listener + extraArguments
    }

    /// Starts the gateway and returns once it accepts connections.
    func start() async throws {
        let arguments =
            [
                self.executable, "serve",
            ] + (self.postgres.map { ["--postgres", $0.url, "--node-name", $0.node] } ?? ["--store", self.store]) + [
                "--heartbeat", "\(self.heartbeat.totalSeconds)", "--log-level", "warning",
            ] + self.listenerArguments + (self.idleTimeout.map { ["--idle-timeout", "\($0.totalSeconds)"] } ?? [])
            + (self.adminPort.map { ["--admin-port", "\($0)"] } ?? [])
        let process = try SpawnedProgram(arguments, output: .file(self.logFile, append: true))
        self.running.withLockedValue {
            $0.process = process
            $0.starts += 1
        }
        let deadline = ContinuousClock.now + .seconds(20)
        while ContinuousClock.now < deadline {
            guard process.isRunning else {
                throw Failure(description: "the gateway exited (\(process.termination.map(\.description) ?? "-")); see \(self.logFile)")
            }
            // Accepted, and by this process: still running a moment after.
            if await Self.accepts(port: self.port) {
                try await Task.sleep(for: .milliseconds(50))
                if process.isRunning { return }
            }
            try await Task.sleep(for: .milliseconds(10))
        }
        throw Failure(description: "the gateway did not listen on port \(self.port) within 20 s; see \(self.logFile)")
    }

    /// The gateway's metrics (`GET /metrics` on its admin listener).
    func metrics() async throws -> MetricsSamples {
        guard let port = self.adminPort else { throw Failure(description: "the gateway has no admin listener") }
        let response = try await HTTPClient.shared.execute(
            HTTPClientRequest(url: "http://127.0.0.1:\(port)/metrics"),
            timeout: .seconds(10)
        )
        guard response.status == .ok else { throw Failure(description: "GET /metrics answered \(response.status)") }
        return MetricsSamples(parsing: String(buffer: try await response.body.collect(upTo: 4 << 20)))
    }

    /// What `GET /ready` on its admin listener answers: the status and the body; `nil` if it
    /// does not answer within a second.
    func readiness() async -> (status: UInt, body: String)? {
        guard let port = self.adminPort else { return nil }
        do {
            let response = try await HTTPClient.shared.execute(
                HTTPClientRequest(url: "http://127.0.0.1:\(port)/ready"),
                timeout: .seconds(1)
            )
            return (response.status.code, String(buffer: try await response.body.collect(upTo: 64 << 10)))
        } catch {
            return nil
        }
    }

    /// The running process's id.
    var processIdentifier: Int32? { self.running.withLockedValue { $0.process?.processIdentifier } }

    /// Sends `signal` to the gateway (SIGSTOP, SIGCONT), if it runs.
    func signal(_ signal: Int32) {
        self.running.withLockedValue { $0.process }?.send(signal)
    }

    /// Kills the gateway with SIGKILL (no goodbye to its clients) and waits for it to exit.
    func kill() {
        guard let process = self.running.withLockedValue({ $0.process }) else { return }
        process.send(SIGKILL)
        process.waitUntilExit()
        self.running.withLockedValue { $0.process = nil }
    }

    private static func accepts(port: Int) async -> Bool {
        do {
            let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                .connectTimeout(.milliseconds(200))
                .connect(host: "127.0.0.1", port: port)
                .get()
            // A connection from the port to itself (TCP's simultaneous open, when the kernel
            // picks the port it connects to as its own) is no listener.
            let connectedToItself = channel.localAddress?.port == port
            try? await channel.close()
            return !connectedToItself
        } catch {
            return false
        }
    }

    /// A TCP port nothing listens on now, below the ephemeral range: while a gateway the lab
    /// killed is down, no outgoing connection (a client's, a node's to PostgreSQL, a probe's)
    /// can take its port and keep it from listening again. (The three-node long run lost a
    /// node that way: `bind … Address already in use`, and a probe that connected to itself
    /// took the port for listening.)
    static func freePort() async throws -> Int {
        let ephemeral =
            (try? String(contentsOfFile: "/proc/sys/net/ipv4/ip_local_port_range", encoding: .utf8))
            .flatMap { Int($0.split(whereSeparator: \.isWhitespace).first ?? "") } ?? 32_768
        if ephemeral > 11_000 {
            for _ in 0..<50 {
                let port = Int.random(in: 10_000..<ephemeral)
                guard
                    let channel = try? await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                        .bind(host: "127.0.0.1", port: port)
                        .get()
                else { continue }
                try await channel.close()
                return port
            }
        }
        let channel = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .bind(host: "127.0.0.1", port: 0)
            .get()
        let port = channel.localAddress!.port!
        try await channel.close()
        return port
    }
}

/// A self-signed certificate for 127.0.0.1 made with `openssl req` for a lab run over TLS.
struct LabCertificate: Sendable {
    let certificate: String
    let key: String

    /// Makes the certificate and key in `directory`.
    init(in directory: String) throws {
        self.certificate = "\(directory)/tls-cert.pem"
        self.key = "\(directory)/tls-key.pem"
        let openssl = try SpawnedProgram(
            [
                "openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
                "-keyout", self.key, "-out", self.certificate, "-subj", "/CN=localhost", "-addext",
                "subjectAltName=DNS:localhost,IP:127.0.0.1",
            ],
            output: .discard
        )
        guard openssl.waitUntilExit().succeeded else {
            throw GatewayProcess.Failure(description: "openssl req failed: the lab needs openssl to run over TLS")
        }
    }
}
