import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2Posix
import HTTPTypes
import Hummingbird
import HummingbirdCore
public import Logging
import NIOConcurrencyHelpers
import NIOCore
import OpenAPIHummingbird
import OpenAPIRuntime
public import ServiceLifecycle
import TetherCore
public import TetherGateway

/// The server API of a gateway, on a listener of its own: what a backend in any language
/// drives the gateway with, as JSON over HTTP (`openapi.yaml` in this module says every call)
/// and, with ``ServerAPIConfiguration/grpcPort``, as gRPC (`Protos/tether/v1/server_api.proto`).
///
/// Run it beside the gateway, in the same service group:
///
/// ```swift
/// let api = ServerAPIService(gateway: gateway, configuration: try ServerAPIConfiguration(port: 8090, keys: [key]))
/// let group = ServiceGroup(services: [gateway, api], gracefulShutdownSignals: [.sigterm], logger: logger)
/// try await group.run()
/// ```
///
/// Its routes are generated from `openapi.yaml` (swift-openapi-generator) and served by
/// Hummingbird; in front of them, every call's API key and body size are checked, and a call
/// that is malformed is answered 400 with an `Error` body, never a 500. The gRPC form is
/// served by grpc-swift 2 over HTTP/2 (plaintext: keep the API on a private network), with
/// the same keys, limits and checks.
public struct ServerAPIService: Service {
    private let gateway: Gateway
    private let configuration: ServerAPIConfiguration
    private let logger: Logger
    private let bound = Bound()
    private let grpcBound = Bound()

    /// - Parameters:
    ///   - gateway: The gateway the calls act on.
    ///   - configuration: Where to listen, the API keys, the limits.
    ///   - logger: Where the API logs.
    public init(gateway: Gateway, configuration: ServerAPIConfiguration, logger: Logger = Logger(label: "tether.api")) {
        self.gateway = gateway
        self.configuration = configuration
        self.logger = logger
    }

    /// Serves until graceful shutdown (the service group's signal), then finishes the calls
    /// under way and returns.
    public func run() async throws {
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask { try await self.runHTTP() }
            if let port = self.configuration.grpcPort {
                if #available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *) {
                    group.addTask { try await self.runGRPC(port: port) }
                } else {
                    self.grpcBound.resolve(nil)
                    throw GatewayError(code: .invalidConfiguration, message: "the gRPC server API needs macOS 15 or later")
                }
            }
            // One listener failing stops the other.
            while let _ = try await group.next() {}
        }
    }

    private func runHTTP() async throws {
        let router = Router()
        router.add(middleware: APIGuard(keys: APIKeys(self.configuration.keys), maxBodyBytes: self.configuration.maxBodyBytes))
        let handler = ServerAPIHandler(gateway: self.gateway)
        // Compact JSON: the generated code's default pretty-prints and sorts every answer's keys.
        try handler.registerHandlers(
            on: router,
            configuration: .init(jsonEncodingOptions: []),
            middlewares: [RefusalMiddleware(logger: self.logger)]
        )
        let bound = self.bound
        let application = Application(
            router: router,
            server: .http1(configuration: .init(idleTimeout: .nanoseconds(self.configuration.idleTimeout.nanoseconds))),
            configuration: .init(
                address: .hostname(self.configuration.host, port: self.configuration.port),
                serverName: "tether",
                availableConnectionsDelegate: MaximumAvailableConnections(self.configuration.maxConnections)
            ),
            onServerRunning: { channel in bound.resolve(channel.localAddress?.port) },
            logger: self.logger
        )
        do {
            // As a service of the caller's group: it stops on the group's graceful shutdown
            // (runService() would also catch SIGTERM and SIGINT on its own).
            try await application.run()
        } catch {
            bound.resolve(nil)
            throw error
        }
        bound.resolve(nil)
    }

    @available(macOS 15.0, iOS 18.0, watchOS 11.0, tvOS 18.0, visionOS 2.0, *)
    private func runGRPC(port: Int) async throws {
        let host = self.configuration.host == "localhost" ? "127.0.0.1" : self.configuration.host
        let maxBodyBytes = self.configuration.maxBodyBytes
        let idleTimeout = self.configuration.idleTimeout
        let maxConnections = self.configuration.maxConnections
        let transport = HTTP2ServerTransport.Posix(
            address: host.contains(":") ? .ipv6(host: host, port: port) : .ipv4(host: host, port: port),
            transportSecurity: .plaintext,
            config: .defaults { config in
                // Twice the limit: a request up to it is read and refused with a status that says
                // why (GRPCServerAPI); the transport resets a larger one.
                config.rpc.maxRequestPayloadSize = maxBodyBytes * 2
                config.connection.maxIdleTime = idleTimeout
                // On the listening channel: at the cap it stops accepting, and a connection
                // that closes lets the next in.
                config.channelDebuggingCallbacks.onBindTCPListener = { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try channel.pipeline.syncOperations.addHandler(ConnectionCapHandler(maxConnections: maxConnections))
                    }
                }
            }
        )
        let server = GRPCServer(
            transport: transport,
            services: [GRPCServerAPI(gateway: self.gateway, maxBodyBytes: maxBodyBytes)],
            interceptors: [APIKeyInterceptor(keys: APIKeys(self.configuration.keys))]
        )
        let bound = self.grpcBound
        defer { bound.resolve(nil) }
        try await withGracefulShutdownHandler {
            try await withThrowingTaskGroup(of: Void.self) { group in
                group.addTask { try await server.serve() }
                group.addTask {
                    let address = try? await transport.listeningAddress
                    bound.resolve(address?.ipv4?.port ?? address?.ipv6?.port)
                }
                while let _ = try await group.next() {}
            }
        } onGracefulShutdown: {
            server.beginGracefulShutdown()
        }
    }

    /// The port the gRPC API listens on, once it does (useful with port 0).
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/notListening`` if it has none or
    ///   stopped before it listened.
    public func grpcListeningPort() async throws(GatewayError) -> Int {
        guard self.configuration.grpcPort != nil, let port = await self.grpcBound.port() else {
            throw GatewayError(code: .notListening, message: "the gRPC server API is not listening")
        }
        return port
    }

    /// The port the API listens on, once it does (useful with port 0).
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/notListening`` if the API stopped
    ///   before it listened.
    public func listeningPort() async throws(GatewayError) -> Int {
        guard let port = await self.bound.port() else {
            throw GatewayError(code: .notListening, message: "the server API stopped before it listened")
        }
        return port
    }

    /// The port, once known; waiters are resumed when the listener is up or failed.
    private final class Bound: Sendable {
        private enum State {
            case waiting([CheckedContinuation<Int?, Never>])
            case resolved(Int?)
        }

        private let state = NIOLockedValueBox(State.waiting([]))

        func resolve(_ port: Int?) {
            let waiters: [CheckedContinuation<Int?, Never>] = self.state.withLockedValue { state in
                guard case .waiting(let waiters) = state else { return [] }
                state = .resolved(port)
                return waiters
            }
            for waiter in waiters { waiter.resume(returning: port) }
        }

        func port() async -> Int? {
            await withCheckedContinuation { continuation in
                let resolved: Int?? = self.state.withLockedValue { state in
                    switch state {
                    case .resolved(let port):
                        return .some(port)
                    case .waiting(var waiters):
                        waiters.append(continuation)
                        state = .waiting(waiters)
                        return .none
                    }
                }
                if case .some(let port) = resolved { continuation.resume(returning: port) }
            }
        }
    }
}

