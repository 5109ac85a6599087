import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOPosix
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherNIO
import TetherTestSupport
import TetherTesting
import X509

extension IntegrationTests {
    /// What only TLS and WebSocket have: certificates, pins, upgrades, close codes, a shared
    /// HTTP port, and peers not written here (openssl, Python's `websockets`).
    @Suite("TLS and WebSocket", .timeLimit(.minutes(2)))
    struct TransportTests {
        static let certificates = TestCertificates.shared

        static func echo(_ gateway: Gateway) {
            gateway.handle("echo") { request, _ in request.body }
        }

        /// The first connection failure a client reports.
        static func firstFailure(of client: TetherClient, in harness: Harness) async throws -> TetherError {
            let events = harness.events(of: client)
            try await eventually("the client reports a failed attempt") {
                events.all.contains { if case .connectFailed = $0 { true } else { false } }
            }
            for event in events.all {
                if case .connectFailed(_, let error) = event { return error }
            }
            throw CancellationError()
        }

        @Test(
            "pins: a matching pin (or one of several, for rotation) connects; a wrong one fails with certificatePinMismatch",
            arguments: [Endpoint.Transport.tls, .secureWebSocket]
        )
        func pins(over transport: Endpoint.Transport) async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(transport: transport, routes: Self.echo)
                let serverPin = CertificatePin(subjectPublicKeyInfo: Self.certificates.server.subjectPublicKeyInfo)
                let nextPin = CertificatePin(subjectPublicKeyInfo: Self.certificates.rotatedServer.subjectPublicKeyInfo)

                let pinned = try harness.client([endpoint], transport: try testClientTransport { $0.pins = [nextPin, serverPin] })
                #expect(try await pinned.request("echo", body: ByteBuffer(string: "pinned")).string == "pinned")

