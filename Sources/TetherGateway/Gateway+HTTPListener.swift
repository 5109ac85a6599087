import Atomics
import Foundation
import NIOCore
import NIOHTTP1
import NIOHTTP2
import NIOPosix
import NIOSSL
import NIOTLS
import NIOWebSocket
import TetherCore
import TetherNIO
import TetherNIOTransports

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

// The gateway's HTTP listener: a new connection's admission, then an HTTP/1.1 pipeline
// (WebSocket upgrades, the HTTP stream) or an HTTP/2 one (the HTTP stream's streams).
extension Gateway {
    /// Counts a new connection of the HTTP listener among those not serving Tether yet, capped
    /// at the limit of unauthenticated connections, and closes it if it has not upgraded or
    /// opened an HTTP stream within `timeout`.
    /// - Returns: What to call once it serves Tether; `nil` if it was refused: a plain HTTP
    ///   connection is then answered `503` (by an ``HTTPRefusalHandler``, at most
    ///   ``maxRefusing`` at once), a TLS one closed.
    func admitHTTPConnection(_ channel: any Channel, timeout: TimeAmount, tls: Bool) throws -> (@Sendable () -> Void)? {
        let address = channel.remoteAddress?.ipAddress
        if self.admission.isOverRate(address, now: self.clock.now) {
            // Its new connections (or, over HTTP/2, its resets) came faster than its rate.
            let rate = self.configuration.limits.handshakesPerSecondPerAddress
            let reason = "more than \(rate) new connections (or HTTP/2 resets) per second from \(address ?? "-")"
            try self.refuse(channel, .tooManyRequests, reason, limit: "handshake_rate_per_address", retryAfter: .seconds(1), tls: tls)
            return nil
        }
        // Connections that have not upgraded yet are not Tether connections, so the admission
        // limits do not see them: cap them here, at the limit of unauthenticated connections.
        let limit = self.configuration.limits.maxUnauthenticatedConnections
        guard self.pendingUpgrades.loadThenWrappingIncrement(ordering: .relaxed) < limit else {
            self.pendingUpgrades.wrappingDecrement(ordering: .relaxed)
            let reason = "\(limit) HTTP connections are waiting to upgrade or open a stream"
            try self.refuse(channel, .serviceUnavailable, reason, limit: "unauthenticated", retryAfter: .seconds(5), tls: tls)
            return nil
        }
        // Waiting ends once: with the upgrade, or with the connection closing first.
        let pendingUpgrades = self.pendingUpgrades
        let waiting = NIOLoopBoundBox(true, eventLoop: channel.eventLoop)
        @Sendable func stopWaiting() {
            guard waiting.value else { return }
            waiting.value = false
            pendingUpgrades.wrappingDecrement(ordering: .relaxed)
        }
        channel.closeFuture.whenComplete { _ in stopWaiting() }
        channel.eventLoop.scheduleTask(in: timeout) {
            if waiting.value { channel.close(promise: nil) }
        }
        return stopWaiting
    }

    /// Connections of the HTTP listener refused at once and being answered, at most.
    static let maxRefusing = 256

    /// Refuses a new connection of the HTTP listener by `limit` (a metric label), logged.
    func refuse(
        _ channel: any Channel,
        _ status: HTTPResponseStatus,
        _ reason: String,
        limit: String,
        retryAfter: Duration,
        tls: Bool
    ) throws {
        self.refusalLog.log(self.logger, .warning, "refusing HTTP connections", metadata: ["reason": "\(reason)"])
        self.metrics.refused(limit)
        try self.refuse(channel, HTTPRefusal(status: status, message: "\(reason); try again later", retryAfter: retryAfter), tls: tls)
    }

    /// Answers a refused plain-HTTP connection's request with `refusal` and closes it; closes a
    /// TLS connection (a handshake is not worth a refusal), and any beyond ``maxRefusing``.
    func refuse(_ channel: any Channel, _ refusal: HTTPRefusal, tls: Bool) throws {
        guard !tls else {
            channel.close(promise: nil)
            return
        }
        try Self.answer(channel, refusal, countedIn: self.refusing, atMost: Self.maxRefusing)
    }

