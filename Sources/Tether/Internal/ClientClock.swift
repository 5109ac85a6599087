/// The client's one clock: the one injected into ``TetherClient`` (a `ContinuousClock` by
/// default, a `ManualClock` in tests), read as the time elapsed since the client was created.
///
/// The run loop reads nothing else: backoff delays, racing deadlines and endpoint penalties all
/// follow it, so a test that moves a manual clock moves all of them.
struct ClientClock: Sendable {
    /// A point in the client's time: how long after the client was created.
    struct Instant: InstantProtocol, Hashable, Sendable {
        var elapsed: Duration
        func advanced(by duration: Duration) -> Instant { Instant(elapsed: self.elapsed + duration) }
        func duration(to other: Instant) -> Duration { other.elapsed - self.elapsed }
        static func < (lhs: Instant, rhs: Instant) -> Bool { lhs.elapsed < rhs.elapsed }
    }

    /// The injected clock.
    let base: any Clock<Duration>
    private let read: @Sendable () -> Duration

    init(_ base: any Clock<Duration>) {
        self.base = base
        self.read = Self.reader(base)
    }

    private static func reader<C: Clock<Duration>>(_ clock: C) -> @Sendable () -> Duration {
        let start = clock.now
        return { start.duration(to: clock.now) }
    }

    /// Now, on the injected clock.
    var now: Instant { Instant(elapsed: self.read()) }

    /// Sleeps on the injected clock.
    func sleep(for duration: Duration) async throws {
        try await self.base.sleep(for: duration)
    }
}
