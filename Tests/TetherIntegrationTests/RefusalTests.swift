import Foundation
import NIOCore
import NIOHTTP1
import Testing
import Tether
import TetherCore
import TetherGateway
import TetherNIO
import TetherNIOTransports
import TetherTestSupport

extension IntegrationTests {
    /// Every connection limit, on every transport: the connection over it is refused as
    /// PROTOCOL.md says (ERROR `resource exhausted` and a close over TCP; over HTTP `503` for a
    /// count and `429` for a rate, with `Retry-After`, before any `101` or stream), and the
    /// gateway goes on serving.
    @Suite("Refusals: past every limit, on every transport", .timeLimit(.minutes(3)))
    struct RefusalTests {
        /// A limit, set to what one connection reaches.
        enum Limit: String, CaseIterable, CustomStringConvertible {
            case connections
            case connectionsPerAddress = "connections per address"
            case unauthenticated
            case handshakeRate = "handshake rate"
            case handshakeRatePerAddress = "handshake rate per address"

            var description: String { self.rawValue }

            func apply(to limits: inout GatewayConfiguration.Limits) {
                switch self {
                case .connections: limits.maxConnections = 1
                case .connectionsPerAddress: limits.maxConnectionsPerAddress = 1
                case .unauthenticated: limits.maxUnauthenticatedConnections = 1
                case .handshakeRate: limits.handshakesPerSecond = 1
                case .handshakeRatePerAddress: limits.handshakesPerSecondPerAddress = 1
                }
            }

            /// The HTTP status of a refusal by this limit.
            var status: HTTPResponseStatus {
                switch self {
                case .handshakeRate, .handshakeRatePerAddress: .tooManyRequests
                case .connections, .connectionsPerAddress, .unauthenticated: .serviceUnavailable
                }
            }
        }

        /// How the connection over the limit reaches the gateway.
        enum Path: String, CaseIterable, CustomStringConvertible {
            case tcp = "TCP"
            case webSocket = "WebSocket upgrade"
            case streamGET = "HTTP stream GET"
            case firstPOST = "a connection's first POST"
            case http2GET = "HTTP/2 stream GET"

            var description: String { self.rawValue }
            var secure: Bool { self == .http2GET }
        }

        @Test("the connection over the limit is refused as specified; the gateway serves on", arguments: Limit.allCases, Path.allCases)
        func refused(limit: Limit, path: Path) async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    transport: path.secure ? .secureHTTPStream : .httpStream,
                    configure: { configuration in
                        configuration.listen = .init(host: "127.0.0.1", port: 0)
                        limit.apply(to: &configuration.limits)
                        configuration.timeouts.handshake = .seconds(30)
                    },
                    routes: TransportTests.echo
                )
                let tcp = Endpoint(host: "127.0.0.1", port: try await gateway.listeningAddress.port!)
                // One connection that has not sent HELLO: it reaches every limit (set to one).
                let holder = try await RawConnection.connect(to: tcp)
                defer { holder.close() }
                try await eventually("the first connection is admitted") { gateway.health.connections == 0 && holder.channel.isActive }
                try await Task.sleep(for: .milliseconds(50))

                switch path {
                case .tcp:
                    let refused = try await RawConnection.connect(to: tcp)
                    guard case .error(let report)? = await refused.next()?.payload else {
                        Issue.record("\(limit) over TCP: no ERROR")
                        return
                    }
                    #expect(report.code == .resourceExhausted)
                    try await refused.waitForClose()
                case .webSocket:
                    let peer = try await HTTPPeer.connect(port: endpoint.port)
                    let exchange = try await peer.send(
                        .GET,
                        Endpoint.defaultWebSocketPath,
                        headers: [
                            ("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13"),
                            ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Protocol", WebSocketBinding.subprotocol),
                        ]
                    )
                    try await Self.expectRefusal(exchange, limit: limit, closes: peer)
                case .streamGET:
                    let peer = try await HTTPPeer.connect(port: endpoint.port)
                    try await Self.expectRefusal(try await peer.send(.GET, Endpoint.defaultHTTPStreamPath), limit: limit, closes: peer)
                case .firstPOST:
                    let peer = try await HTTPPeer.connect(port: endpoint.port)
                    let exchange = try await peer.send(
                        .POST,
                        Endpoint.defaultHTTPStreamPath,
                        headers: [
                            (HTTPStreamBinding.sessionHeader, HTTPStreamBinding.makeToken()),
                            (HTTPStreamBinding.proofHeader, HTTPStreamBinding.makeKey()),
                        ],
                        body: ByteBuffer(string: "frames")
                    )
                    if limit == .unauthenticated {
                        // A POST connection is not waiting for a handshake: admitted, and its
                        // unknown session gets 404.
                        #expect(try await exchange.wait().status == .notFound)
                    } else {
                        try await Self.expectRefusal(exchange, limit: limit, closes: peer)
                    }
                case .http2GET where limit == .handshakeRatePerAddress:
                    // An address over its rate is turned away before TLS (a handshake costs more
                    // than a refusal is worth): the connection closes at once.
                    let peer = try? await HTTPPeer.connect(port: endpoint.port, http2: true)
                    if let peer {
                        try await eventually("the connection over the rate is closed") { !peer.isActive }
                    }
                case .http2GET:
                    let peer = try await HTTPPeer.connect(port: endpoint.port, http2: true)
                    defer { peer.close() }
                    let exchange = try await peer.send(.GET, Endpoint.defaultHTTPStreamPath)
                    try await Self.expectRefusal(exchange, limit: limit, closes: nil)
                    try await eventually("the refused stream is closed") { !exchange.channel.isActive }
                }
                #expect(gateway.health.connections == 0, "nothing over the limit was established")