    /// Answers a refused plain-HTTP connection's request with `refusal` (within 2 s) and closes
    /// it, counted in `refusing` while it is answered; beyond `limit` at once, the connection is
    /// closed unanswered. The HTTP and admin listeners count theirs apart.
    static func answer(_ channel: any Channel, _ refusal: HTTPRefusal, countedIn refusing: ManagedAtomic<Int>, atMost limit: Int) throws {
        guard refusing.loadThenWrappingIncrement(ordering: .relaxed) < limit else {
            refusing.wrappingDecrement(ordering: .relaxed)
            channel.close(promise: nil)
            return
        }
        channel.closeFuture.whenComplete { _ in refusing.wrappingDecrement(ordering: .relaxed) }
        try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
        try channel.pipeline.syncOperations.addHandler(HTTPRefusalHandler(refusal, timeout: .seconds(2)))
    }

    /// How long a connection carrying POSTs may stay idle: as configured, or twice the idle
    /// timeout of Tether connections (a live client's heartbeats come more often).
    func postIdleTimeout(of stream: GatewayConfiguration.HTTPStream) -> Duration {
        stream.postIdleTimeout ?? self.configuration.timeouts.idle * 2
    }

    /// How this node's HTTP streams reach the other nodes': a POST for a session another node
    /// holds goes to that node through `cluster`.
    static func streamForwarding(through cluster: any GatewayCluster, nodeKey: UInt64) -> HTTPStreamSessions.Forwarding {
        HTTPStreamSessions.Forwarding(nodeKey: nodeKey) { token, owner, body, proof in
            let post = ClusterStreamPost(token: token, proof: proof, body: body, nodeKey: owner, forwardedBy: nodeKey)
            return await cluster.forwardStreamPost(post).map { answer in
                .init(status: HTTPResponseStatus(statusCode: answer.status), message: answer.message)
            }
        }
    }

    /// Where the other nodes of a cluster post to this node's HTTP streams, once the HTTP
    /// listener is bound; `nil` without an HTTP stream.
    var streamURL: String? {
        guard let settings = self.configuration.webSocket, let stream = settings.stream,
            let port = self.lifecycle.withLockedValue({ try? $0.addresses[.webSocket]?.get().port })
        else { return nil }
        var host = settings.host
        if GatewayConfiguration.isWildcard(host) { host = ProcessInfo.processInfo.hostName }
        if host.contains(":") && !host.hasPrefix("[") { host = "[\(host)]" }
        return "\(settings.tls ? "https" : "http")://\(host):\(port)\(stream.path)"
    }

    /// The stream's handler for one HTTP connection (HTTP/1.1) or one HTTP/2 stream.
    /// - Parameters:
    ///   - refusal: The handler that answers other requests: it leaves once a stream opens.
    ///   - admitPosts: Admits the connection's POSTs (an HTTP/2 stream asks its connection's).
    ///   - opened: Called with the channel once a GET opened a stream on it.
    ///   - served: Called once the connection serves the stream (a GET, an admitted POST).
    func makeStreamHandler(
        _ stream: GatewayConfiguration.HTTPStream,
        on eventLoop: any EventLoop,
        http2: Bool,
        refusal: NIOLoopBound<WebSocketUpgradeRefusal>,
        admitPosts: @escaping (any Channel) -> HTTPStreamServerHandler.Admission,
        opened: @escaping (any Channel) -> Void = { _ in },
        served: @escaping @Sendable () -> Void
    ) -> HTTPStreamServerHandler {
        HTTPStreamServerHandler(
            settings: .init(
                path: stream.path,
                maxPostBodySize: stream.maxPostBodySize,
                postIdleTimeout: TimeAmount(self.postIdleTimeout(of: stream)),
                bytesInFlightWhilePaused: http2 ? HTTPStreamBinding.gatewayStreamWindow : 0
            ),
            sessions: self.httpStreams,
            admit: { channel, purpose in
                switch purpose {
                case .posts:
                    return admitPosts(channel)
                case .stream:
                    switch self.admitHTTP(channel, kind: .tether) {
                    case .failure(let refusal):
                        return .refused(refusal)
                    case .success(let ticket):
                        return .admitted {
                            // The refusal reads HTTP requests; what follows the stream's handler reads frames.
                            channel.pipeline.syncOperations.removeHandler(refusal.value, promise: nil)
                            try self.configure(channel, framing: .byteStream, transport: .httpStream, admitted: ticket)
                            opened(channel)
                        }
                    }
                }
            },
            served: served,
            intake: self.intakeMonitors[ObjectIdentifier(eventLoop)]
        )
    }

