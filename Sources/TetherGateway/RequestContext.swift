public import Logging
public import NIOCore
public import TetherCore
public import X509

/// A client connection as the gateway's application code sees it.
public struct ConnectionInfo: Sendable, Hashable {
    /// The gateway's id of the connection (sent to the client in WELCOME).
    public var id: UInt64
    /// The identity the client presented in HELLO.
    public var clientID: String
    /// The client software, as it described itself.
    public var userAgent: String?
    /// The peer's address, if the transport has one.
    public var remoteAddress: String?
    /// What the gateway's authenticator proved about the client; `nil` without one.
    public var identity: ClientIdentity?

    public init(id: UInt64, clientID: String, userAgent: String? = nil, remoteAddress: String? = nil, identity: ClientIdentity? = nil) {
        self.id = id
        self.clientID = clientID
        self.userAgent = userAgent
        self.remoteAddress = remoteAddress
        self.identity = identity
    }
}

/// Who a push goes to.
public enum PushTarget: Sendable, Hashable {
    /// One connection.
    case connection(UInt64)
    /// Every connection of a client id (a user logged in on several devices, say).
    case client(String)
    /// Every member of a room.
    case room(String)
    /// Every established connection.
    case all
}

/// A request as a handler receives it.
public struct GatewayRequest: Sendable {
    /// The method the client called.
    public var method: String
    /// The request's content.
    public var body: ByteBuffer
    /// The client's request id (unique among its requests in flight).
    public var id: UInt64
    /// The time the handler has before the gateway answers `deadline exceeded`.
    public var timeout: Duration
    /// The trace context the client sent with the request (W3C `traceparent`, `tracestate`),
    /// if it negotiated trace context: what a handler forwards to the services it calls.
    public var traceContext: TraceContext?
}

/// What every request of one connection shares in its ``RequestContext``: made once per
/// connection, so that a request's context costs one reference, not a copy of each field.
final class ConnectionScope: Sendable {
    let connection: ConnectionInfo
    /// The gateway's logger, or the one a handler set; ``logger`` adds the connection's id to
    /// the gateway's when it is used, so that an idle connection holds no copy of it.
    private let storedLogger: Logger
    /// Whether ``storedLogger`` is one a handler set (used as it is).
    private let customLogger: Bool
    /// What the context's capabilities (pushes, rooms) use; never the ``Gateway``.
    let services: GatewayServices
    /// Whether the connection's requests must pass the authorization check.
    let checksAccess: Bool

    /// - Parameter logger: The gateway's logger (the connection's id is added when it is used),
    ///   or with `customLogger`, a logger to use as it is.
    init(connection: ConnectionInfo, logger: Logger, customLogger: Bool = false, services: GatewayServices, checksAccess: Bool = false) {
        self.connection = connection
        self.storedLogger = logger
        self.customLogger = customLogger
        self.services = services
        self.checksAccess = checksAccess
    }

    /// The connection's logger.
    var logger: Logger {
        guard !self.customLogger else { return self.storedLogger }
        var logger = self.storedLogger
        logger[metadataKey: "tether.connection"] = "\(self.connection.id)"
        return logger
    }

    func replacing(connection: ConnectionInfo? = nil, logger: Logger? = nil) -> ConnectionScope {
        ConnectionScope(
            connection: connection ?? self.connection,
            logger: logger ?? self.storedLogger,
            customLogger: logger != nil || self.customLogger,
            services: self.services,
            checksAccess: self.checksAccess
        )
    }
}

/// What a request handler knows about its request's connection, and what it may do: who the
/// caller is, when the answer is due, pushes, and rooms.
///
/// ```swift
/// gateway.handle("room.join") { request, context in
///     let room = String(buffer: request.body)
///     guard context.join(room) else { throw RequestError(.permissionDenied, "not allowed in \(room)") }
///     try context.push("room.joined", ByteBuffer(string: context.connection.clientID), to: .room(room))
///     return ByteBuffer(string: "\(context.members(of: room).count) online")
/// }
/// ```
public struct RequestContext: Sendable {
    /// The connection's info, logger and services.
    private var scope: ConnectionScope
    /// The request's id and method, or `nil` once ``logger`` was replaced.
    private var request: (id: UInt64, method: String)?
    /// When the gateway answers `deadline exceeded` if the handler has not answered, on the
    /// gateway's clock (``Gateway/clock``).
    public let deadline: TetherInstant

    init(scope: ConnectionScope, request: (id: UInt64, method: String), deadline: TetherInstant) {
        self.scope = scope
        self.request = request
        self.deadline = deadline
    }

