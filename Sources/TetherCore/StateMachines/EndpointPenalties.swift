/// A temporary ban on endpoints that failed fast (refused the connection, or closed it during
/// the handshake): for ``duration`` they come after every other endpoint in the order a
/// connection attempt tries them.
///
/// A banned endpoint is still tried when nothing else is left, so a client never ends up with
/// no endpoint at all (a gateway cluster that restarts entirely must still be reachable). Time
/// is passed in; the value never reads a clock.
///
/// ```swift
/// var penalties = EndpointPenalties<ContinuousClock.Instant>(duration: .seconds(30))
/// penalties.penalize(a, at: .now)
/// penalties.order([a, b, c], from: a, at: .now)   // [b, c, a]
/// ```
package struct EndpointPenalties<Instant: InstantProtocol>: Sendable where Instant.Duration == Duration {
    /// How long a penalty lasts.
    package var duration: Duration
    private var until: [Endpoint: Instant] = [:]

    package init(duration: Duration) {
        precondition(duration >= .zero, "an endpoint penalty must not be negative")
        self.duration = duration
    }

    /// `endpoint` failed fast at `now`: it goes last until `now + duration`.
    package mutating func penalize(_ endpoint: Endpoint, at now: Instant) {
        guard self.duration > .zero else { return }
        self.until[endpoint] = now.advanced(by: self.duration)
    }

    /// `endpoint` answered again (a probe reached it): its penalty, if any, is lifted.
    package mutating func forgive(_ endpoint: Endpoint) {
        self.until[endpoint] = nil
    }

    /// Whether `endpoint` is penalized at `now`.
    package func isPenalized(_ endpoint: Endpoint, at now: Instant) -> Bool {
        self.until[endpoint].map { $0 > now } ?? false
    }

    /// The order an attempt starting at `first` tries `endpoints` in: the list rotated to start
    /// at `first` (or `first`, then the list, if it is not in it), with the penalized endpoints
    /// moved to the end in that same order. Expired penalties are forgotten.
    package mutating func order(_ endpoints: [Endpoint], from first: Endpoint, at now: Instant) -> [Endpoint] {
        self.until = self.until.filter { $0.value > now }
        let rotation =
            endpoints.firstIndex(of: first).map { Array(endpoints[$0...] + endpoints[..<$0]) } ?? [first] + endpoints
        guard rotation.count > 1 else { return rotation }
        return rotation.filter { self.until[$0] == nil } + rotation.filter { self.until[$0] != nil }
    }
}