                let wrong = try harness.client(
                    [endpoint],
                    clientID: "wrong-pin",
                    transport: try testClientTransport { $0.pins = [nextPin] }
                )
                let failure = try await Self.firstFailure(of: wrong, in: harness)
                #expect(failure.code == .certificatePinMismatch)
                #expect(failure.message.contains("matches none of the 1 configured pin"), "\(failure.message)")
                #expect(failure.message.contains(serverPin.description), "the message names the key the gateway has: \(failure.message)")
                #expect(wrong.connectionState != .connected(endpoint))
            }
        }

        @Test("an untrusted certificate, a name that does not match, and plain TCP on a TLS port fail with tlsFailed")
        func untrusted() async throws {
            try await withHarness { harness in
                // A gateway whose certificate comes from a CA the client does not trust.
                let (_, impostorEndpoint) = try await harness.gateway(
                    transport: .tls,
                    configure: { $0.tls = .init(serving: Self.certificates.impostor) },
                    routes: Self.echo
                )
                let fooled = try harness.client([impostorEndpoint], clientID: "fooled")
                let untrusted = try await Self.firstFailure(of: fooled, in: harness)
                #expect(untrusted.code == .tlsFailed, "\(untrusted)")
                #expect(untrusted.message.contains("not trusted"), "\(untrusted.message)")

                // A certificate for another name (device-42, and no IP address): refused when
                // connecting to 127.0.0.1, accepted with the server name overridden to it.
                let (_, endpoint) = try await harness.gateway(
                    transport: .tls,
                    configure: { $0.tls = .init(serving: Self.certificates.client) },
                    routes: Self.echo
                )
                let misnamed = try harness.client([endpoint], clientID: "misnamed")
                let nameFailure = try await Self.firstFailure(of: misnamed, in: harness)
                #expect(nameFailure.code == .tlsFailed, "\(nameFailure)")
                let renamed = try harness.client(
                    [endpoint],
                    clientID: "renamed",
                    transport: try testClientTransport { $0.serverName = "device-42" }
                )
                #expect(try await renamed.request("echo", body: ByteBuffer(string: "by name")).string == "by name")

                // TLS to a plain TCP gateway.
                let (_, plain) = try await harness.gateway(transport: .tcp, routes: Self.echo)
                let confused = try harness.client([Endpoint(host: plain.host, port: plain.port, transport: .tls)], clientID: "confused") {
                    $0.connection.connectTimeout = .seconds(2)
                }
                #expect(try await Self.firstFailure(of: confused, in: harness).code == .tlsFailed)
            }
        }

        @Test("a TLS failure is an endpoint failure with backoff, not a tight loop")
        func tlsFailureBacksOff() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(transport: .tls, routes: Self.echo)
                let wrongPin = CertificatePin(subjectPublicKeyInfo: Self.certificates.impostor.subjectPublicKeyInfo)
                let client = try harness.client([endpoint], transport: try testClientTransport { $0.pins = [wrongPin] }) {
                    $0.reconnect.backoff = try! Backoff(initial: .milliseconds(200), maximum: .seconds(1), jitter: 0)
                }
                let events = harness.events(of: client)
                try await Task.sleep(for: .seconds(1.5))
                let attempts = events.all.filter { if case .connectFailed = $0 { true } else { false } }.count
                let backoffs = events.all.filter { if case .backingOff = $0 { true } else { false } }.count
                // 200 + 400 + 800 ms: at most 4 attempts in 1.5 s.
                #expect((1...4).contains(attempts), "\(attempts) attempts in 1.5 s")
                #expect(backoffs >= attempts - 1)
            }
        }

        @Test(
            "mutual TLS: a gateway that requires client certificates refuses a client without one and shows the authenticator the certificate of one that has it"
        )
        func mutualTLS() async throws {
            try await withHarness { harness in
                let seen = NIOLockedValueBox<[String]>([])
                let (_, endpoint) = try await harness.gateway(
                    transport: .tls,
                    configure: { configuration in
                        configuration.tls?.clientCertificates = .required(trustRoots: .text(Self.certificates.authority.certificatePEM))
                    },
                    authenticate: { hello in
                        let name = hello.clientCertificate?.subject.description ?? "none"
                        seen.withLockedValue { $0.append(name) }
                        guard name.contains("device-42") else { throw RequestError(.unauthenticated, "no device certificate") }
                    },
                    routes: Self.echo
                )
                let anonymous = try harness.client([endpoint], clientID: "anonymous")
                let refused = try await Self.firstFailure(of: anonymous, in: harness)
                #expect(refused.code == .tlsFailed || refused.code == .handshakeFailed, "\(refused)")

                let keyPath = try TestCertificates.write(Self.certificates.client.keyPEM, name: "client-key.pem")
                let device = try harness.client(
                    [endpoint],
                    clientID: "device-42",
                    transport: try testClientTransport {
                        $0.clientCertificate = (chain: .text(Self.certificates.client.certificatePEM), privateKey: .file(keyPath))
                    }
                )
                #expect(try await device.request("echo", body: ByteBuffer(string: "mtls")).string == "mtls")
                #expect(seen.withLockedValue { $0 }.contains { $0.contains("CN=device-42") }, "\(seen.withLockedValue { $0 })")
            }
        }

        @Test("a refused WebSocket upgrade fails with webSocketUpgradeFailed and the HTTP status")
        func refusedUpgrade() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(transport: .webSocket, routes: Self.echo)
                let lost = try harness.client([
                    Endpoint(host: endpoint.host, port: endpoint.port, transport: .webSocket, path: "/elsewhere")
                ])
                let failure = try await Self.firstFailure(of: lost, in: harness)
                #expect(failure.code == .webSocketUpgradeFailed)
                #expect(failure.message.contains("HTTP 404"), "\(failure.message)")
            }
        }

        @Test(
            "an endpoint list may mix transports: failover goes from a dead wss:// endpoint to a tethers:// one, and GOAWAY moves the client to a ws:// one"
        )
        func mixedEndpoints() async throws {
            try await withHarness { harness in
                let (_, webSocket) = try await harness.gateway(
                    transport: .webSocket,
                    routes: { $0.handle("who") { _, _ in ByteBuffer(string: "ws") } }
                )
                let (tlsGateway, tls) = try await harness.gateway(
                    transport: .tls,
                    configure: { $0.goAway = .init(retryAfter: .milliseconds(10), alternateEndpoint: webSocket) },
                    routes: { $0.handle("who") { _, _ in ByteBuffer(string: "tls") } }
                )
                let dead = Endpoint(host: "127.0.0.1", port: try await freePort(), transport: .secureWebSocket)
                let client = try harness.client([dead, tls])
                #expect(try await client.request("who", timeout: .seconds(10)).string == "tls")
                tlsGateway.shutdown()
                try await eventually("the client follows GOAWAY to the WebSocket gateway") {
                    client.connectionState == .connected(webSocket)
                }
                #expect(try await client.request("who").string == "ws")
            }
        }

        @Test("the gateway shares an application's HTTP port: /health is the application's, /tether a Tether WebSocket")
        func sharedHTTPPort() async throws {
            try await withHarness { harness in
                var configuration = GatewayConfiguration.defaults
                configuration.listen = nil
                let gateway = try Gateway(configuration: configuration, logger: testLogger("gateway"))
                Self.echo(gateway)
                harness.spawn("gateway.run() behind an HTTP server") { try? await gateway.run() }
                harness.onExit { gateway.shutdown() }
                let server = try await ServerBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
                    .childChannelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            // The application's HTTP handler leaves once the connection is a WebSocket.
                            let health = NIOLoopBound(HealthHandler(), eventLoop: channel.eventLoop)
                            try channel.pipeline.syncOperations.configureHTTPServerPipeline(
                                withServerUpgrade: (
                                    upgraders: [gateway.webSocketUpgrader()],
                                    completionHandler: { context in
                                        context.pipeline.syncOperations.removeHandler(health.value, promise: nil)
                                    }
                                )
                            )
                            try channel.pipeline.syncOperations.addHandler(health.value)
                        }
                    }
                    .bind(host: "127.0.0.1", port: 0).get()
                harness.onExit { server.close(promise: nil) }
                let port = server.localAddress!.port!

                let client = try harness.client([Endpoint(host: "127.0.0.1", port: port, transport: .webSocket)])
                #expect(try await client.request("echo", body: ByteBuffer(string: "shared")).string == "shared")
                let health = try await httpGet(port: port, path: "/health")
                #expect(health.hasPrefix("HTTP/1.1 200"), "\(health)")
                #expect(health.hasSuffix("ok"), "\(health)")
            }
        }

        @Test(
            "reliable delivery through connections cut and blackholed at random points: each message processed once, delivered once, in order",
            arguments: Endpoint.Transport.allCases
        )
        func reliableChaos(over transport: Endpoint.Transport) async throws {
            let seed = IntegrationTests.DeliveryFaultTests.seed
            var generator = SplitMix64(seed: seed ^ UInt64(transport.scheme.utf8.count))
            let total = 2_000
            let texts = (1...total).map { "m-\($0)" }
            try await withHarness { harness in
                var chatHandler: NIOLockedValueBox<[String]>?
                let (_, endpoint) = try await harness.gateway(
                    transport: transport,
                    messageStore: InMemoryMessageStore(),
                    configure: { $0.timeouts.heartbeatInterval = .milliseconds(300) },
                    routes: { chatHandler = harness.installChatHandler(on: $0) }
                )
                let processed = try #require(chatHandler)
                let proxy = TCPFaultProxy(upstream: endpoint)
                let proxyPort = try await proxy.start().port!
                harness.onExit { proxy.cutAll() }
                let proxied = Endpoint(host: "127.0.0.1", port: proxyPort, transport: transport)
                func reliableClient(_ id: String) throws -> TetherClient {
                    try harness.client([proxied], clientID: id) {
                        $0.reliability = try! .init(outbox: InMemoryOutboxStore())
                        $0.heartbeat.timeout = .milliseconds(600)
                    }
                }
                let alice = try reliableClient("alice")
                let bob = try reliableClient("bob")
                let inbox = DeliveryCollector(bob, in: harness)
                let sender = Task {
                    var receipts: [MessageReceipt] = []
                    for text in texts {
                        receipts.append(try await alice.send("chat.send", body: ByteBuffer(string: text), conversation: "bob"))
                    }
                    return receipts
                }
                let thresholds = (0..<8).map { _ in Int.random(in: 50..<total - 50, using: &generator) }.sorted()
                for (index, threshold) in thresholds.enumerated() {
                    try await eventually("the gateway processed \(threshold)", timeout: .seconds(60)) {
                        processed.withLockedValue { $0.count } >= threshold
                    }
                    // Both clients are back from the last cut: each cut cuts live connections.
                    try await eventually("alice and bob reconnected after cut \(index)", timeout: .seconds(30)) {
                        proxy.acceptedConnections >= 2 + 2 * index
                    }
                    if index % 3 == 2 {
                        // A silent link: bytes vanish both ways until the heartbeat gives up.
                        proxy.mode = .blackhole
                        try await Task.sleep(for: .milliseconds(Int.random(in: 50...300, using: &generator)))
                        proxy.mode = .forward
                    }
                    proxy.cutAll()
                }
                let receipts = try await sender.value
                if let failure = await firstUnacknowledged(receipts, of: alice) {
                    Issue.record(Comment(rawValue: "seed \(seed): \(failure)"))
                    return
                }
                try await eventually("bob has every message", timeout: .seconds(60)) { inbox.count >= total }
                try await Task.sleep(for: .milliseconds(100))  // time for a duplicate to show up
                let handled = processed.withLockedValue { $0 }
                #expect(handled.count == total, "the handler ran once per message (seed \(seed))")
                #expect(firstDifference(handled, texts) == nil, "in the order of the sends")
                #expect(inbox.count == total)
                #expect(firstDifference(inbox.bodies, texts) == nil, "bob's app got each message once, in order")
                #expect(inbox.violations.isEmpty)
                #expect(
                    proxy.acceptedConnections >= thresholds.count + 2,
                    "the cuts cut connections (\(proxy.acceptedConnections) accepted)"
                )
            }
        }

        @Test(
            "connections to the WebSocket listener that never upgrade are capped and closed at the handshake timeout; those beyond the cap are answered 503"
        )
        func idleUpgradesCapped() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: .webSocket,
                    configure: {
                        $0.limits.maxUnauthenticatedConnections = 5
                        $0.timeouts.handshake = .seconds(1)
                    },
                    routes: Self.echo
                )
                let closed = NIOLockedValueBox(0)
                var idle: [any Channel] = []
                for _ in 0..<5 {
                    let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                        .connect(host: "127.0.0.1", port: endpoint.port).get()
                    channel.closeFuture.whenComplete { _ in closed.withLockedValue { $0 += 1 } }
                    idle.append(channel)
                }
                try await Task.sleep(for: .milliseconds(100))
                for _ in 0..<3 {
                    let refused = try await HTTPPeer.connect(port: endpoint.port)
                    let response = try await refused.send(.GET, Endpoint.defaultWebSocketPath).wait(timeout: .milliseconds(800))
                    #expect(response.status == .serviceUnavailable)
                    #expect(response.headers["Retry-After"] == ["5"])
                    try await eventually("the refused connection is closed") { !refused.isActive }
                }
                #expect(closed.withLockedValue { $0 } == 0, "the 5 within the cap wait for their upgrade")
                try await eventually("the others are closed at the handshake timeout", timeout: .seconds(5)) {
                    closed.withLockedValue { $0 } == 5
                }
                let client = try harness.client([endpoint])
                #expect(try await client.request("echo", body: ByteBuffer(string: "room again")).string == "room again")
                for channel in idle { channel.close(promise: nil) }
            }
        }

        @Test("openssl s_client completes a TLS 1.3 handshake with the gateway and negotiates ALPN tether/1", .requires(.openssl))
        func opensslInterop() async throws {
            try OutsideTool.openssl.require()
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(transport: .tls, routes: Self.echo)
                let caPath = try TestCertificates.write(Self.certificates.authority.certificatePEM, name: "ca.pem")
                let command =
                    "openssl s_client -connect 127.0.0.1:\(endpoint.port) -servername localhost -alpn tether/1 -CAfile \(caPath) -verify_return_error < /dev/null"
                let openssl = try ChildProcess(executable: "/bin/sh", ["-c", command], in: harness)
                #expect(try await openssl.exitStatus(timeout: .seconds(20)) == 0, "\(openssl.lines.joined(separator: "\n"))")
                let output = openssl.lines.joined(separator: "\n")
                #expect(output.contains("ALPN protocol: tether/1"), "\(output)")
                #expect(output.contains("Verify return code: 0 (ok)"), "\(output)")
                #expect(output.contains("TLSv1.3"), "\(output)")
            }
        }

        @Test(
            "a Python websockets client frames its own HELLO, REQUEST and channel frames and gets WELCOME, RESPONSE, SUBSCRIBED and PUBLICATION; PING, close codes and HTTP refusals follow RFC 6455",
            .requires(.pythonWebsockets),
            arguments: [Endpoint.Transport.webSocket, .secureWebSocket]
        )
        func pythonWebSocketsInterop(over transport: Endpoint.Transport) async throws {
            try OutsideTool.pythonWebsockets.require()
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: transport,
                    configure: { $0.webSocket?.allowedOrigins = ["https://app.example"] },
                    routes: { gateway in
                        Self.echo(gateway)
                        gateway.handle("publish") { request, context in
                            try await context.publish(request.body, toChannel: "py.room")
                            return ByteBuffer()
                        }
                    }
                )
                let caPath = try TestCertificates.write(Self.certificates.authority.certificatePEM, name: "ca.pem")
                let script = URL(fileURLWithPath: #filePath).deletingLastPathComponent().appendingPathComponent("Peers/websocket_peer.py")
                    .path
                let url = "\(endpoint.transport.scheme)://localhost:\(endpoint.port)\(endpoint.path!)"
                let peer = try ChildProcess(
                    executable: "/usr/bin/env",
                    ["python3", script, url, caPath, "https://evil.example"],
                    in: harness
                )
                let status = try await peer.exitStatus(timeout: .seconds(60))
                let output = peer.lines
                #expect(status == 0, "\(output.joined(separator: "\n"))")
                var results: [String: (ok: Bool, detail: String)] = [:]
                for line in output {
                    guard let data = line.data(using: .utf8),
                        let object = try? JSONSerialization.jsonObject(with: data) as? [String: Any],
                        let check = object["check"] as? String, let ok = object["ok"] as? Bool
                    else { continue }
                    results[check] = (ok, object["detail"] as? String ?? "")
                }
                for check in [
                    "upgrade", "handshake", "request", "ping", "fragments", "fragments-1", "fragments-ping", "close-code", "text-1003",
                    "http-404", "http-426", "http-400", "http-403", "channel-subscribe", "channel-publication", "channel-recovery",
                ] {
                    let result = results[check]
                    #expect(result?.ok == true, "\(check): \(result?.detail ?? "not reported"); output:\n\(output.joined(separator: "\n"))")
                }
            }
        }
    }
}