    /// The connection the request came on: who the caller is (its client id and the identity
    /// its credentials proved).
    public var connection: ConnectionInfo {
        get { self.scope.connection }
        set { self.scope = self.scope.replacing(connection: newValue) }
    }

    /// A logger carrying the connection and request ids, and the method. The request's metadata
    /// is added when it is read, so a handler that does not log costs nothing.
    public var logger: Logger {
        get {
            var logger = self.scope.logger
            if let request = self.request {
                logger[metadataKey: "tether.request"] = "\(request.id)"
                logger[metadataKey: "tether.method"] = "\(request.method)"
            }
            return logger
        }
        set {
            self.scope = self.scope.replacing(logger: newValue)
            self.request = nil
        }
    }

    /// Pushes a message to the connections `target` names (see ``Gateway/push(_:_:to:)``).
    /// - Returns: The number of connections the push was sent to.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for a bad topic.
    @discardableResult
    public func push(_ topic: String, _ body: ByteBuffer, to target: PushTarget) throws(GatewayError) -> Int {
        try self.scope.services.pushes.push(topic, body, to: target)
    }

    /// Pushes a message to this connection.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for a bad topic.
    public func push(_ topic: String, _ body: ByteBuffer) throws(GatewayError) {
        try self.push(topic, body, to: .connection(self.connection.id))
    }

    /// Publishes to a channel (see ``Gateway/publish(_:toChannel:publisher:)``).
    /// - Parameter publisher: Who published it, as subscribers see it; by default this
    ///   connection's client id.
    /// - Returns: The publication's position in the channel.
    @discardableResult
    public func publish(
        _ body: ByteBuffer,
        toChannel channel: String,
        publisher: String? = nil
    ) async throws(GatewayError) -> ChannelPosition {
        try await self.scope.services.pushes.publish(body, to: channel, publisher: publisher ?? self.connection.clientID).0
    }

    /// Puts this connection in `room`; it receives the room's pushes until it leaves or closes.
    /// - Returns: `false` if the client may not be in that room (its credentials' rooms, or
    ///   the gateway's ``Gateway/authorize(_:)`` hook), or the connection closed.
    @discardableResult
    public func join(_ room: String) -> Bool {
        let services = self.scope.services
        return Rooms.join(room, connection: self.connection.id, registry: services.registry, router: services.router)
    }

    /// Takes this connection out of `room`.
    public func leave(_ room: String) {
        self.scope.services.registry.leave(room, connection: self.connection.id)
    }

    /// The connections in `room`.
    public func members(of room: String) -> [ConnectionInfo] {
        self.scope.services.registry.members(of: room)
    }
}

/// The error a handler throws to answer with a specific status.
///
/// ```swift
/// gateway.handle("room.enter") { request, context in
///     guard let room = String(buffer: request.body).nonEmpty else {
///         throw RequestError(.invalidRequest, "a room name is required")
///     }
///     ...
/// }
/// ```
/// Any other error a handler throws becomes ``StatusCode/internalError``.
public struct RequestError: Error, Sendable, Hashable, CustomStringConvertible {
    /// The status sent in the RESPONSE; not ``StatusCode/ok``.
    public var status: StatusCode
    /// The message sent to the client.
    public var message: String

    public init(_ status: StatusCode, _ message: String) {
        self.status = status
        self.message = message
    }

    public var description: String { "\(self.status): \(self.message)" }
}

/// The HELLO's credentials, for the gateway's authenticator.
public struct HandshakeInfo: Sendable {
    /// The identity the client claims.
    public var clientID: String
    /// The client's credential, if it sent one.
    public var authToken: ByteBuffer?
    /// The client software.
    public var userAgent: String?
    /// The peer's address, if the transport has one.
    public var remoteAddress: String?
    /// The certificate the client presented in the TLS handshake, already verified against
    /// ``GatewayConfiguration/TLS-swift.struct/ClientCertificates-swift.enum``'s roots (mutual
    /// TLS); `nil` without TLS or without one. Its subject and alternative names say who the
    /// client is.
    public var clientCertificate: Certificate?

    public init(clientID: String, authToken: ByteBuffer?, userAgent: String?, remoteAddress: String?, clientCertificate: Certificate? = nil)
    {
        self.clientID = clientID
        self.authToken = authToken
        self.userAgent = userAgent
        self.remoteAddress = remoteAddress
        self.clientCertificate = clientCertificate
    }
}
