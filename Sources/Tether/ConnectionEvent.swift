public import TetherCore

/// A change in the client's connection, published on ``TetherClient/events``.
///
/// ```swift
/// for await event in client.events {
///     if case .disconnected(let reason) = event { banner.show("Reconnecting… (\(reason))") }
///     if case .connected = event { banner.hide() }
/// }
/// ```
public enum ConnectionEvent: Sendable, CustomStringConvertible {
    /// A connection attempt starts. `attempt` counts the failed attempts since the last
    /// stable connection, plus one.
    case connecting(Endpoint, attempt: Int)
    /// The handshake completed; requests flow.
    case connected(Endpoint, version: UInt8, connectionID: UInt64)
    /// An attempt failed before the connection was established.
    case connectFailed(Endpoint, TetherError)
    /// A connection to this endpoint failed (refused, timed out, TLS or the WebSocket upgrade
    /// or the proxy failed) while another endpoint connected on the same network: the network
    /// blocks this one (its port or its transport), the device is not offline. Reported just
    /// before ``connected(_:version:connectionID:)``; the per-network memory starts there next
    /// time.
    case endpointBlocked(Endpoint, TetherError)
    /// The established connection closed.
    case disconnected(DisconnectReason)
    /// The client waits this long before its next attempt.
    case backingOff(Duration, next: Endpoint)
    /// The network-path monitor reports no network: the client waits for one, then connects at once.
    case waitingForNetwork(next: Endpoint)
    /// The client gave up (attempt limit reached); it no longer connects.
    case failed(TetherError)
    /// Something crossed a threshold of ``ClientConfiguration/alerts``: the link flaps, the
    /// heartbeat keeps losing the connection, or round trips are slow. Raised once per episode.
    case alert(ClientAlert)

    public var description: String {
        switch self {
        case .connecting(let endpoint, let attempt): "connecting to \(endpoint) (attempt \(attempt))"
        case .connected(let endpoint, let version, let id): "connected to \(endpoint) (protocol v\(version), connection \(id))"
        case .connectFailed(let endpoint, let error): "could not connect to \(endpoint): \(error)"
        case .endpointBlocked(let endpoint, let error): "\(endpoint) is blocked on this network: \(error)"
        case .disconnected(let reason): "disconnected: \(reason)"
        case .backingOff(let delay, let next): "retrying \(next) in \(delay.shortDescription)"
        case .waitingForNetwork(let next): "waiting for a network before connecting to \(next)"
        case .failed(let error): "failed: \(error)"
        case .alert(let alert): "alert: \(alert)"
        }
    }
}

/// A snapshot of the client's connection state (see ``TetherClient/connectionState``).
public enum ConnectionState: Hashable, Sendable, CustomStringConvertible {
    /// ``TetherClient/run()`` has not started yet.
    case idle
    case connecting(Endpoint)
    case connected(Endpoint)
    /// The gateway sent GOAWAY; requests in flight finish, new ones wait for the next connection.
    case draining(Endpoint)
    case backingOff(next: Endpoint)
    /// No network: the client connects as soon as one is reported.
    case waitingForNetwork(next: Endpoint)
    /// The client gave up after too many failed attempts.
    case failed
    case shutDown

    init(_ state: ConnectivityStateMachine.State) {
        switch state {
        case .idle: self = .idle
        case .connecting(let endpoint, _): self = .connecting(endpoint)
        case .connected(let endpoint): self = .connected(endpoint)
        case .draining(let endpoint): self = .draining(endpoint)
        case .backingOff(_, let next): self = .backingOff(next: next)
        case .waitingForPath(let next): self = .waitingForNetwork(next: next)
        case .failed: self = .failed
        case .shutDown: self = .shutDown
        }
    }

    public var description: String {
        switch self {
        case .idle: "idle"
        case .connecting(let endpoint): "connecting to \(endpoint)"
        case .connected(let endpoint): "connected to \(endpoint)"
        case .draining(let endpoint): "draining \(endpoint)"
        case .backingOff(let next): "backing off before \(next)"
        case .waitingForNetwork(let next): "waiting for a network before \(next)"
        case .failed: "failed"
        case .shutDown: "shut down"
        }
    }
}