                // The gateway serves on: once the holder leaves (and a rate refills), a client
                // on the refused path is served.
                holder.close()
                if limit.status == .tooManyRequests { try await Task.sleep(for: .milliseconds(1100)) }
                // Over TCP: an HTTP stream takes two connections (its POSTs count), more than these limits allow.
                let client = try harness.client([tcp])
                let reply = try await client.request("echo", body: ByteBuffer(string: "still here"), timeout: .seconds(10))
                #expect(String(buffer: reply) == "still here")
            }
        }

        /// `exchange` got the limit's status, a reason, `Retry-After`, and (over HTTP/1.1) a close.
        static func expectRefusal(_ exchange: HTTPPeer.Exchange, limit: Limit, closes peer: HTTPPeer?) async throws {
            let response = try await exchange.wait()
            #expect(response.status == limit.status, "\(limit): \(response.status) \(response.body)")
            #expect(response.headers["Retry-After"].first.flatMap(Int.init).map { $0 >= 1 } == true, "\(limit): \(response.headers)")
            #expect(response.body.contains("connection"), "\(limit): the reason: \(response.body)")
            if let peer {
                #expect(response.headers["Connection"] == ["close"])
                try await eventually("the refused connection is closed") { !peer.isActive }
            }
        }

        @Test(
            "during a graceful drain, a GET on a kept-alive POST connection gets 503 'shutting down', and the stream in flight its GOAWAY"
        )
        func drainingGET() async throws {
            try await withHarness { harness in
                let (gateway, endpoint) = try await harness.gateway(
                    transport: .httpStream,
                    configure: { $0.timeouts.shutdownGracePeriod = .seconds(20) },
                    routes: TransportTests.echo
                )
                let stream = try await HTTPPeer.connect(port: endpoint.port)
                defer { stream.close() }
                let session = try await stream.openStream()
                let (opened, line) = (session.stream, session.line)
                let posts = try await HTTPPeer.connect(port: endpoint.port)
                defer { posts.close() }
                let hello = Frame.Payload.hello(.init(versions: 1...1, features: .checksum, maxBodySize: 1 << 20, clientID: "drained"))
                #expect(try await session.post([hello], on: posts).wait().status == .noContent)
                try await eventually("the session is established") { gateway.health.connections == 1 }

                gateway.shutdown()
                let again = try await posts.send(.GET, Endpoint.defaultHTTPStreamPath)
                let response = try await again.wait()
                #expect(response.status == .serviceUnavailable)
                #expect(response.body.contains("shutting down"))
                #expect(response.headers["Retry-After"] == ["1"])
                try await eventually("the stream got its GOAWAY") {
                    guard var bytes = opened.response?.bytes else { return false }
                    bytes.moveReaderIndex(forwardBy: line.utf8.count + 1)
                    var decoder = FrameDecoder(maxBodySize: 1 << 20)
                    while let frame = try? decoder.decodeFrame(from: &bytes) {
                        if case .goAway = frame.payload { return true }
                    }
                    return false
                }
            }
        }

        @Test(
            "HTTP/2 streams reset one after another take their address's rate: the connection is closed, and new ones are turned away until the rate allows them"
        )
        func http2Resets() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: .secureHTTPStream,
                    configure: { $0.limits.handshakesPerSecondPerAddress = 20 },
                    routes: TransportTests.echo
                )
                let peer = try await HTTPPeer.connect(port: endpoint.port, http2: true)
                var resets = 0
                while peer.isActive, resets < 200 {
                    // HEADERS without END_STREAM, then RST_STREAM (CANCEL) from the client.
                    guard let exchange = try? await peer.send(.POST, Endpoint.defaultHTTPStreamPath, end: false) else { break }
                    try? await exchange.channel.close()
                    resets += 1
                    try await Task.sleep(for: .milliseconds(2))
                }
                try await eventually("the connection is closed") { !peer.isActive }
                #expect(resets <= 30, "closed after about the address's rate of resets, not \(resets)")
                let next = try? await HTTPPeer.connect(port: endpoint.port, http2: true)
                if let next { try await eventually("a new connection right away is turned away") { !next.isActive } }
                try await Task.sleep(for: .milliseconds(1100))
                let later = try await HTTPPeer.connect(port: endpoint.port, http2: true)
                defer { later.close() }
                let response = try await later.send(.GET, Endpoint.defaultHTTPStreamPath).wait(ended: false)
                #expect(response.status == .ok, "once the rate allows, a connection is served")
            }
        }

        @Test("a POST carrying more requests than the connection runs at once is answered 204 only once its frames are read")
        func postAnsweredAfterRead() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: .httpStream,
                    configure: { $0.limits.maxConcurrentRequestsPerConnection = 2 },
                    routes: { gateway in
                        gateway.handle("slow") { request, _ in
                            try await Task.sleep(for: .milliseconds(200))
                            return request.body
                        }
                    }
                )
                let stream = try await HTTPPeer.connect(port: endpoint.port)
                defer { stream.close() }
                let session = try await stream.openStream()
                let posts = try await HTTPPeer.connect(port: endpoint.port)
                defer { posts.close() }
                let hello = Frame.Payload.hello(.init(versions: 1...1, features: .checksum, maxBodySize: 1 << 20, clientID: "poster"))
                #expect(try await session.post([hello], on: posts).wait().status == .noContent)
                // 40 requests: 2 run and 16 wait; the gateway stops reading with 22 still in the body.
                let requests = (1...40).map {
                    Frame.Payload.request(.init(id: UInt64($0), method: "slow", body: ByteBuffer(string: "\($0)")))
                }
                let started = ContinuousClock.now
                let answered = try await session.post(requests, on: posts).wait(timeout: .seconds(30))
                let elapsed = ContinuousClock.now - started
                #expect(answered.status == .noContent)
                // The last 22 are read as the first ones finish: 11 rounds of two 200 ms handlers.
                #expect(elapsed >= .milliseconds(1800), "answered after \(elapsed): before the connection read the body")
            }
        }

        @Test(
            "a WebSocket upgrade request with a body is refused 400 (the fuzz target found that NIO's upgrade handler, waiting for a body's end, leaks if the connection closes first)"
        )
        func upgradeWithBody() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(transport: .webSocket, routes: TransportTests.echo)
                let peer = try await HTTPPeer.connect(port: endpoint.port)
                defer { peer.close() }
                let exchange = try await peer.send(
                    .GET,
                    Endpoint.defaultWebSocketPath,
                    headers: [
                        ("Upgrade", "websocket"), ("Connection", "Upgrade"), ("Sec-WebSocket-Version", "13"),
                        ("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ=="), ("Sec-WebSocket-Protocol", WebSocketBinding.subprotocol),
                    ],
                    body: ByteBuffer(string: "a body")
                )
                let response = try await exchange.wait()
                #expect(response.status == .badRequest)
                #expect(response.body.contains("has no body"), "\(response.body)")
            }
        }

        @Test("over the cap of HTTP connections waiting to upgrade, a plain HTTP connection is answered 503 with Retry-After")
        func pendingUpgrades() async throws {
            try await withHarness { harness in
                let (_, endpoint) = try await harness.gateway(
                    transport: .httpStream,
                    configure: { $0.limits.maxUnauthenticatedConnections = 2 },
                    routes: TransportTests.echo
                )
                let waiting = [try await HTTPPeer.connect(port: endpoint.port), try await HTTPPeer.connect(port: endpoint.port)]
                defer { for peer in waiting { peer.close() } }
                try await Task.sleep(for: .milliseconds(100))
                let refused = try await HTTPPeer.connect(port: endpoint.port)
                let exchange = try await refused.send(.GET, Endpoint.defaultHTTPStreamPath)
                let response = try await exchange.wait()
                #expect(response.status == .serviceUnavailable)
                #expect(response.headers["Retry-After"] == ["5"])
                #expect(response.body.contains("waiting to upgrade"))
                try await eventually("the refused connection is closed") { !refused.isActive }
            }
        }

        @Test("tether serve --max-connections-per-address 1: curl's GETs over the limit get 503, the process lives on", .requires(.curl))
        func serveProcessLives() async throws {
            try OutsideTool.curl.require()
            try await withHarness(timeLimit: .seconds(90)) { harness in
                let port = try await freePort()
                let webSocketPort = try await freePort()
                let gateway = try ChildProcess(
                    [
                        "serve", "--port", "\(port)", "--ws-port", "\(webSocketPort)", "--store", ":memory:",
                        "--max-connections-per-address", "1",
                    ],
                    in: harness
                )
                try await eventually("the gateway listens", timeout: .seconds(60)) {
                    gateway.lines.filter { $0.contains("listening") }.count >= 2
                }
                let url = "http://127.0.0.1:\(webSocketPort)\(Endpoint.defaultHTTPStreamPath)"
                _ = try ChildProcess(executable: "/usr/bin/env", ["curl", "-sN", "--max-time", "20", "-o", "/dev/null", url], in: harness)
                try await Task.sleep(for: .milliseconds(500))
                for _ in 0..<3 {
                    let curl = try ChildProcess(
                        executable: "/usr/bin/env",
                        [
                            "curl", "-s", "-o", "/dev/null", "-w", "%{http_code} retry-after=%header{retry-after}\\n", "--max-time", "10",
                            url,
                        ],
                        in: harness
                    )
                    #expect(try await curl.exitStatus(timeout: .seconds(15)) == 0)
                    #expect(curl.lines.last == "503 retry-after=5", "\(curl.lines)")
                }
                #expect(gateway.isRunning, "the gateway survived the refusals")
            }
        }
    }
}
