import Atomics
import Foundation
public import NIOCore
import NIOHTTP1
import NIOPosix
import TetherCore
import TetherNIO
import TetherNIOTransports

// The admin listener: /health, /ready and /metrics over plain HTTP, for operators and orchestrators.
extension Gateway {
    /// Whether the gateway should be sent clients now, and if not, why.
    public struct Readiness: Sendable, Hashable, Codable {
        public var ready: Bool
        /// Why it is not ready: `starting`, `draining`, `store unreachable: …`, `store failing: …`
        /// (its last commit failed: a full disk, say).
        public var reasons: [String]

        public init(ready: Bool, reasons: [String]) {
            self.ready = ready
            self.reasons = reasons
        }
    }

    /// What `/health` says.
    public struct Health: Sendable, Hashable, Codable {
        /// Always `alive` while the process answers.
        public var status: String
        /// A graceful shutdown is under way.
        public var draining: Bool
        /// Connections established now.
        public var connections: Int
        /// No authenticator: any client may claim any client id.
        public var open: Bool
        /// Open, and listening beyond loopback (``GatewayConfiguration/insecureOpen``).
        public var insecureOpen: Bool
        /// What the connections hold of the memory budget now, in bytes.
        public var memoryHeld: Int
        /// The memory budget (``GatewayConfiguration/Limits-swift.struct/memoryBudget``).
        public var memoryBudget: Int
    }

    /// How long `/ready` waits for the message store to answer.
    static let storeProbeTimeout = Duration.seconds(2)

    /// Whether the gateway accepts connections, its message store answers, and the store's last
    /// commit did not fail.
    public func readiness() async -> Readiness {
        var reasons: [String] = []
        let (started, shuttingDown) = self.lifecycle.withLockedValue { ($0.accepting || $0.shuttingDown, $0.shuttingDown) }
        if !started { reasons.append("starting") }
        if shuttingDown { reasons.append("draining") }
        if self.memoryBudget.isExhausted {
            reasons.append(
                "memory budget exhausted: connections hold \(self.memoryBudget.usedBytes) bytes of \(self.memoryBudget.limit) "
                    + "(new connections are refused from \(self.memoryBudget.threshold))"
            )
        }
        if let store = self.reliable?.store {
            do {
                let timeout = Self.storeProbeTimeout
                try await withTimeout(timeout, failure: { MessageStoreError(code: .storage, message: "no answer within \(timeout)") }) {
                    try await store.checkReachable()
                }
            } catch {
                reasons.append("store unreachable: \((error as? MessageStoreError)?.message ?? "\(error)")")
            }
            if let failing = self.reliable?.writer.failing { reasons.append("store failing: \(failing)") }
        }
        for check in self.router.readinessChecks {
            if let reason = check() { reasons.append(reason) }
        }
        return Readiness(ready: reasons.isEmpty, reasons: reasons)
    }

    /// A check of something the gateway depends on: `nil` when it is fine, or why the gateway
    /// is not ready (`/ready` answers 503 with the reason).
    public typealias ReadinessCheck = @Sendable () -> String?

    /// Adds a check to `/ready` (a backend the gateway calls, say). Add it before ``run()``.
    public func addReadinessCheck(_ check: @escaping ReadinessCheck) {
        self.register("addReadinessCheck") { $0.readinessChecks.append(check) }
    }

    /// The process's health, as `/health` says it.
    public var health: Health {
        let open = self.authenticator == nil
        return Health(
            status: "alive",
            draining: self.lifecycle.withLockedValue { $0.shuttingDown },
            connections: self.registry.established.count,
            open: open,
            insecureOpen: open && !self.configuration.nonLoopbackHosts.isEmpty,
            memoryHeld: self.memoryBudget.usedBytes,
            memoryBudget: self.memoryBudget.limit
        )
    }

