import Foundation
import NIOCore
import NIOPosix
import Testing
import Tether
import TetherCore
import TetherNIO
import TetherTestSupport

#if canImport(Glibc)
    import Glibc
#endif

extension IntegrationTests {
    /// Every transport through a real HTTP proxy (Squid, with Basic authentication): the client
    /// asks for a `CONNECT` tunnel and runs TLS or the WebSocket upgrade inside it.
    @Suite("HTTP proxy", .timeLimit(.minutes(2)))
    struct ProxyTests {
        /// A Squid of the test's own on a free port of 127.0.0.1, that lets `alice` (password
        /// `secret`) open tunnels to any port, and logs each to `accessLog`.
        struct Squid {
            var port: Int
            var accessLog: String

            static let username = "alice"
            static let password = "secret"

            static func start(in harness: Harness) async throws -> Squid {
                let squid = try #require(OutsideTool.squidExecutable)
                let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-squid-\(UUID().uuidString)").path
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                // Squid started as root works as its own user (proxy on Debian): let it write here.
                try FileManager.default.setAttributes([.posixPermissions: 0o777], ofItemAtPath: directory)
                harness.onExit { try? FileManager.default.removeItem(atPath: directory) }

                let hash = try ChildProcess(executable: "/usr/bin/env", ["openssl", "passwd", "-apr1", Self.password], in: harness)
                #expect(try await hash.exitStatus(timeout: .seconds(20)) == 0)
                let passwords = "\(directory)/passwd"
                try "\(Self.username):\(try #require(hash.lines.last))\n".write(toFile: passwords, atomically: true, encoding: .utf8)
                try FileManager.default.setAttributes([.posixPermissions: 0o644], ofItemAtPath: passwords)

                let port = try await freePort()
                let configuration = """
                    http_port 127.0.0.1:\(port)
                    auth_param basic program \(OutsideTool.squidBasicAuth) \(passwords)
                    acl authenticated proxy_auth REQUIRED
                    http_access allow authenticated
                    http_access deny all
                    cache deny all
                    pid_filename \(directory)/squid.pid
                    access_log stdio:\(directory)/access.log
                    cache_log \(directory)/cache.log
                    coredump_dir \(directory)
                    shutdown_lifetime 0 seconds

                    """
                try configuration.write(toFile: "\(directory)/squid.conf", atomically: true, encoding: .utf8)
                let process = try ChildProcess(executable: squid, ["-N", "-f", "\(directory)/squid.conf"], in: harness)
                try await eventually("squid listens on \(port)", timeout: .seconds(20)) {
                    guard process.isRunning else { return true }
                    return (try? await ClientBootstrapProbe.connects(port: port)) == true
                }
                try #require(process.isRunning, "squid exited: \(process.lines.suffix(10).joined(separator: "\n"))")
                return Squid(port: port, accessLog: "\(directory)/access.log")
            }

            func proxy(password: String? = Squid.password) throws -> HTTPProxy {
                try HTTPProxy(
                    host: "127.0.0.1",
                    port: self.port,
                    credentials: password.map { .init(username: Squid.username, password: $0) }
                )
            }

            /// The tunnels Squid logged (it logs one when it ends).
            var tunnels: [String] {
                let log = (try? String(contentsOfFile: self.accessLog, encoding: .utf8)) ?? ""
                return log.split(separator: "\n").filter { $0.contains("CONNECT") }.map(String.init)
            }
        }

        @Test(
            "every transport reaches the gateway through Squid with Basic credentials; the tunnel is in Squid's log",
            .requires(.squid, .openssl),
            arguments: Endpoint.Transport.allCases
        )
        func throughSquid(transport: Endpoint.Transport) async throws {
            try OutsideTool.squid.require()
            try OutsideTool.openssl.require()  // makes the password file
            try await withHarness { harness in
                let squid = try await Squid.start(in: harness)
                let (_, endpoint) = try await harness.gateway(transport: transport, routes: TransportTests.echo)
                let proxied = try TCPClientTransport(
                    tls: .init(trustRoots: .only(.text(TestCertificates.shared.authority.certificatePEM))),
                    proxy: .always(squid.proxy())
                )
                let client = try harness.client([endpoint], transport: proxied)
                #expect(try await client.request("echo", body: ByteBuffer(string: "through the proxy")).string == "through the proxy")
                client.shutdown()
                try await eventually("Squid logs the tunnel to \(endpoint.port)") {
                    squid.tunnels.contains { $0.contains("127.0.0.1:\(endpoint.port)") }
                }
            }
        }