/// Answers every HTTP request with `200 ok`: an application's own handler beside the gateway.
private final class HealthHandler: ChannelInboundHandler, RemovableChannelHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        guard case .end = Self.unwrapInboundIn(data) else { return }
        var headers = HTTPHeaders()
        headers.add(name: "Content-Length", value: "2")
        headers.add(name: "Connection", value: "close")
        context.write(Self.wrapOutboundOut(.head(HTTPResponseHead(version: .http1_1, status: .ok, headers: headers))), promise: nil)
        context.write(Self.wrapOutboundOut(.body(.byteBuffer(ByteBuffer(string: "ok")))), promise: nil)
        context.writeAndFlush(Self.wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in context.close(promise: nil) }
    }
}

/// The raw response to `GET path` on 127.0.0.1:`port` (the connection closes after it).
private func httpGet(port: Int, path: String) async throws -> String {
    let channel = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
        .connect(host: "127.0.0.1", port: port) { channel in
            channel.eventLoop.makeCompletedFuture {
                try NIOAsyncChannel<ByteBuffer, ByteBuffer>(wrappingChannelSynchronously: channel)
            }
        }
    return try await channel.executeThenClose { inbound, outbound in
        try await outbound.write(ByteBuffer(string: "GET \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"))
        var response = ""
        for try await chunk in inbound { response += String(buffer: chunk) }
        return response
    }
}