    /// The address the admin listener (``GatewayConfiguration/admin``) is bound to, once it is.
    /// - Throws: ``GatewayError`` if the gateway has no admin listener, failed to bind, or
    ///   shut down before binding.
    public var adminAddress: SocketAddress {
        get async throws(GatewayError) {
            if self.configuration.admin == nil {
                throw GatewayError(code: .notListening, message: "the configuration has no admin listener")
            }
            return try await self.boundAddress(of: .admin)
        }
    }

    /// Connections of the admin listener refused at once and being answered (`503`), at most;
    /// beyond, a connection is closed unanswered.
    static let maxAdminRefusing = 64

    /// Binds the admin listener. It stays open while the gateway drains (so that `/ready`
    /// says so) and closes when ``run()`` ends.
    func bindAdmin(_ admin: GatewayConfiguration.Admin) async throws -> any Channel {
        let connections = self.adminConnections
        let bootstrap = ServerBootstrap(group: self.eventLoopGroup)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelInitializer { channel in
                channel.eventLoop.makeCompletedFuture {
                    guard connections.loadThenWrappingIncrement(ordering: .relaxed) < admin.maxConnections else {
                        connections.wrappingDecrement(ordering: .relaxed)
                        let refusal = HTTPRefusal(
                            status: .serviceUnavailable,
                            message: "the admin listener holds its maximum of \(admin.maxConnections) connections; try again later",
                            retryAfter: .seconds(1)
                        )
                        try Self.answer(channel, refusal, countedIn: self.adminRefusing, atMost: Self.maxAdminRefusing)
                        return
                    }
                    try channel.pipeline.syncOperations.configureHTTPServerPipeline(withErrorHandling: true)
                    channel.closeFuture.whenComplete { _ in connections.wrappingDecrement(ordering: .relaxed) }
                    try channel.pipeline.syncOperations.addHandler(
                        AdminHTTPHandler(gateway: self, token: admin.token, idleTimeout: TimeAmount(admin.idleTimeout))
                    )
                }
            }
        let server: any Channel
        do {
            server = try await bootstrap.bind(host: admin.host, port: admin.port).get()
        } catch {
            let failure = GatewayError(code: .bindFailed, message: "cannot listen on \(admin.host):\(admin.port) (admin): \(error)")
            self.resolveAddress(of: .admin, .failure(failure))
            throw failure
        }
        if let address = server.localAddress {
            self.logger.info(
                "admin listening",
                metadata: ["address": "http://\(address.ipAddress ?? admin.host):\(address.port ?? admin.port)"]
            )
            self.resolveAddress(of: .admin, .success(address))
        }
        return server
    }
}

/// Answers the admin listener's requests: `GET /health`, `GET /ready` and `GET /metrics`;
/// `404` otherwise, `401` without the token (if it has one). A connection with no complete
/// request within the idle timeout is closed.
final class AdminHTTPHandler: ChannelInboundHandler {
    typealias InboundIn = HTTPServerRequestPart
    typealias OutboundOut = HTTPServerResponsePart

    private let gateway: Gateway
    /// `Bearer <token>`, as an `Authorization` header must say it; `nil` takes any request.
    private let authorization: [UInt8]?
    private let idleTimeout: TimeAmount
    private var request: HTTPRequestHead?
    private var idle: Scheduled<Void>?

    init(gateway: Gateway, token: String?, idleTimeout: TimeAmount) {
        self.gateway = gateway
        self.authorization = token.map { Array("Bearer \($0)".utf8) }
        self.idleTimeout = idleTimeout
    }

    func handlerAdded(context: ChannelHandlerContext) {
        self.waitForRequest(context: context)
    }

    func handlerRemoved(context: ChannelHandlerContext) {
        self.idle?.cancel()
    }

