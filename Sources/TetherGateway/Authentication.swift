public import Foundation
public import TetherCore

/// Checks the credentials a client sends in HELLO, and says who the client is.
///
/// The gateway calls it once per handshake, before WELCOME. ``JWTAuthenticator`` (module
/// `TetherJWT`) checks JSON Web Tokens; implement the protocol for another scheme, or pass a
/// closure to ``Gateway/init(configuration:eventLoopGroup:messageStore:authenticate:logger:)``.
///
/// ```swift
/// struct APIKeys: ClientAuthenticator {
///     let owners: [String: String]  // key → client id
///     func authenticate(_ hello: HandshakeInfo) async throws -> ClientIdentity {
///         guard let key = hello.authToken.map(String.init(buffer:)), let owner = self.owners[key] else {
///             throw AuthenticationError(.unauthenticated, "unknown API key")
///         }
///         return ClientIdentity(clientID: owner)
///     }
/// }
/// ```
public protocol ClientAuthenticator: Sendable {
    /// Checks a HELLO's credentials.
    /// - Parameter hello: The client id the client claims, its token, user agent and address.
    /// - Returns: The identity the credentials prove. Its client id must be the one the HELLO
    ///   claims: the gateway refuses the client with `permission denied` otherwise.
    /// - Throws: ``AuthenticationError`` to refuse with its status and message; any other error
    ///   refuses with `unauthenticated` and a generic message (the error is logged).
    func authenticate(_ hello: HandshakeInfo) async throws -> ClientIdentity
}

/// Who a client proved to be, and what its credentials allow.
public struct ClientIdentity: Sendable, Hashable {
    /// The client id the credentials belong to.
    public var clientID: String
    /// When the credentials stop being valid, if they do. The gateway closes the connection
    /// with GOAWAY `credentials expired` once this time plus
    /// ``GatewayConfiguration/Timeouts-swift.struct/credentialGrace`` has passed.
    public var expiresAt: Date?
    /// The rooms the client may be joined to; `nil` allows every room.
    public var rooms: Set<String>?
    /// The request methods the client may call and the message topics it may send; `nil`
    /// allows all of them.
    public var topics: Set<String>?
    /// The channels the client may subscribe to and publish to (names, or prefixes ending in
    /// `*`); `nil` allows every channel.
    public var channels: [ChannelPattern]?
    /// Further facts from the credentials (roles, a tenant, …) for the handlers.
    public var attributes: [String: String]
    /// What the client shows others in the presence of the channels it subscribes to (a
    /// display name, an avatar's URL, JSON…): a JWT's `info` claim. `nil`: nothing.
    public var info: String?

    public init(
        clientID: String,
        expiresAt: Date? = nil,
        rooms: Set<String>? = nil,
        topics: Set<String>? = nil,
        channels: [ChannelPattern]? = nil,
        attributes: [String: String] = [:],
        info: String? = nil
    ) {
        self.clientID = clientID
        self.expiresAt = expiresAt
        self.rooms = rooms
        self.topics = topics
        self.channels = channels
        self.attributes = attributes
        self.info = info
    }

    /// Whether the client may call `method` or send a message on topic `method`.
    public func allows(topic method: String) -> Bool { self.topics?.contains(method) ?? true }

    /// Whether the client may be joined to `room`.
    public func allows(room: String) -> Bool { self.rooms?.contains(room) ?? true }

    /// Whether the client may subscribe to `channel`.
    public func allows(channel: String) -> Bool { self.channels?.contains { $0.matches(channel) } ?? true }

    /// Whether the credentials allow `access`.
    public func allows(_ access: Access) -> Bool {
        switch access {
        case .request(let method): self.allows(topic: method)
        case .send(let topic): self.allows(topic: topic)
        case .join(let room): self.allows(room: room)
        case .subscribe(let channel), .publish(let channel), .presence(let channel): self.allows(channel: channel)
        }
    }

    /// Whether the credentials restrict anything (then every access is checked).
    var restricts: Bool { self.rooms != nil || self.topics != nil || self.channels != nil }
}

/// What a client asks the gateway to do, for its authorization checks: the client's
/// ``ClientIdentity`` (its credentials' `rooms` and `topics`), then the gateway's
/// ``Gateway/authorize(_:)`` hook.
public enum Access: Sendable, Hashable {
    /// Call a request method.
    case request(method: String)
    /// Send a reliable message on a topic.
    case send(topic: String)
    /// Be joined to a room (by a handler, ``RequestContext/join(_:)``, or ``Gateway/join(room:connection:)``).
    case join(room: String)
    /// Subscribe to a channel (a SUBSCRIBE; refused with SUBSCRIBED `permission denied`), or
    /// read its history.
    case subscribe(channel: String)
    /// Publish to a channel (`client.publish`), where the channel's rule lets clients publish
    /// (``GatewayConfiguration/Channels-swift.struct/Rule/clientsMayPublish``).
    case publish(channel: String)
    /// See who is subscribed to a channel (`client.presence(of:)`), where the channel's rule
    /// keeps presence (``GatewayConfiguration/Channels-swift.struct/Rule/presence``).
    case presence(channel: String)
}

/// Why an authenticator refuses a client: the status and message the client gets in ERROR.
public struct AuthenticationError: Error, Sendable, Hashable, CustomStringConvertible {
    /// ``StatusCode/unauthenticated`` (missing, malformed, expired or badly signed credentials)
    /// or ``StatusCode/permissionDenied`` (valid credentials that do not allow this).
    public var status: StatusCode
    /// What the client is told.
    public var message: String

    public init(_ status: StatusCode, _ message: String) {
        self.status = status
        self.message = message
    }

    public var description: String { "\(self.status): \(self.message)" }
}

/// The closure form of an authenticator: it accepts the claimed client id, for ever.
struct ClosureAuthenticator: ClientAuthenticator {
    let check: Gateway.Authenticator

    func authenticate(_ hello: HandshakeInfo) async throws -> ClientIdentity {
        do {
            try await self.check(hello)
        } catch let error as RequestError {
            throw AuthenticationError(.unauthenticated, error.message)
        }
        return ClientIdentity(clientID: hello.clientID)
    }
}
