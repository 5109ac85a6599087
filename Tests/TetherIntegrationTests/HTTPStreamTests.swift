import Foundation
import NIOConcurrencyHelpers
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherNIO
import TetherNIOTransports
import TetherTestSupport
import TetherTesting

extension IntegrationTests {
    /// The HTTP stream (PROTOCOL.md, section 11.5) with peers and proxies not written here:
    /// curl reads the stream and POSTs frames; nginx, with its default buffering, sits in front.
    @Suite("HTTP stream", .timeLimit(.minutes(2)))
    struct HTTPStreamTests {
        /// `frames` encoded with checksums, in one buffer.
        static func encoded(_ frames: [Frame.Payload]) throws -> ByteBuffer {
            var buffer = ByteBuffer()
            for payload in frames { try FrameEncoder().encode(Frame(payload, flags: .checksum), into: &buffer) }
            return buffer
        }

        /// The session line (token and key) and the frames after it in what curl saved of the
        /// stream at `path`.
        static func read(_ path: String) throws -> (token: String, key: String, frames: [Frame])? {
            guard let data = FileManager.default.contents(atPath: path), let newline = data.firstIndex(of: 0x0A) else { return nil }
            guard let (token, key) = HTTPStreamBinding.parseSessionLine(String(decoding: data[..<newline], as: UTF8.self)) else {
                Issue.record("not a session line: \(String(decoding: data[..<newline], as: UTF8.self))")
                return nil
            }
            var rest = ByteBuffer(bytes: data[(newline + 1)...])
            var decoder = FrameDecoder(maxBodySize: 1 << 20)
            var frames: [Frame] = []
            while let frame = try decoder.decodeFrame(from: &rest) { frames.append(frame) }
            return (token, key, frames)
        }