    /// Closes the connection unless a whole request arrives within the idle timeout.
    private func waitForRequest(context: ChannelHandlerContext) {
        self.idle?.cancel()
        let loopBound = NIOLoopBound(context, eventLoop: context.eventLoop)
        self.idle = context.eventLoop.scheduleTask(in: self.idleTimeout) { loopBound.value.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        switch Self.unwrapInboundIn(data) {
        case .head(let head):
            self.request = head
        case .body:
            break
        case .end:
            guard let head = self.request else { return }
            self.request = nil
            self.idle?.cancel()
            self.idle = nil
            self.answer(head, context: context)
        }
    }

    /// Whether the request carries the token (compared in a time that does not depend on where it differs).
    private func authorized(_ head: HTTPRequestHead) -> Bool {
        guard let expected = self.authorization else { return true }
        let given = Array((head.headers.first(name: "Authorization") ?? "").utf8)
        guard given.count == expected.count else { return false }
        var difference: UInt8 = 0
        for index in given.indices { difference |= given[index] ^ expected[index] }
        return difference == 0
    }

    private func answer(_ head: HTTPRequestHead, context: ChannelHandlerContext) {
        guard self.authorized(head) else {
            self.respond(
                .unauthorized,
                text: "the admin listener takes requests with its token: Authorization: Bearer <token>\n",
                head: head,
                context: context
            )
            return
        }
        guard head.method == .GET || head.method == .HEAD else {
            self.respond(.methodNotAllowed, text: "the admin listener takes GET\n", head: head, context: context)
            return
        }
        switch head.pathWithoutQuery {
        case "/health":
            self.respond(.ok, json: self.gateway.health, head: head, context: context)
        case "/ready":
            let gateway = self.gateway
            let loopBound = NIOLoopBound((self, context), eventLoop: context.eventLoop)
            context.eventLoop.makeFutureWithTask { await gateway.readiness() }.whenSuccess { readiness in
                let (handler, context) = loopBound.value
                handler.respond(readiness.ready ? .ok : .serviceUnavailable, json: readiness, head: head, context: context)
            }
        case "/metrics":
            self.gateway.sampleMemory()
            guard let registry = self.gateway.metricsRegistry else {
                self.respond(
                    .notFound,
                    text: "this gateway's metrics go to another backend: create it with metrics: .prometheus() to serve /metrics\n",
                    head: head,
                    context: context
                )
                return
            }
            self.respond(
                .ok,
                text: registry.emitToString(),
                contentType: "text/plain; version=0.0.4; charset=utf-8",
                head: head,
                context: context
            )
        default:
            self.respond(.notFound, text: "the admin listener serves /health, /ready and /metrics\n", head: head, context: context)
        }
    }

    private func respond(_ status: HTTPResponseStatus, json: some Encodable, head: HTTPRequestHead, context: ChannelHandlerContext) {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        let text = ((try? encoder.encode(json)).map { String(decoding: $0, as: UTF8.self) } ?? "{}") + "\n"
        self.respond(status, text: text, contentType: "application/json", head: head, context: context)
    }

    private func respond(
        _ status: HTTPResponseStatus,
        text: String,
        contentType: String = "text/plain; charset=utf-8",
        head: HTTPRequestHead,
        context: ChannelHandlerContext
    ) {
        guard context.channel.isActive else { return }
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: contentType)
        headers.add(name: "Content-Length", value: "\(text.utf8.count)")
        headers.add(name: "Cache-Control", value: "no-store")
        if status == .unauthorized { headers.add(name: "WWW-Authenticate", value: "Bearer") }
        if !head.isKeepAlive { headers.add(name: "Connection", value: "close") }
        context.write(Self.wrapOutboundOut(.head(HTTPResponseHead(version: head.version, status: status, headers: headers))), promise: nil)
        if head.method != .HEAD {
            context.write(Self.wrapOutboundOut(.body(.byteBuffer(context.channel.allocator.buffer(string: text)))), promise: nil)
        }
        let keepAlive = head.isKeepAlive
        context.writeAndFlush(Self.wrapOutboundOut(.end(nil))).assumeIsolated().whenComplete { _ in
            if !keepAlive { context.close(promise: nil) }
        }
        if keepAlive { self.waitForRequest(context: context) }
    }
}

@available(*, unavailable)
extension AdminHTTPHandler: Sendable {}
