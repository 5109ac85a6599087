public import NIOCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// The one clock a Tether client or gateway reads: every deadline (requests, heartbeats,
/// handshakes, backoff, retransmissions, limits, expiry) is an instant on it.
///
/// ``SystemClock`` is the default. Tests inject `ManualClock` (TetherTesting), whose time moves
/// only when told to, or ``EventLoopClock`` on an `EmbeddedEventLoop`, whose time moves with the
/// loop's. Nothing else in Tether reads the time: the machines take `now` as an argument, and
/// the connections' timers are armed through ``scheduleCallback(at:on:handler:)``, the one edge
/// where an instant becomes a `NIODeadline`.
public protocol TetherClock: Clock, Sendable where Instant == TetherInstant {
    /// The wall clock, in milliseconds since 1970: for the times that outlive the process (a
    /// message's expiry kept in the outbox, a credential's expiry), moving with ``now``.
    var wallClockMilliseconds: Int64 { get }

    /// Calls `handler` on `eventLoop` once `deadline` has passed, unless the returned callback
    /// is cancelled first. Call it on `eventLoop`.
    /// - Returns: `nil` if the loop no longer runs (it is shutting down).
    func scheduleCallback(
        at deadline: TetherInstant,
        on eventLoop: any EventLoop,
        handler: some NIOScheduledCallbackHandler & AnyObject
    ) -> ClockCallback?

    /// Runs `task` on `eventLoop` once `deadline` has passed, unless the returned callback is
    /// cancelled first. Callable from any thread; for the rare timers (a request waiting for a
    /// connection, a message's expiry), not per frame.
    func schedule(at deadline: TetherInstant, on eventLoop: any EventLoop, _ task: @escaping @Sendable () -> Void) -> ClockCallback
}

/// A callback armed with ``TetherClock/scheduleCallback(at:on:handler:)``.
public struct ClockCallback: Sendable {
    @usableFromInline
    enum Backing: Sendable {
        case eventLoop(NIOScheduledCallback)
        case custom(@Sendable () -> Void)
    }

    @usableFromInline
    let backing: Backing

    /// A callback armed on an event loop.
    public init(_ callback: NIOScheduledCallback) {
        self.backing = .eventLoop(callback)
    }

    /// A callback that another clock armed; `cancel` disarms it.
    public init(cancel: @escaping @Sendable () -> Void) {
        self.backing = .custom(cancel)
    }

    /// Disarms the callback; nothing happens if it fired already. Call it on its loop.
    @inlinable
    public func cancel() {
        switch self.backing {
        case .eventLoop(let callback): callback.cancel()
        case .custom(let cancel): cancel()
        }
    }
}

/// The machine's clocks: the monotonic clock for instants (the one `NIODeadline.now()` reads),
/// the realtime clock for wall time.
public struct SystemClock: TetherClock {
    public init() {}

    @inlinable
    public var now: TetherInstant {
        TetherInstant(nanoseconds: Int64(truncatingIfNeeded: NIODeadline.now().uptimeNanoseconds))
    }

    public var minimumResolution: Duration { .nanoseconds(1) }

    public func sleep(until deadline: TetherInstant, tolerance: Duration? = nil) async throws {
        let remaining = deadline - self.now
        guard remaining > .zero else { return }
        try await Task.sleep(for: remaining)
    }

    public var wallClockMilliseconds: Int64 {
        var time = timespec()
        clock_gettime(CLOCK_REALTIME, &time)
        return Int64(time.tv_sec) * 1000 + Int64(time.tv_nsec) / 1_000_000
    }

    public func scheduleCallback(
        at deadline: TetherInstant,
        on eventLoop: any EventLoop,
        handler: some NIOScheduledCallbackHandler & AnyObject
    ) -> ClockCallback? {
        UptimeScheduling.scheduleCallback(at: deadline, on: eventLoop, handler: handler)
    }

    public func schedule(at deadline: TetherInstant, on eventLoop: any EventLoop, _ task: @escaping @Sendable () -> Void) -> ClockCallback {
        UptimeScheduling.schedule(at: deadline, on: eventLoop, task)
    }
}

/// The time of one event loop as a clock: `EmbeddedEventLoop`'s virtual time in tests, where
/// `advanceTime(by:)` moves every deadline of the connections on it.
///
/// ```swift
/// let loop = EmbeddedEventLoop()
/// let gateway = try Gateway(configuration: config, eventLoopGroup: loop, clock: EventLoopClock(loop))
/// loop.advanceTime(by: .seconds(30))   // the idle timeout fires
/// ```
public struct EventLoopClock: TetherClock {
    /// The loop whose time this is.
    public let eventLoop: any EventLoop
    /// Wall-clock milliseconds at the loop's time zero.
    private let wallClockOrigin: Int64

    /// - Parameters:
    ///   - eventLoop: The loop whose time this is.
    ///   - wallClockOrigin: The wall-clock time (milliseconds since 1970) at the loop's time zero.
    public init(_ eventLoop: any EventLoop, wallClockOrigin: Int64 = 1_800_000_000_000) {
        self.eventLoop = eventLoop
        self.wallClockOrigin = wallClockOrigin
    }

    public var now: TetherInstant {
        TetherInstant(nanoseconds: Int64(truncatingIfNeeded: self.eventLoop.now.uptimeNanoseconds))
    }

    public var minimumResolution: Duration { .nanoseconds(1) }

    public var wallClockMilliseconds: Int64 {
        self.wallClockOrigin + self.now.nanoseconds / 1_000_000
    }

    public func sleep(until deadline: TetherInstant, tolerance: Duration? = nil) async throws {
        let scheduled = self.eventLoop.scheduleTask(deadline: UptimeScheduling.deadline(deadline)) {}
        try await withTaskCancellationHandler {
            try await scheduled.futureResult.get()
        } onCancel: {
            scheduled.cancel()
        }
        try Task.checkCancellation()
    }

    public func scheduleCallback(
        at deadline: TetherInstant,
        on eventLoop: any EventLoop,
        handler: some NIOScheduledCallbackHandler & AnyObject
    ) -> ClockCallback? {
        UptimeScheduling.scheduleCallback(at: deadline, on: eventLoop, handler: handler)
    }

    public func schedule(at deadline: TetherInstant, on eventLoop: any EventLoop, _ task: @escaping @Sendable () -> Void) -> ClockCallback {
        UptimeScheduling.schedule(at: deadline, on: eventLoop, task)
    }
}

/// Scheduling on an event loop for clocks whose instants are NIO's uptime (``SystemClock``,
/// ``EventLoopClock``).
enum UptimeScheduling {
    static func deadline(_ instant: TetherInstant) -> NIODeadline {
        NIODeadline.uptimeNanoseconds(UInt64(max(0, instant.nanoseconds)))
    }

    static func scheduleCallback(
        at deadline: TetherInstant,
        on eventLoop: any EventLoop,
        handler: some NIOScheduledCallbackHandler & AnyObject
    ) -> ClockCallback? {
        (try? eventLoop.assumeIsolated().scheduleCallback(at: Self.deadline(deadline), handler: handler)).map(ClockCallback.init)
    }

    static func schedule(at deadline: TetherInstant, on eventLoop: any EventLoop, _ task: @escaping @Sendable () -> Void) -> ClockCallback {
        let scheduled = eventLoop.scheduleTask(deadline: Self.deadline(deadline)) { task() }
        return ClockCallback(cancel: { scheduled.cancel() })
    }
}