        @Test("curl reads the stream: the token line, then WELCOME and RESPONSE for a HELLO and a REQUEST it POSTs", .requires(.curl))
        func curlPeer() async throws {
            try OutsideTool.curl.require()
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(transport: .httpStream, routes: TransportTests.echo)
                let url = "http://127.0.0.1:\(endpoint.port)\(Endpoint.defaultHTTPStreamPath)"
                let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-curl-\(UUID().uuidString)").path
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                harness.onExit { try? FileManager.default.removeItem(atPath: directory) }

                let stream = "\(directory)/stream"
                _ = try ChildProcess(executable: "/usr/bin/env", ["curl", "-sN", "--max-time", "30", "-o", stream, url], in: harness)
                try await eventually("curl has the session line") { (try? Self.read(stream)) != nil }
                let (token, key, _) = try #require(try Self.read(stream))
                var posts: UInt64 = 0
                /// The headers of the session's next POST of `frames`: its token and proof.
                func proven(_ frames: [Frame.Payload]) throws -> [String] {
                    defer { posts += 1 }
                    let proof = HTTPStreamBinding.proof(key: key, post: posts, body: try Self.encoded(frames))!
                    return ["Tether-Session: \(token)", "Tether-Proof: \(proof)"]
                }
                #expect(HTTPStreamBinding.isWellFormedToken(token))

                func post(_ frames: [Frame.Payload], name: String, headers: [String] = []) async throws -> String {
                    let file = "\(directory)/\(name)"
                    let bytes = try Self.encoded(frames)
                    try Data(bytes.readableBytesView).write(to: URL(fileURLWithPath: file))
                    var arguments = ["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}\\n", "--data-binary", "@\(file)"]
                    arguments += ["-H", "Content-Type: application/octet-stream"] + headers.flatMap { ["-H", $0] }
                    let process = try ChildProcess(executable: "/usr/bin/env", arguments + [url], in: harness)
                    #expect(try await process.exitStatus(timeout: .seconds(20)) == 0)
                    return process.lines.last ?? ""
                }
                let hello = Frame.Payload.hello(.init(versions: 1...1, features: .checksum, maxBodySize: 1 << 20, clientID: "curl"))
                #expect(try await post([hello], name: "hello", headers: try proven([hello])) == "204")
                let request = Frame.Payload.request(.init(id: 1, method: "echo", body: ByteBuffer(string: "from curl")))
                #expect(try await post([request], name: "stolen", headers: ["Tether-Session: \(token)", "Tether-Proof: \(key)"]) == "403")
                #expect(try await post([request], name: "request", headers: try proven([request])) == "204")

                try await eventually("WELCOME and RESPONSE on the stream") { ((try? Self.read(stream))??.frames.count ?? 0) >= 2 }
                let frames = try #require(try Self.read(stream)).frames
                guard case .welcome = frames.first?.payload else {
                    Issue.record("the stream's first frame is not WELCOME: \(frames)")
                    return
                }
                let response = frames.lazy.compactMap { frame -> Frame.Response? in
                    if case .response(let response) = frame.payload { return response }
                    return nil
                }.first
                #expect(response?.id == 1)
                #expect(response.map { String(buffer: $0.body) } == "from curl")

                // The statuses a peer sees: no token, an unknown one.
                #expect(try await post([request], name: "no-token") == "400")
                #expect(
                    try await post(
                        [request],
                        name: "unknown",
                        headers: ["Tether-Session: \(String(repeating: "A", count: 43))", "Tether-Proof: \(key)"]
                    ) == "404"
                )
            }
        }

        /// An nginx of the test's own in front of `upstream`, with its default configuration for a
        /// reverse proxy (buffering on, HTTP/1.0 to the upstream); `/buffered/` also ignores the
        /// gateway's `X-Accel-Buffering: no`, as a proxy that buffers every response does.
        struct Nginx {
            var port: Int
            var accessLog: String

            static func start(in harness: Harness, upstream: Int) async throws -> Nginx {
                let nginx = try #require(OutsideTool.nginxExecutable)
                let directory = FileManager.default.temporaryDirectory.appendingPathComponent("tether-nginx-\(UUID().uuidString)").path
                try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
                harness.onExit { try? FileManager.default.removeItem(atPath: directory) }
                let port = try await freePort()
                let configuration = """
                    daemon off;
                    master_process off;
                    worker_processes 1;
                    error_log \(directory)/error.log;
                    pid \(directory)/nginx.pid;
                    events { worker_connections 512; }
                    http {
                        access_log \(directory)/access.log;
                        client_body_temp_path \(directory)/body;
                        proxy_temp_path \(directory)/proxy;
                        fastcgi_temp_path \(directory)/fastcgi;
                        uwsgi_temp_path \(directory)/uwsgi;
                        scgi_temp_path \(directory)/scgi;
                        server {
                            listen 127.0.0.1:\(port);
                            location / { proxy_pass http://127.0.0.1:\(upstream); }
                            location /buffered/ {
                                proxy_pass http://127.0.0.1:\(upstream)/;
                                proxy_ignore_headers X-Accel-Buffering;
                            }
                        }
                    }

                    """
                try configuration.write(toFile: "\(directory)/nginx.conf", atomically: true, encoding: .utf8)
                let process = try ChildProcess(
                    executable: nginx,
                    ["-e", "\(directory)/error.log", "-p", directory, "-c", "\(directory)/nginx.conf"],
                    in: harness
                )
                try await eventually("nginx listens on \(port)", timeout: .seconds(20)) {
                    guard process.isRunning else { return true }
                    return (try? await ClientBootstrapProbe.connects(port: port)) == true
                }
                let errors = (try? String(contentsOfFile: "\(directory)/error.log", encoding: .utf8)) ?? ""
                try #require(process.isRunning, "nginx exited: \(process.lines.suffix(10).joined(separator: "\n")) \(errors)")
                return Nginx(port: port, accessLog: "\(directory)/access.log")
            }

            var log: [String] {
                ((try? String(contentsOfFile: self.accessLog, encoding: .utf8)) ?? "").split(separator: "\n").map(String.init)
            }
        }

        @Test(
            "behind nginx's default buffering the stream flows (X-Accel-Buffering: no); a proxy that buffers anyway is passed over for the next endpoint",
            .requires(.nginx)
        )
        func behindNginx() async throws {
            try OutsideTool.nginx.require()
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    transport: .httpStream,
                    messageStore: InMemoryMessageStore(),
                    routes: TransportTests.echo
                )
                let nginx = try await Nginx.start(in: harness, upstream: endpoint.port)
                let buffered = Endpoint(host: "127.0.0.1", port: nginx.port, transport: .httpStream, path: "/buffered/tether/stream")
                let proxied = Endpoint(host: "127.0.0.1", port: nginx.port, transport: .httpStream)
                let client = try harness.client([buffered, proxied]) { configuration in
                    configuration.connection.connectTimeout = .seconds(1)
                    configuration.reliability = try! .init(outbox: InMemoryOutboxStore())
                }
                #expect(try await client.request("echo", body: ByteBuffer(string: "through nginx")).string == "through nginx")
                #expect(client.connectionState == .connected(proxied))

                // Reliable deliveries come down the stream as they are sent, in order, once.
                let collector = DeliveryCollector(client, in: harness)
                for index in 0..<20 {
                    _ = try await gateway.deliver(to: "test-client", topic: "t", body: ByteBuffer(string: "d\(index)"))
                }
                try await eventually("20 deliveries") { collector.count == 20 }
                #expect(collector.bodies == (0..<20).map { "d\($0)" })
                #expect(collector.violations.isEmpty)
                #expect(nginx.log.contains { $0.contains("POST /tether/stream") && $0.contains(" 204 ") })
                #expect(nginx.log.contains { $0.contains("GET /buffered/tether/stream") }, "the buffering endpoint was tried first")
            }
        }

        @Test(
            "TCP refused and WebSocket blackholed: the client connects over the HTTP stream, reports TCP blocked, and moves up to TCP once it answers, then back down when TCP is cut again; every reliable message is processed once and every delivery arrives once, in order"
        )
        func fallbackAndMoveUp() async throws {
            try await withHarness(timeLimit: .seconds(60)) { harness in
                var chat: NIOLockedValueBox<[String]>?
                let (gateway, stream) = try await harness.gateway(
                    transport: .httpStream,
                    messageStore: InMemoryMessageStore(),
                    configure: { $0.listen = .init(host: "127.0.0.1", port: 0) },
                    routes: { chat = harness.installChatHandler(on: $0) }
                )
                let processed = try #require(chat)
                // TCP: nothing listens on the port (connections are refused) until the proxy starts.
                let tcpProxy = TCPFaultProxy(upstream: Endpoint(host: "127.0.0.1", port: try await gateway.listeningAddress.port!))
                let tcp = Endpoint(host: "127.0.0.1", port: try await freePort())
                let webSocketProxy = TCPFaultProxy(upstream: Endpoint(host: "127.0.0.1", port: stream.port))
                webSocketProxy.mode = .blackhole
                let webSocket = Endpoint(host: "127.0.0.1", port: try await webSocketProxy.start().port!, transport: .webSocket)
                harness.onExit {
                    tcpProxy.cutAll()
                    webSocketProxy.cutAll()
                }
                let client = try harness.client([tcp, webSocket, stream], clientID: "alice") { configuration in
                    configuration.connection.connectTimeout = .milliseconds(500)
                    configuration.connection.moveUpInterval = .milliseconds(300)
                    configuration.reliability = try! .init(outbox: InMemoryOutboxStore())
                }
                let deliveries = DeliveryCollector(client, in: harness)
                let events = harness.events(of: client)

                // Alice writes to herself: each message is processed by the handler, which
                // delivers it back to her.
                func send(_ range: Range<Int>) async throws {
                    for index in range {
                        _ = try await client.send("chat.send", body: ByteBuffer(string: "m\(index)"), conversation: "alice")
                        try await Task.sleep(for: .milliseconds(5))
                    }
                }
                try await send(0..<50)
                try await eventually("connected over the HTTP stream") { client.connectionState == .connected(stream) }
                // TCP was refused: blocked on this network. (The WebSocket racer, blackholed, was
                // still waiting when the stream won: nothing is known of it yet.)
                let blocked = { @Sendable in
                    events.all.compactMap { if case .endpointBlocked(let endpoint, _) = $0 { endpoint } else { nil } }
                }
                try await eventually("TCP reported blocked") { blocked() == [tcp] }

                _ = try await tcpProxy.start(port: tcp.port)  // the block is lifted
                try await send(50..<100)
                try await eventually("moved up to TCP", timeout: .seconds(10)) { client.connectionState == .connected(tcp) }
                #expect(
                    events.disconnectReasons.contains { if case .movingUp(tcp) = $0 { true } else { false } },
                    "\(events.disconnectReasons)"
                )
                try await send(100..<150)

                // TCP blocked again mid-stream: what was sent there and not acknowledged is sent
                // again over the HTTP stream, and processed once.
                let sending = Task { try await send(150..<200) }
                try await Task.sleep(for: .milliseconds(100))
                await tcpProxy.stop()
                tcpProxy.cutAll()
                try await sending.value
                try await eventually("back on the HTTP stream", timeout: .seconds(10)) { client.connectionState == .connected(stream) }

                let expected = (0..<200).map { "m\($0)" }
                try await eventually("200 deliveries", timeout: .seconds(20)) { deliveries.count == 200 }
                #expect(deliveries.bodies == expected)
                #expect(deliveries.violations.isEmpty)
                #expect(processed.withLockedValue { $0 } == expected)
            }
        }

        @Test(
            "over https:// the client and the gateway pick HTTP/2 (ALPN h2): the stream and its POSTs share one connection; with either end keeping to HTTP/1.1, two",
            arguments: [(true, true), (false, true), (true, false)]
        )
        func http2(gatewayOffers: Bool, clientOffers: Bool) async throws {
            let offered = gatewayOffers && clientOffers
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: .secureHTTPStream,
                    configure: { $0.webSocket?.stream?.http2 = gatewayOffers },
                    routes: TransportTests.echo
                )
                let counter = TCPFaultProxy(upstream: Endpoint(host: "127.0.0.1", port: endpoint.port))
                let port = try await counter.start().port!
                harness.onExit { counter.cutAll() }
                let tls = ClientTLSConfiguration(trustRoots: .only(.text(TestCertificates.shared.authority.certificatePEM)))
                let client = try harness.client(
                    [Endpoint(host: "127.0.0.1", port: port, transport: .secureHTTPStream)],
                    transport: try TCPClientTransport(tls: tls, offersHTTP2: clientOffers)
                )
                for index in 0..<50 {
                    #expect(try await client.request("echo", body: ByteBuffer(string: "r\(index)")).string == "r\(index)")
                }
                // Many requests in flight: the POSTs queue behind one another on either version.
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for index in 0..<200 {
                        group.addTask {
                            let reply = try await client.request("echo", body: ByteBuffer(string: "c\(index)"))
                            #expect(reply.string == "c\(index)")
                        }
                    }
                    try await group.waitForAll()
                }
                #expect(counter.acceptedConnections == (offered ? 1 : 2), "connections: \(counter.acceptedConnections)")
            }
        }

        @Test(
            "moving up follows the client's clock: no probe before connection.moveUpInterval has passed on it, a move up as soon as it has"
        )
        func moveUpOnVirtualTime() async throws {
            try await withHarness { harness in
                let (gateway, stream) = try await harness.gateway(
                    transport: .httpStream,
                    configure: { $0.listen = .init(host: "127.0.0.1", port: 0) },
                    routes: TransportTests.echo
                )
                let tcpProxy = TCPFaultProxy(upstream: Endpoint(host: "127.0.0.1", port: try await gateway.listeningAddress.port!))
                let tcp = Endpoint(host: "127.0.0.1", port: try await freePort())  // refused until the proxy listens there
                harness.onExit { tcpProxy.cutAll() }
                let clock = ManualClock()
                let client = try harness.client([tcp, stream], clock: clock) { configuration in
                    configuration.connection.moveUpInterval = .seconds(10)
                }
                try await eventually("connected over the HTTP stream") { client.connectionState == .connected(stream) }
                _ = try await tcpProxy.start(port: tcp.port)
                await clock.waitForSleepers(1)

                try await Task.sleep(for: .milliseconds(300))
                clock.advance(by: .milliseconds(9_900))
                try await Task.sleep(for: .milliseconds(300))
                #expect(client.connectionState == .connected(stream), "real time, and 9.9 s of the client's, do not move it")
                #expect(tcpProxy.acceptedConnections == 0, "no probe yet")

                clock.advance(by: .milliseconds(100))
                try await eventually("moved up to TCP") { client.connectionState == .connected(tcp) }
                #expect(try await client.request("echo", body: ByteBuffer(string: "up")).string == "up")
                let events = harness.events(of: client)
                try await eventually("the disconnection says why") {
                    events.disconnectReasons.contains { if case .movingUp(tcp) = $0 { true } else { false } }
                }
            }
        }

        @Test(
            "a gateway shuts down promptly with idle HTTP connections open: a keep-alive POST connection answered 404, one that sent nothing"
        )
        func shutdownWithIdlePostConnections() async throws {
            var configuration = GatewayConfiguration.defaults
            configuration.configureListener(.httpStream, port: 0)
            configuration.timeouts.shutdownGracePeriod = .seconds(2)
            let gateway = try Gateway(configuration: configuration, logger: testLogger("gateway"))
            let run = Task { try await gateway.run() }
            let port = try await gateway.webSocketAddress.port!
            // A keep-alive POST for a session the gateway does not know, answered, then idle.
            let peer = try await HTTPPeer.connect(port: port)
            let post = try await peer.send(
                .POST,
                Endpoint.defaultHTTPStreamPath,
                headers: [
                    (HTTPStreamBinding.sessionHeader, HTTPStreamBinding.makeToken(nodeKey: 1)),
                    (
                        HTTPStreamBinding.proofHeader,
                        HTTPStreamBinding.proof(key: HTTPStreamBinding.makeKey(), post: 0, body: ByteBuffer())!
                    ),
                ],
                body: ByteBuffer()
            )
            let answer = try await post.wait()
            #expect(answer.status == .notFound, "\(answer.status) \(answer.body)")
            // A connection that sent nothing yet.
            let silent = try await HTTPPeer.connect(port: port)
            try await Task.sleep(for: .milliseconds(100))

            let started = ContinuousClock.now
            gateway.shutdown()
            let finished = Task {
                try await run.value
                return ContinuousClock.now - started
            }
            let deadline = Task {
                try await Task.sleep(for: .seconds(10))
                run.cancel()  // stops it at once: the test then fails below, instead of hanging
            }
            let took = try await finished.value
            deadline.cancel()
            #expect(took < .seconds(5), "run() returned \(took) after shutdown()")
            try? await peer.connection.close()
            try? await silent.connection.close()
        }

        @Test("a POST connection the gateway closes for idleness is opened again for the next POST; the stream goes on")
        func postConnectionReopened() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: .httpStream,
                    // Long enough for the first request to be sent well before it (the keep-alive race).
                    configure: { $0.webSocket?.stream?.postIdleTimeout = .seconds(2) },
                    routes: TransportTests.echo
                )
                let counter = TCPFaultProxy(upstream: endpoint)
                let port = try await counter.start().port!
                harness.onExit { counter.cutAll() }
                let proxied = Endpoint(host: "127.0.0.1", port: port, transport: .httpStream)
                let client = try harness.client([proxied])
                #expect(try await client.request("echo", body: ByteBuffer(string: "before")).string == "before")
                #expect(counter.acceptedConnections == 2, "the stream and one POST connection")
                try await eventually("the idle POST connection is closed") { counter.openConnections == 1 }
                #expect(try await client.request("echo", body: ByteBuffer(string: "after")).string == "after")
                #expect(counter.acceptedConnections == 3, "a new POST connection, the same stream")
                #expect(harness.events(of: client).connects == 1, "no reconnection")
            }
        }

        /// Collects what an HTTP/2 stream's response body says.
        final class BodyCollector: ChannelInboundHandler, Sendable {
            typealias InboundIn = HTTPClientResponsePart
            let body = NIOLockedValueBox("")
            func channelRead(context: ChannelHandlerContext, data: NIOAny) {
                if case .body(let bytes) = Self.unwrapInboundIn(data) { self.body.withLockedValue { $0 += String(buffer: bytes) } }
            }
        }

        @Test("an HTTP/2 connection whose streams have all ended is closed after postIdleTimeout")
        func http2IdleConnectionClosed() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: .secureHTTPStream,
                    configure: { $0.webSocket?.stream?.postIdleTimeout = .milliseconds(300) }
                )
                let context = try HTTPPeer.tlsContext(offering: ["h2"])
                let multiplexer = NIOLockedValueBox<NIOHTTP2Handler.StreamMultiplexer?>(nil)
                let connection = try await ClientBootstrap(group: MultiThreadedEventLoopGroup.singleton)
                    .channelInitializer { channel in
                        channel.eventLoop.makeCompletedFuture {
                            try channel.pipeline.syncOperations.addHandler(NIOSSLClientHandler(context: context, serverHostname: nil))
                            let streams = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
                                mode: .client,
                                connectionConfiguration: .init(),
                                streamConfiguration: .init(),
                                inboundStreamInitializer: { $0.close() }
                            )
                            multiplexer.withLockedValue { $0 = streams }
                        }
                    }
                    .connect(host: "127.0.0.1", port: endpoint.port).get()
                harness.onExit { connection.close(promise: nil) }
                let collector = BodyCollector()
                let stream = try await #require(multiplexer.withLockedValue { $0 }).createStreamChannel { child in
                    child.eventLoop.makeCompletedFuture {
                        try child.pipeline.syncOperations.addHandler(HTTP2FramePayloadToHTTP1ClientCodec(httpProtocol: .https))
                        try child.pipeline.syncOperations.addHandler(collector)
                    }
                }.get()
                var head = HTTPRequestHead(version: .http1_1, method: .GET, uri: Endpoint.defaultHTTPStreamPath)
                head.headers.add(name: "Host", value: "127.0.0.1:\(endpoint.port)")
                stream.write(HTTPClientRequestPart.head(head), promise: nil)
                try await stream.writeAndFlush(HTTPClientRequestPart.end(nil)).get()
                try await eventually("the token line over HTTP/2") { collector.body.withLockedValue { $0.hasSuffix("\n") } }

                try await Task.sleep(for: .milliseconds(600))
                #expect(connection.isActive, "a connection with an open stream stays")
                stream.close(promise: nil)  // RST_STREAM: the stream ends
                try await eventually("the idle connection is closed", timeout: .seconds(5)) { !connection.isActive }
            }
        }
    }
}