    /// Admits the POSTs of `channel` (an HTTP/1.1 connection, or an HTTP/2 connection for all of
    /// its streams): they count as a connection until it closes.
    func admitPosts(of channel: any Channel) -> HTTPStreamServerHandler.Admission {
        switch self.admitHTTP(channel, kind: .posts) {
        case .failure(let refusal):
            return .refused(refusal)
        case .success(let ticket):
            let admission = self.admission
            return .admitted { channel.closeFuture.whenComplete { _ in admission.left(ticket) } }
        }
    }

    /// An HTTP/1.1 pipeline that upgrades to a Tether WebSocket on `settings.path`, serves the
    /// HTTP stream on its path, and answers anything else with an HTTP error.
    func configureHTTP1(
        _ channel: any Channel,
        settings: GatewayConfiguration.WebSocket,
        stopWaiting: @escaping @Sendable () -> Void
    ) throws {
        let refusal = WebSocketUpgradeRefusal(path: settings.path, allowedOrigins: settings.allowedOrigins)
        let boundRefusal = NIOLoopBound(refusal, eventLoop: channel.eventLoop)
        let streamHandler = settings.stream.map {
            self.makeStreamHandler(
                $0,
                on: channel.eventLoop,
                http2: false,
                refusal: boundRefusal,
                admitPosts: { self.admitPosts(of: $0) },
                served: stopWaiting
            )
        }
        let boundStreamHandler = NIOLoopBound(streamHandler, eventLoop: channel.eventLoop)
        // An upgrade is admitted before the 101, so that a refusal is an HTTP answer; the ticket
        // waits here for the connection's handler, and is given back if the upgrade never happens.
        let ticket = NIOLoopBoundBox(ConnectionAdmission.Ticket?.none, eventLoop: channel.eventLoop)
        let admission = self.admission
        channel.closeFuture.whenComplete { _ in
            if let unused = ticket.value { admission.left(unused) }
        }
        let upgrader = self.makeWebSocketUpgrader(
            path: settings.path,
            allowedOrigins: settings.allowedOrigins,
            admit: { channel in
                switch self.admitHTTP(channel, kind: .tether) {
                case .success(let admitted):
                    ticket.value = admitted
                    return true
                case .failure(let refused):
                    boundRefusal.value.admissionRefusal = refused
                    return false
                }
            },
            upgraded: { channel in
                stopWaiting()
                // The HTTP handlers of this pipeline leave: what follows reads WebSocket frames.
                channel.pipeline.syncOperations.removeHandler(boundRefusal.value, promise: nil)
                if let streamHandler = boundStreamHandler.value {
                    channel.pipeline.syncOperations.removeHandler(streamHandler, promise: nil)
                }
                defer { ticket.value = nil }
                return ticket.value
            }
        )
        try channel.pipeline.syncOperations.configureHTTPServerPipeline(
            withServerUpgrade: (upgraders: [upgrader], completionHandler: { _ in }),
            withErrorHandling: true
        )
        if let streamHandler {
            try channel.pipeline.syncOperations.addHandler(streamHandler)
        }
        try channel.pipeline.syncOperations.addHandler(refusal)
    }

