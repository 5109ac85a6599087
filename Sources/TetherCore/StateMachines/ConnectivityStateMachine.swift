/// The client's connection lifecycle across reconnects: which endpoint to try next, when to
/// back off, when to give up.
///
/// The machine performs no I/O and reads no clock. Its driver (the client's run loop) reports
/// what happened and performs the returned ``Action``: connect, sleep, close, stop.
///
/// ```
///        start                 connectSucceeded
///  idle ───────▶ connecting ─────────────────────▶ connected ──goAway──▶ draining
///                 ▲  │ connectFailed                 │ connectionClosed      │ connectionClosed
///                 │  ▼ (all endpoints tried)         ▼                       ▼
///                 └── backingOff ◀────────────────────┴───────────────────────┘
///  any state ──shutdown──▶ shutDown;   too many failures ──▶ failed
/// ```
///
/// - Endpoints are tried in turn; only after every endpoint failed once does the machine back
///   off, exponentially per failed round (see ``Backoff``).
/// - A connection that lived at least `stableAfter` resets the failure count; one that dropped
///   sooner counts as a failed attempt, so a gateway that accepts and immediately closes
///   cannot cause a tight reconnect loop.
/// - After a stable connection drops, the first reconnect waits a random delay between zero
///   and the initial backoff, which spreads the reconnects of many clients.
/// - GOAWAY's retry-after and alternate endpoint are honoured once the connection closes.
/// - The endpoint that worked is remembered per network (the path's identity): back on a
///   network, attempts start there; on a network not seen before, at the top of the list.
/// - Network path (``pathChanged(_:)``): while no network is available the machine waits for
///   one instead of backing off; when one comes back it connects at once, with the backoff
///   reset; when the path changes under an established connection, it closes it and
///   reconnects at once.
package struct ConnectivityStateMachine: Sendable {
    /// The machine's fixed inputs.
    package struct Configuration: Sendable, Hashable {
        /// The endpoints, in order of preference; at least one.
        package var endpoints: [Endpoint]
        /// Delays between failed attempts.
        package var backoff: Backoff
        /// A connection that lasts this long counts as stable and resets the failure count.
        package var stableAfter: Duration

        package init(endpoints: [Endpoint], backoff: Backoff, stableAfter: Duration) {
            precondition(!endpoints.isEmpty, "at least one endpoint is required")
            self.endpoints = endpoints
            self.backoff = backoff
            self.stableAfter = stableAfter
        }
    }

    /// Where the client is in its lifecycle.
    package enum State: Hashable, Sendable {
        case idle
        case connecting(Endpoint, attempt: Int)
        case connected(Endpoint)
        case draining(Endpoint)
        case backingOff(Duration, next: Endpoint)
        /// No network: waiting for ``ConnectivityStateMachine/pathChanged(_:)`` to report one.
        case waitingForPath(next: Endpoint)
        case failed(attempts: Int)
        case shutDown
    }

    /// What the driver's run loop does next.
    package enum Action: Hashable, Sendable {
        /// Open a connection to the endpoint and complete the handshake.
        case connect(Endpoint, attempt: Int)
        /// Wait this long, then report ``ConnectivityStateMachine/backoffElapsed()``.
        case backOff(Duration, next: Endpoint)
        /// Wait until ``ConnectivityStateMachine/pathChanged(_:)`` returns what to do.
        case waitForPath(next: Endpoint)
        /// Give up: the attempt limit was reached.
        case fail(attempts: Int)
        /// Give up: the gateway revoked the client's access (GOAWAY `revoked`); connecting again
        /// with the same credentials would be refused.
        case revoked
        /// Stop: the client is shut down.
        case stop
    }

    /// What the driver does with a connection that just completed its handshake.
    package enum ConnectedAction: Hashable, Sendable {
        /// Serve it: it is the client's connection now.
        case serve
        /// Close it: the client shut down while it was connecting.
        case closeConnection
    }

    /// What the driver does when the network path changed.
    package enum PathAction: Hashable, Sendable {
        /// Nothing.
        case none
        /// Connect now: a network came back while the run loop waited (for a path, or in a
        /// backoff, whose rest is skipped).
        case connect(Endpoint, attempt: Int)
        /// Close the established connection (the network changed under it);
        /// ``ConnectivityStateMachine/connectionClosed(uptime:)`` then reconnects at once.
        case closeConnection
    }

    /// What the driver does when the client shuts down.
    package enum ShutdownAction: Hashable, Sendable {
        /// Nothing: it was shut down already.
        case none
        /// Close the current connection once its requests are answered; the run loop stops
        /// when it has closed.
        case closeConnection
        /// Stop the run loop (nothing is connected; an attempt in progress ends by itself).
        case stop
    }

    package private(set) var state: State = .idle
    private let configuration: Configuration
    private var generator: SplitMix64
    /// Index of the endpoint that worked last, where the next round starts.
    private var preferredIndex = 0
    /// The endpoint that worked last on each network (by the path monitor's identity): where
    /// attempts start when the client is on that network again. A network not seen before
    /// starts at the top of the list. At most ``rememberedNetworks`` are kept, the oldest
    /// forgotten first.
    private var preferredByNetwork: [String: Int] = [:]
    private var networksInOrder: [String] = []
    package static let rememberedNetworks = 32
    /// Failed attempts since the last stable connection.
    private var consecutiveFailures = 0
    /// Rounds, since the last stable connection, in which every endpoint failed.
    private var failedRounds = 0
    /// Attempts at endpoints of the list since the last backoff.
    private var triedInRound = 0
    /// GOAWAY's instructions, applied when the draining connection closes.
    private var goAway: (retryAfter: Duration, alternate: Endpoint?, revoked: Bool)?
    /// The last network path reported; `nil` until a monitor reports one (assumed available).
    package private(set) var path: NetworkPath?
    /// The connection is closing because the path changed: reconnect without delay.
    private var reconnectAtOnce = false

    /// Creates a machine in the idle state.
    /// - Parameters:
    ///   - configuration: Endpoints, backoff and stability threshold.
    ///   - generator: The source of jitter; fix its seed in tests.
    package init(configuration: Configuration, generator: SplitMix64 = SplitMix64()) {
        self.configuration = configuration
        self.generator = generator
    }

    /// The number of failed attempts since the last stable connection.
    package var failures: Int { self.consecutiveFailures }

    /// The client starts.
    package mutating func start() -> Action {
        switch self.state {
        case .idle:
            return self.connect(to: self.preferredEndpoint)
        case .shutDown:
            return .stop
        case .connecting, .connected, .draining, .backingOff, .waitingForPath, .failed:
            preconditionFailure("start in state \(self.state): the client starts once")
        }
    }

    /// The connection attempt succeeded, including the handshake.
    /// - Parameter winner: The endpoint that answered, if the attempt raced several.
    package mutating func connectSucceeded(via winner: Endpoint? = nil) -> ConnectedAction {
        switch self.state {
        case .connecting(let attempted, _):
            let endpoint = winner ?? attempted
            if let index = self.configuration.endpoints.firstIndex(of: endpoint) {
                self.preferredIndex = index
                self.remember(index)
            }
            self.triedInRound = 0
            self.state = .connected(endpoint)
            return .serve
        case .shutDown:
            return .closeConnection
        case .idle, .connected, .draining, .backingOff, .waitingForPath, .failed:
            preconditionFailure("connectSucceeded in state \(self.state): only an attempt succeeds")
        }
    }

    /// The connection attempt failed (refused, timed out, or the handshake failed).
    /// - Parameter elapsed: How long the attempt took. Backoff delays count from the start of
    ///   the attempt: one that timed out after 5 s already spaced the attempts by 5 s.
    package mutating func connectFailed(after elapsed: Duration = .zero) -> Action {
        switch self.state {
        case .connecting(let endpoint, _):
            if self.offline {
                // No network: not the endpoint's fault, and no point trying the others.
                return self.waitForPath(next: endpoint)
            }
            self.consecutiveFailures += 1
            if let limit = self.configuration.backoff.maxAttempts, self.consecutiveFailures >= limit {
                self.state = .failed(attempts: self.consecutiveFailures)
                return .fail(attempts: self.consecutiveFailures)
            }
            let endpoints = self.configuration.endpoints
            guard let index = endpoints.firstIndex(of: endpoint) else {
                // A GOAWAY alternate failed: fall back to the list at once.
                return self.connect(to: self.preferredEndpoint)
            }
            self.triedInRound += 1
            let next = endpoints[(index + 1) % endpoints.count]
            if self.triedInRound < endpoints.count {
                return self.connect(to: next)
            }
            self.triedInRound = 0
            self.failedRounds += 1
            let delay = self.configuration.backoff.delay(forAttempt: self.failedRounds, random: self.generator.nextUnit())
            return self.backOff(max(.zero, delay - elapsed), next: next)
        case .shutDown:
            return .stop
        case .idle, .connected, .draining, .backingOff, .waitingForPath, .failed:
            preconditionFailure("connectFailed in state \(self.state): only an attempt fails")
        }
    }

    /// The gateway sent GOAWAY on the established connection.
    /// - Parameters:
    ///   - retryAfter: How long to wait after the connection closed before connecting again.
    ///   - alternate: Where to connect next, if the gateway named a place.
    ///   - revoked: The gateway revoked the client's access: it does not connect again once the
    ///     connection closed (``Action/revoked``).
    /// - Returns: Whether to stop sending new requests on the connection (it was the one in use).
    package mutating func goAwayReceived(retryAfter: Duration, alternate: Endpoint?, revoked: Bool = false) -> Bool {
        switch self.state {
        case .connected(let endpoint):
            self.goAway = (retryAfter, alternate, revoked)
            self.state = .draining(endpoint)
            return true
        case .draining:
            self.goAway = (retryAfter, alternate, revoked || self.goAway?.revoked == true)
            return false
        case .idle, .connecting, .backingOff, .waitingForPath, .failed, .shutDown:
            return false
        }
    }

    /// The established connection closed.
    /// - Parameter uptime: How long the connection was established.
    package mutating func connectionClosed(uptime: Duration) -> Action {
        let endpoint: Endpoint
        switch self.state {
        case .connected(let current), .draining(let current):
            endpoint = current
        case .shutDown:
            return .stop
        case .idle, .connecting, .backingOff, .waitingForPath, .failed:
            preconditionFailure("connectionClosed in state \(self.state): no connection was established")
        }

        if self.goAway?.revoked == true {
            self.goAway = nil
            self.state = .failed(attempts: 0)
            return .revoked
        }
        let wasStable = uptime >= self.configuration.stableAfter
        if wasStable {
            self.consecutiveFailures = 0
            self.failedRounds = 0
        }
        if self.offline {
            self.goAway = nil
            return self.waitForPath(next: endpoint)
        }
        if self.reconnectAtOnce {
            // Closed because the network changed: not the gateway's fault, no delay; start
            // where this network worked before (the top of the list on a new one).
            self.reconnectAtOnce = false
            self.goAway = nil
            return self.connect(to: self.preferredEndpoint)
        }
        if let goAway = self.goAway {
            self.goAway = nil
            let endpoints = self.configuration.endpoints
            let next = goAway.alternate ?? endpoints[((endpoints.firstIndex(of: endpoint) ?? -1) + 1) % endpoints.count]
            return self.backOff(goAway.retryAfter, next: next)
        }
        if wasStable {
            let initial = Backoff.seconds(self.configuration.backoff.initial)
            return self.backOff(.nanoseconds(Int64(initial * self.generator.nextUnit() * 1e9)), next: endpoint)
        }
        // It dropped before becoming stable: that counts as a failed attempt.
        self.consecutiveFailures += 1
        if let limit = self.configuration.backoff.maxAttempts, self.consecutiveFailures >= limit {
            self.state = .failed(attempts: self.consecutiveFailures)
            return .fail(attempts: self.consecutiveFailures)
        }
        self.failedRounds += 1
        return self.backOff(
            self.configuration.backoff.delay(forAttempt: self.failedRounds, random: self.generator.nextUnit()),
            next: endpoint
        )
    }

    /// The delay of a ``Action/backOff(_:next:)`` passed.
    package mutating func backoffElapsed() -> Action {
        switch self.state {
        case .backingOff(_, let next):
            return self.connect(to: next)
        case .shutDown:
            return .stop
        case .idle, .connecting, .connected, .draining, .waitingForPath, .failed:
            preconditionFailure("backoffElapsed in state \(self.state): no backoff was under way")
        }
    }

    /// The network-path monitor reported `path`.
    /// - Returns: ``PathAction/connect(_:attempt:)`` when a network came back while the machine
    ///   waited (for a path, or in a backoff: the rest of the delay is skipped);
    ///   ``PathAction/closeConnection`` when the path changed under the established connection
    ///   (``connectionClosed(uptime:)`` then reconnects at once); otherwise ``PathAction/none``.
    package mutating func pathChanged(_ path: NetworkPath) -> PathAction {
        let previous = self.path
        self.path = path
        guard path.isAvailable else { return .none }  // attempts wait for a path from now on
        let restored = previous.map { !$0.isAvailable } ?? false
        let changed = previous.map { $0.isAvailable && $0.identity != path.identity } ?? false
        let otherNetwork = previous.map { $0.identity != path.identity } ?? false
        if previous == nil {
            // The first report: the client has been on this network all along, so what works
            // now is what works here.
            if case .connected = self.state { self.remember(self.preferredIndex) }
        } else if otherNetwork {
            self.preferredIndex = self.preferredByNetwork[path.identity] ?? 0
        }
        switch self.state {
        case .waitingForPath(let next):
            return self.reconnectNow(to: otherNetwork ? self.preferredEndpoint : next)
        case .backingOff(_, let next) where restored || changed:
            return self.reconnectNow(to: otherNetwork ? self.preferredEndpoint : next)
        case .connected where changed || restored:
            self.reconnectAtOnce = true
            return .closeConnection
        case .idle, .connecting, .connected, .draining, .backingOff, .failed, .shutDown:
            return .none
        }
    }

    /// The client shuts down.
    package mutating func shutdown() -> ShutdownAction {
        switch self.state {
        case .connected, .draining:
            self.state = .shutDown
            return .closeConnection
        case .idle, .connecting, .backingOff, .waitingForPath, .failed:
            // A connect in progress ends by itself (bounded by the connect timeout); the driver
            // then reports it and gets `.closeConnection` or `.stop`.
            self.state = .shutDown
            return .stop
        case .shutDown:
            return .none
        }
    }

    /// Where the next round starts: the endpoint that worked last (on this network).
    private var preferredEndpoint: Endpoint { self.configuration.endpoints[self.preferredIndex] }

    /// Remembers that endpoint `index` works on the current network.
    private mutating func remember(_ index: Int) {
        guard let identity = self.path?.identity, self.path?.isAvailable == true, !identity.isEmpty else { return }
        if self.preferredByNetwork.updateValue(index, forKey: identity) == nil {
            self.networksInOrder.append(identity)
            if self.networksInOrder.count > Self.rememberedNetworks {
                self.preferredByNetwork[self.networksInOrder.removeFirst()] = nil
            }
        }
    }

    private mutating func connect(to endpoint: Endpoint) -> Action {
        .connect(endpoint, attempt: self.beginAttempt(at: endpoint))
    }

    /// A network came back: connect at once, with the backoff reset.
    private mutating func reconnectNow(to endpoint: Endpoint) -> PathAction {
        self.failedRounds = 0
        self.triedInRound = 0
        return .connect(endpoint, attempt: self.beginAttempt(at: endpoint))
    }

    /// Enters `connecting`; returns the attempt's number.
    private mutating func beginAttempt(at endpoint: Endpoint) -> Int {
        let attempt = self.consecutiveFailures + 1
        self.state = .connecting(endpoint, attempt: attempt)
        return attempt
    }

    /// Whether the monitor reports no network (without a monitor, the network is assumed there).
    private var offline: Bool { self.path?.isAvailable == false }

    private mutating func waitForPath(next: Endpoint) -> Action {
        self.state = .waitingForPath(next: next)
        return .waitForPath(next: next)
    }

    private mutating func backOff(_ delay: Duration, next: Endpoint) -> Action {
        self.state = .backingOff(delay, next: next)
        return .backOff(delay, next: next)
    }
}
