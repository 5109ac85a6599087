public import Foundation
import TetherCore

/// What the application (or the server API) orders about a client id's connections: close
/// them, or change or end their credentials. In a cluster the order goes to every node
/// (``GatewayCluster/command(_:)``), and each carries it out on its own connections.
public enum ClientCommand: Sendable, Hashable {
    /// GOAWAY `maintenance` (the client connects again after `retryAfter`) or `revoked` (it
    /// stops connecting).
    case disconnect(client: String, reconnect: Bool, retryAfter: Duration, message: String)
    /// The credentials expire at this time (plus the grace period).
    case refreshCredentials(client: String, expiresAt: Date)
    /// GOAWAY `credentials expired` now: the client connects again with fresh credentials.
    case expireCredentials(client: String, message: String)

    /// The client id it is about.
    public var clientID: String {
        switch self {
        case .disconnect(let client, _, _, _), .refreshCredentials(let client, _), .expireCredentials(let client, _): client
        }
    }

    /// Carries it out on this node's connections of the client id, each on its event loop.
    /// - Returns: How many connections.
    func apply(to registry: ConnectionRegistry) -> Int {
        let apply: @Sendable (GatewayConnectionHandler) -> Void
        switch self {
        case .disconnect(_, let reconnect, let retryAfter, let message):
            let goAway = Frame.GoAway(
                reason: reconnect ? .maintenance : .revoked,
                retryAfter: retryAfter,
                message: message.isEmpty
                    ? (reconnect ? "the server disconnected this client" : "the server revoked this client's access") : message
            )
            apply = { $0.drain(goAway) }
        case .refreshCredentials(_, let expiresAt):
            apply = { $0.credentialsExpire(at: expiresAt) }
        case .expireCredentials(_, let message):
            let goAway = Frame.GoAway(
                reason: .credentialsExpired,
                message: message.isEmpty ? "the server ended this client's credentials; connect again with fresh ones" : message
            )
            apply = { $0.drain(goAway) }
        }
        var count = 0
        for group in registry.recipients(for: .client(self.clientID)) {
            count += group.handlers.count
            let handlers = group.handlers
            group.loop.execute {
                for handler in handlers { apply(handler.value) }
            }
        }
        return count
    }
}

extension Gateway {
    /// Closes every connection of a client id: each gets GOAWAY and is drained (its requests in
    /// flight are answered first), as in a shutdown. In a cluster, every node closes its own.
    ///
    /// ```swift
    /// gateway.disconnect(client: "mallory", reconnect: false, message: "banned")
    /// ```
    /// - Parameters:
    ///   - clientID: The client id.
    ///   - reconnect: Whether the client may connect again: GOAWAY `maintenance` (it reconnects
    ///     after `retryAfter`) or `revoked` (it stops connecting: a banned user; make sure its
    ///     credentials are refused too, or it can still connect by hand).
    ///   - retryAfter: How long the client waits before it connects again.
    ///   - message: What the client is told.
    /// - Returns: How many of this node's connections were sent GOAWAY (0 when the client is
    ///   not connected here; the other nodes of a cluster do not count theirs).
    @discardableResult
    public func disconnect(client clientID: String, reconnect: Bool, retryAfter: Duration = .zero, message: String = "") -> Int {
        self.command(.disconnect(client: clientID, reconnect: reconnect, retryAfter: retryAfter, message: message))
    }

    /// Sets when a client's credentials expire, on every connection of its client id: a
    /// backend that renewed the user's session extends them (the connections go on past the old
    /// expiry), one that cut it short brings the end closer. Once `expiresAt` plus
    /// ``GatewayConfiguration/Timeouts-swift.struct/credentialGrace`` has passed, a connection
    /// gets GOAWAY `credentials expired`, unless its client refreshed them first (PROTOCOL.md
    /// 5.1). Connections whose credentials did not expire get this expiry. In a cluster, every
    /// node sets it on its own connections.
    ///
    /// ```swift
    /// gateway.refreshCredentials(client: "alice", expiresAt: Date().addingTimeInterval(3600))
    /// ```
    /// - Returns: How many of this node's connections were changed.
    @discardableResult
    public func refreshCredentials(client clientID: String, expiresAt: Date) -> Int {
        self.command(.refreshCredentials(client: clientID, expiresAt: expiresAt))
    }

    /// Ends a client's credentials now: each connection of its client id gets GOAWAY
    /// `credentials expired` and is drained (requests in flight answered first). The client
    /// connects again with fresh credentials, which the authenticator checks, unlike
    /// ``disconnect(client:reconnect:retryAfter:message:)`` with `reconnect: false`, after
    /// which it stops connecting. In a cluster, every node ends its own.
    ///
    /// - Returns: How many of this node's connections were sent GOAWAY.
    @discardableResult
    public func expireCredentials(client clientID: String, message: String = "") -> Int {
        self.command(.expireCredentials(client: clientID, message: message))
    }

    /// Carries out `command` here, and sends it to the cluster's other nodes.
    private func command(_ command: ClientCommand) -> Int {
        self.cluster?.command(command)
        let count = command.apply(to: self.registry)
        if count > 0 {
            self.logger.info("a client command", metadata: ["command": "\(command)", "connections": "\(count)"])
        }
        return count
    }
}