    /// An HTTP/2 connection (ALPN `h2`, TLS only): each stream is a request; the HTTP stream's
    /// GET becomes a Tether connection on its HTTP/2 stream, and its POSTs are other streams of
    /// the same connection. WebSocket is not spoken over HTTP/2 (`426`). The connection counts
    /// as serving Tether once a GET opened a stream on it, and closes
    /// ``GatewayConfiguration/HTTPStream/postIdleTimeout`` after its last stream ended.
    func configureHTTP2(
        _ channel: any Channel,
        settings: GatewayConfiguration.WebSocket,
        stream: GatewayConfiguration.HTTPStream,
        stopWaiting: @escaping @Sendable () -> Void
    ) throws {
        // The Tether streams open on this connection, and the close waiting for none to be.
        let open = NIOLoopBoundBox((count: 0, idleClose: Scheduled<Void>?.none), eventLoop: channel.eventLoop)
        let idleTimeout = TimeAmount(self.postIdleTimeout(of: stream))
        let opened = { (child: any Channel) in
            stopWaiting()  // a GET opened a stream: this is a Tether connection now
            open.value.count += 1
            open.value.idleClose?.cancel()
            child.closeFuture.whenComplete { _ in
                open.value.count -= 1
                guard open.value.count == 0 else { return }
                open.value.idleClose = channel.eventLoop.scheduleTask(in: idleTimeout) { channel.close(promise: nil) }
            }
        }
        let boundOpened = NIOLoopBound(opened, eventLoop: channel.eventLoop)
        // The connection's POSTs are admitted once, as one connection, at its first POST.
        let postsAdmitted = NIOLoopBoundBox(false, eventLoop: channel.eventLoop)
        let connection = channel
        let admitPosts = { (_: any Channel) -> HTTPStreamServerHandler.Admission in
            if postsAdmitted.value { return .admitted {} }
            let admission = self.admitPosts(of: connection)
            if case .admitted = admission { postsAdmitted.value = true }
            return admission
        }
        let boundAdmitPosts = NIOLoopBound(admitPosts, eventLoop: channel.eventLoop)
        // Each stream that ends in a reset costs the address a new connection's token; past its
        // rate, the connection is closed (and new ones from the address turned away).
        let charge = {
            guard !self.admission.charge(connection.remoteAddress?.ipAddress, now: self.clock.now) else { return }
            self.refusalLog.log(
                self.logger,
                .warning,
                "closing an HTTP/2 connection whose streams end in resets faster than its address's rate",
                metadata: ["remote": "\(connection.remoteAddress?.ipAddress ?? "-")"]
            )
            self.metrics.refused("http2_resets")
            connection.close(promise: nil)
        }
        let boundCharge = NIOLoopBound(charge, eventLoop: channel.eventLoop)
        _ = try channel.pipeline.syncOperations.configureHTTP2Pipeline(
            mode: .server,
            connectionConfiguration: HTTPStreamBinding.gatewayHTTP2Connection,
            streamConfiguration: HTTPStreamBinding.gatewayHTTP2Stream,
            inboundStreamInitializer: { child in
                child.eventLoop.makeCompletedFuture {
                    let refusal = WebSocketUpgradeRefusal(path: settings.path, allowedOrigins: settings.allowedOrigins)
                    let boundRefusal = NIOLoopBound(refusal, eventLoop: child.eventLoop)
                    let pipeline = child.pipeline.syncOperations
                    try pipeline.addHandler(HTTP2ResetMeter(reset: boundCharge.value))
                    try pipeline.addHandler(HTTP2FramePayloadToHTTP1ServerCodec())
                    // Only a GET that opens a stream makes the connection a Tether connection (its
                    // POSTs come on the same connection): `opened`, not `served`.
                    try pipeline.addHandler(
                        self.makeStreamHandler(
                            stream,
                            on: child.eventLoop,
                            http2: true,
                            refusal: boundRefusal,
                            admitPosts: boundAdmitPosts.value,
                            opened: boundOpened.value,
                            served: {}
                        )
                    )
                    try pipeline.addHandler(refusal)
                }
            }
        )
    }
}
