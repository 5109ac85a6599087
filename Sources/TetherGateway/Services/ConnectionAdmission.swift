import TetherCore
import TetherNIO
import TetherNIOTransports

/// Decides, as each connection is accepted, whether the gateway takes it: connections in all,
/// per source address, and before their handshake completed, and new connections per second
/// (each one a handshake to run), in all and per source address.
///
/// A refusal is cheap: the connection gets ERROR `resource exhausted` saying which limit (over
/// HTTP, `503` or `429` with `Retry-After`), and is closed; nothing is read from it.
///
/// Connections that carry an HTTP stream's POSTs count too (``Kind/posts``): against the
/// connections in all and per address and the rates, not against those waiting for a handshake.
final class ConnectionAdmission: Sendable {
    /// What an admitted connection is.
    enum Kind: Sendable, Hashable {
        /// A Tether connection: it counts as unauthenticated until its handshake completes.
        case tether
        /// A connection (or an HTTP/2 connection's streams) carrying an HTTP stream's POSTs.
        case posts
    }

    /// An admitted connection: what ``left(_:)`` gives back.
    struct Ticket: Sendable, Hashable {
        var address: String?
        /// Whether it no longer counts among the connections waiting for their handshake.
        var authenticated: Bool
    }

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
    private let state: TetherLock<State>
    /// While it is exhausted, every new connection is refused.
    private let budget: MemoryBudget?

    init(limits: Limits, now: TetherInstant, budget: MemoryBudget? = nil) {
        self.limits = limits
        self.budget = budget
        self.state = TetherLock(State(bucket: TokenBucket(perSecond: limits.handshakesPerSecond, now: now), lastSweep: now))
    }

    /// A connection from `address` was accepted.
    /// - Returns: Its ticket if it is admitted (it then counts until ``left(_:)``), or why not.
    func admit(_ address: String?, kind: Kind = .tether, now: TetherInstant) -> Result<Ticket, Refusal> {
        if let budget = self.budget, budget.isExhausted {
            return .failure(Self.refusal("memory", "the gateway's memory budget (\(budget.limit) bytes) is full"))
        }
        return self.state.withLockedValue { state -> Result<Ticket, Refusal> in
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
                return .failure(Self.refusal("connections", "the gateway holds its maximum of \(limits.connections) connections"))
            }
            if kind == .tether, state.unauthenticated >= limits.unauthenticated {
                return .failure(
                    Self.refusal("unauthenticated", "\(limits.unauthenticated) connections are already waiting for their handshake")
                )
            }
            if let address {
                var perAddress =
                    state.addresses[address]
                    ?? PerAddress(bucket: TokenBucket(perSecond: limits.handshakesPerSecondPerAddress, now: now))
                if perAddress.connections >= limits.connectionsPerAddress {
                    return .failure(
                        Self.refusal(
                            "connections_per_address",
                            "\(address) holds its maximum of \(limits.connectionsPerAddress) connections"
                        )
                    )
                }
                let took = perAddress.bucket.take(now: now)
                state.addresses[address] = perAddress  // a token taken counts even if the global rate refuses
                guard took else {
                    return .failure(
                        Self.refusal(
                            "handshake_rate_per_address",
                            "more than \(limits.handshakesPerSecondPerAddress) new connections per second from \(address)"
                        )
                    )
                }
            }
            guard state.bucket.take(now: now) else {
                return .failure(Self.refusal("handshake_rate", "more than \(limits.handshakesPerSecond) new connections per second"))
            }
            state.connections += 1
            if kind == .tether { state.unauthenticated += 1 }
            if let address { state.addresses[address]?.connections += 1 }
            return .success(Ticket(address: address, authenticated: kind == .posts))
        }
    }

    /// Takes one of `address`'s new-connection tokens without a connection: what an HTTP/2
    /// client that resets or makes refused streams pays for each, so that a flood of them is
    /// paced like a flood of connections.
    /// - Returns: Whether a token was left; `false`: the address is over its rate.
    func charge(_ address: String?, now: TetherInstant) -> Bool {
        guard let address else { return true }
        return self.state.withLockedValue { state in
            let limits = self.limits
            var perAddress =
                state.addresses[address] ?? PerAddress(bucket: TokenBucket(perSecond: limits.handshakesPerSecondPerAddress, now: now))
            let took = perAddress.bucket.take(now: now)
            state.addresses[address] = perAddress
            return took
        }
    }

    /// Whether `address` has used up its rate of new connections now (its resets, over HTTP/2,
    /// count too): its next connection would be refused. Takes nothing.
    func isOverRate(_ address: String?, now: TetherInstant) -> Bool {
        guard let address else { return false }
        return self.state.withLockedValue { state in
            guard var perAddress = state.addresses[address] else { return false }
            defer { state.addresses[address] = perAddress }
            return perAddress.bucket.available(now: now) < 1
        }
    }

    /// An admitted connection completed its handshake.
    func authenticated(_ ticket: inout Ticket) {
        guard !ticket.authenticated else { return }
        ticket.authenticated = true
        self.state.withLockedValue { $0.unauthenticated -= 1 }
    }

    /// An admitted connection closed.
    func left(_ ticket: Ticket) {
        self.state.withLockedValue { state in
            state.connections -= 1
            if !ticket.authenticated { state.unauthenticated -= 1 }
            // The address stays (with its rate) until a sweep finds it idle and refilled.
            guard let address = ticket.address else { return }
            state.addresses[address]?.connections -= 1
        }
    }

    /// The connections admitted and not closed: in all, and before their handshake completed.
    var counts: (connections: Int, unauthenticated: Int) {
        self.state.withLockedValue { ($0.connections, $0.unauthenticated) }
    }

    /// Why a connection is refused: the ERROR it gets, and the limit (a metric label).
    struct Refusal: Error, Hashable {
        var report: Frame.ErrorReport
        /// `connections`, `unauthenticated`, `connections_per_address`, `handshake_rate`,
        /// `handshake_rate_per_address`, `memory`.
        var limit: String

        /// Whether a rate refused it (HTTP `429`), rather than a count (`503`).
        var isRate: Bool { self.limit.hasPrefix("handshake_rate") }

        /// When the client may try again: a rate's token comes back within a second; a count
        /// frees as connections end.
        var retryAfter: Duration { self.isRate ? .seconds(1) : .seconds(5) }

        /// The refusal as an HTTP answer: `429` for a rate, `503` for a count.
        var http: HTTPRefusal {
            HTTPRefusal(
                status: self.isRate ? .tooManyRequests : .serviceUnavailable,
                message: self.report.message,
                retryAfter: self.retryAfter
            )
        }
    }

    private static func refusal(_ limit: String, _ reason: String) -> Refusal {
        Refusal(
            report: Frame.ErrorReport(code: .resourceExhausted, message: "connection refused: \(reason); try again later"),
            limit: limit
        )
    }
}
