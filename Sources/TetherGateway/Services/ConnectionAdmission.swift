import NIOConcurrencyHelpers
import TetherCore

/// Decides, as each connection is accepted, whether the gateway takes it: connections in all,
/// per source address, and before their handshake completed, and new connections per second
/// (each one a handshake to run), in all and per source address.
///
/// A refusal is cheap: the connection gets ERROR `resource exhausted` saying which limit, and
/// is closed; nothing is read from it.
final class ConnectionAdmission: Sendable {
    struct Limits: Sendable {
        var connections: Int
        var connectionsPerAddress: Int
        var unauthenticated: Int
        var handshakesPerSecond: Int
        var handshakesPerSecondPerAddress: Int
    }

    private struct PerAddress {
        var connections = 0
        var bucket: TokenBucket
    }

    private struct State {
        var connections = 0
        var unauthenticated = 0
        var bucket: TokenBucket
        /// Addresses with connections, or whose rate has not refilled yet.
        var addresses: [String: PerAddress] = [:]
        var lastSweep: TetherInstant
    }

    let limits: Limits
    private let state: NIOLockedValueBox<State>

    init(limits: Limits, now: TetherInstant) {
        self.limits = limits
        self.state = NIOLockedValueBox(State(bucket: TokenBucket(perSecond: limits.handshakesPerSecond, now: now), lastSweep: now))
    }

    /// A connection from `address` was accepted.
    /// - Returns: `nil` if it is admitted (it then counts until ``left(_:authenticated:)``),
    ///   or why not.
    func admit(_ address: String?, now: TetherInstant) -> Refusal? {
        self.state.withLockedValue { state -> Refusal? in
            let limits = self.limits
            // Once a second, forget the addresses with no connection whose rate has refilled.
            if now - state.lastSweep >= .seconds(1) {
                state.lastSweep = now
                state.addresses = state.addresses.filter { entry in
                    var bucket = entry.value.bucket
                    return entry.value.connections > 0 || !bucket.isFull(now: now)
                }
            }
            if state.connections >= limits.connections {
                return Self.refusal("connections", "the gateway holds its maximum of \(limits.connections) connections")
            }
            if state.unauthenticated >= limits.unauthenticated {
                return Self.refusal("unauthenticated", "\(limits.unauthenticated) connections are already waiting for their handshake")
            }
            if let address {
                var perAddress =
                    state.addresses[address]
                    ?? PerAddress(bucket: TokenBucket(perSecond: limits.handshakesPerSecondPerAddress, now: now))
                if perAddress.connections >= limits.connectionsPerAddress {
                    return Self.refusal(
                        "connections_per_address",
                        "\(address) holds its maximum of \(limits.connectionsPerAddress) connections"
                    )
                }
                let took = perAddress.bucket.take(now: now)
                state.addresses[address] = perAddress  // a token taken counts even if the global rate refuses
                guard took else {
                    return Self.refusal(
                        "handshake_rate_per_address",
                        "more than \(limits.handshakesPerSecondPerAddress) new connections per second from \(address)"
                    )
                }
            }
            guard state.bucket.take(now: now) else {
                return Self.refusal("handshake_rate", "more than \(limits.handshakesPerSecond) new connections per second")
            }
            state.connections += 1
            state.unauthenticated += 1
            if let address { state.addresses[address]?.connections += 1 }
            return nil
        }
    }

    /// An admitted connection completed its handshake.
    func authenticated() {
        self.state.withLockedValue { $0.unauthenticated -= 1 }
    }

    /// An admitted connection closed.
    func left(_ address: String?, authenticated: Bool) {
        self.state.withLockedValue { state in
            state.connections -= 1
            if !authenticated { state.unauthenticated -= 1 }
            // The address stays (with its rate) until a sweep finds it idle and refilled.
            guard let address else { return }
            state.addresses[address]?.connections -= 1
        }
    }

    /// The connections admitted and not closed: in all, and before their handshake completed.
    var counts: (connections: Int, unauthenticated: Int) {
        self.state.withLockedValue { ($0.connections, $0.unauthenticated) }
    }

    /// Why a connection is refused: the ERROR it gets, and the limit (a metric label).
    struct Refusal: Sendable, Hashable {
        var report: Frame.ErrorReport
        /// `connections`, `unauthenticated`, `connections_per_address`, `handshake_rate`,
        /// `handshake_rate_per_address`.
        var limit: String
    }

    private static func refusal(_ limit: String, _ reason: String) -> Refusal {
        Refusal(
            report: Frame.ErrorReport(code: .resourceExhausted, message: "connection refused: \(reason); try again later"),
            limit: limit
        )
    }
}
