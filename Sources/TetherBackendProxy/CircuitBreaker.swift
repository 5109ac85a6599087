package import TetherCore

/// Whether calls to the backend may go: closed (they go), open after too many failures in a
/// row (they are refused at once, for ``Configuration/openFor``), then half-open (one call
/// probes; its success closes the breaker, its failure opens it again).
///
/// A value with no lock and no clock: its owner passes the time and keeps it under its lock.
package struct CircuitBreaker: Sendable {
    package typealias Configuration = BackendConfiguration.Breaker

    package enum State: Sendable, Hashable {
        case closed(failures: Int)
        case open(until: TetherInstant)
        case halfOpen(probing: Bool)
    }

    package let configuration: Configuration
    package private(set) var state: State = .closed(failures: 0)

    package init(_ configuration: Configuration) {
        self.configuration = configuration
    }

    /// Whether a call may go now (a half-open breaker lets one through at a time).
    package mutating func allows(now: TetherInstant) -> Bool {
        switch self.state {
        case .closed:
            return true
        case .open(let until):
            guard now >= until else { return false }
            self.state = .halfOpen(probing: true)
            return true
        case .halfOpen(let probing):
            guard !probing else { return false }
            self.state = .halfOpen(probing: true)
            return true
        }
    }

    /// A call that went answered (the backend is up, whatever it answered).
    package mutating func succeeded() {
        self.state = .closed(failures: 0)
    }

    /// A call that went failed to get an answer (refused connection, timeout, 5xx).
    package mutating func failed(now: TetherInstant) {
        switch self.state {
        case .closed(let failures):
            self.state =
                failures + 1 >= self.configuration.failures
                ? .open(until: now + self.configuration.openFor) : .closed(failures: failures + 1)
        case .halfOpen, .open:
            self.state = .open(until: now + self.configuration.openFor)
        }
    }

    /// A call that was allowed did not go (cancelled while it waited): a half-open breaker
    /// lets the next one probe.
    package mutating func abandoned() {
        if case .halfOpen(true) = self.state { self.state = .halfOpen(probing: false) }
    }

    /// Whether the breaker refuses calls now (for `/ready`).
    package func isOpen(now: TetherInstant) -> Bool {
        if case .open(let until) = self.state { return now < until }
        return false
    }
}