        @Test(
            "an IPv6 endpoint goes through Squid: CONNECT [::1]:port, the address in brackets",
            .requires(.squid, .openssl),
            .enabled(if: Self.hasIPv6Loopback, "skipped: this machine has no IPv6 loopback address")
        )
        func ipv6ThroughSquid() async throws {
            try OutsideTool.squid.require()
            try OutsideTool.openssl.require()
            try await withHarness { harness in
                let squid = try await Squid.start(in: harness)
                let (gateway, _) = try await harness.gateway(
                    transport: .tcp,
                    configure: { $0.listen?.host = "::1" },
                    routes: TransportTests.echo
                )
                let endpoint = Endpoint(host: "::1", port: try await gateway.listeningAddress.port!)
                let client = try harness.client([endpoint], transport: try TCPClientTransport(proxy: .always(squid.proxy())))
                #expect(try await client.request("echo", body: ByteBuffer(string: "v6")).string == "v6")
                client.shutdown()
                try await eventually("Squid logs the tunnel to [::1]:\(endpoint.port)") {
                    squid.tunnels.contains { $0.contains("[::1]:\(endpoint.port)") || $0.contains("::1:\(endpoint.port)") }
                }
            }
        }

        /// Whether `::1` can be bound here (containers sometimes have IPv6 off).
        static let hasIPv6Loopback: Bool = {
            #if !canImport(Glibc)
                return false
            #else
                let socket = Glibc.socket(AF_INET6, Int32(SOCK_STREAM.rawValue), 0)
                guard socket >= 0 else { return false }
                defer { close(socket) }
                var address = sockaddr_in6()
                address.sin6_family = sa_family_t(AF_INET6)
                address.sin6_addr = in6addr_loopback
                return withUnsafePointer(to: &address) {
                    $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        bind(socket, $0, socklen_t(MemoryLayout<sockaddr_in6>.size)) == 0
                    }
                }
            #endif
        }()

        @Test(
            "a proxy that wants credentials, or refuses them, or is not there: proxyFailed, saying which",
            .requires(.squid, .openssl)
        )
        func refusals() async throws {
            try OutsideTool.squid.require()
            try OutsideTool.openssl.require()  // makes the password file
            try await withHarness { harness in
                let squid = try await Squid.start(in: harness)
                let (_, endpoint) = try await harness.gateway(transport: .tcp, routes: TransportTests.echo)
                let cases: [(String, HTTPProxy, String)] = [
                    ("anonymous", try squid.proxy(password: nil), "requires authentication"),
                    ("wrong", try squid.proxy(password: "wrong"), "refused the credentials"),
                    ("absent", try HTTPProxy(host: "127.0.0.1", port: try await freePort()), "cannot reach the HTTP proxy"),
                ]
                for (name, proxy, expected) in cases {
                    let client = try harness.client([endpoint], clientID: name, transport: try TCPClientTransport(proxy: .always(proxy)))
                    let failure = try await TransportTests.firstFailure(of: client, in: harness)
                    #expect(failure.code == .proxyFailed, "\(name): \(failure)")
                    #expect(failure.message.contains(expected), "\(name): \(failure.message)")
                    client.shutdown()
                }
            }
        }
    }
}

/// Whether something accepts TCP connections on a port of 127.0.0.1.
enum ClientBootstrapProbe {
    static func connects(port: Int) async throws -> Bool {
        let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
            .connectTimeout(.milliseconds(200))
            .connect(host: "127.0.0.1", port: port).get()
        try await channel.close()
        return true
    }
}