/// Checks every call's API key and body size before its route runs: a call without a valid
/// key is answered 401, a body over the limit 413, each with an `Error` body.
struct APIGuard<Context: Hummingbird.RequestContext>: RouterMiddleware {
    let keys: APIKeys
    let maxBodyBytes: Int

    func handle(_ request: Request, context: Context, next: (Request, Context) async throws -> Response) async throws -> Response {
        guard self.keys.authorizes(request.headers[.authorization]) else {
            var response = Self.refusal(
                status: .unauthorized,
                code: "unauthorized",
                message: "an API key is needed: Authorization: Bearer KEY"
            )
            response.headers[.wwwAuthenticate] = "Bearer"
            return response
        }
        if let length = request.headers[.contentLength].flatMap({ Int($0) }), length > self.maxBodyBytes {
            return Self.tooLarge(self.maxBodyBytes)
        }
        var request = request
        do {
            let body = try await request.body.collect(upTo: self.maxBodyBytes)
            request.body = RequestBody(buffer: body)
        } catch let error as HTTPError where error.status == .contentTooLarge {
            return Self.tooLarge(self.maxBodyBytes)
        }
        return try await next(request, context)
    }

    static func tooLarge(_ limit: Int) -> Response {
        refusal(status: .contentTooLarge, code: "too_large", message: "the body is larger than the API's maximum of \(limit) bytes")
    }

    static func refusal(status: HTTPResponse.Status, code: String, message: String) -> Response {
        Response(
            status: status,
            headers: [.contentType: "application/json"],
            body: ResponseBody(byteBuffer: ByteBuffer(string: APIFailure(status: status.code, code: code, message: message).json))
        )
    }
}

/// Answers a call the generated code could not take (malformed JSON, an unknown property, a
/// parameter of the wrong type, a wrong content type) with its 4xx and an `Error` body, and
/// any other failure with a 500 that says no more than that.
struct RefusalMiddleware: ServerMiddleware {
    let logger: Logger

    func intercept(
        _ request: HTTPRequest,
        body: HTTPBody?,
        metadata: ServerRequestMetadata,
        operationID: String,
        next: @Sendable (HTTPRequest, HTTPBody?, ServerRequestMetadata) async throws -> (HTTPResponse, HTTPBody?)
    ) async throws -> (HTTPResponse, HTTPBody?) {
        do {
            return try await next(request, body, metadata)
        } catch let error as ServerError {
            if let failure = error.underlyingError as? APIFailure {
                return failure.response
            }
            guard (400..<500).contains(error.httpStatus.code) || Self.isDecoding(error.underlyingError) else {
                self.logger.error("the server API failed", metadata: ["operation": "\(operationID)", "error": "\(error.underlyingError)"])
                return APIFailure(status: 500, code: "internal", message: "the gateway failed to answer; see its log").response
            }
            let status = (400..<500).contains(error.httpStatus.code) ? error.httpStatus.code : 400
            return APIFailure(status: status, code: "invalid_argument", message: "\(error.causeDescription): \(error.underlyingError)")
                .response
        }
    }

    private static func isDecoding(_ error: any Error) -> Bool { error is DecodingError }
}

extension APIFailure {
    /// The JSON `Error` body.
    var json: String {
        struct Body: Encodable {
            var code: String
            var message: String
        }
        let data = (try? JSONEncoder().encode(Body(code: self.code, message: self.message))) ?? Data()
        return String(decoding: data, as: UTF8.self)
    }

    var response: (HTTPResponse, HTTPBody?) {
        (HTTPResponse(status: .init(code: self.status), headerFields: [.contentType: "application/json"]), HTTPBody(self.json))
    }
}
