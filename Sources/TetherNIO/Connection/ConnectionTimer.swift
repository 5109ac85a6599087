package import NIOCore
package import TetherCore

/// A connection's one timer: armed through the connection's ``TetherClock`` at the earliest
/// deadline its state machine has, and re-armed only when an earlier one appears.
///
/// A deadline that moves later (the idle timeout after each frame, the next request's) arms
/// nothing: the armed callback fires early, the machine finds nothing due, and the handler arms
/// again for the machine's next deadline. A deadline that moves earlier arms a second callback
/// rather than cancel the first, because cancelling searches the loop's whole timer heap; at
/// most two are armed, and the later one just finds nothing due. Arming allocates nothing: the
/// handler is its own `NIOScheduledCallbackHandler`.
///
/// ```swift
/// func handleScheduledCallback(eventLoop: some EventLoop) {
///     self.io.timerFired()   // FrameConnection: `timer.fired()`, and an idle write buffer let go
///     let due = self.machine.timerFired(now: self.clock.now)   // perhaps nothing
///     …
///     self.io.timer.arm(at: self.machine.nextDeadline, clock: self.clock, on: loop, handler: self)
/// }
/// ```
package struct ConnectionTimer {
    private typealias Armed = (at: TetherInstant, callback: ClockCallback)

    /// The earliest armed callback.
    private var first: Armed?
    /// A later one, armed before an earlier deadline came.
    private var second: Armed?

    package init() {}

    /// When the timer fires next, if it is armed.
    package var nextFire: TetherInstant? { self.first?.at }

    /// Whether ``arm(at:clock:on:handler:)`` would arm a callback for `deadline`. Cheap: check
    /// it on hot paths before gathering the arguments.
    @inlinable
    package func needsArming(at deadline: TetherInstant?) -> Bool {
        guard let deadline else { return false }
        guard let first = self.first else { return true }
        return deadline < first.at
    }

    /// Makes the timer fire at `deadline`, unless it fires at or before it already.
    /// - Parameters:
    ///   - deadline: The machine's next deadline; `nil` leaves the timer as it is.
    ///   - clock: The connection's clock.
    ///   - eventLoop: The connection's loop; `handler` is called there.
    ///   - handler: The connection's handler; it must call ``fired()`` first when called.
    package mutating func arm(
        at deadline: TetherInstant?,
        clock: any TetherClock,
        on eventLoop: any EventLoop,
        handler: some NIOScheduledCallbackHandler & AnyObject
    ) {
        guard self.needsArming(at: deadline), let deadline else { return }
        guard let callback = clock.scheduleCallback(at: deadline, on: eventLoop, handler: handler) else { return }
        self.second?.callback.cancel()  // rare: deadlines moved earlier twice before one fired
        self.second = self.first
        self.first = (deadline, callback)
    }

    /// A callback fired (they fire in order): the earliest is no longer armed.
    package mutating func fired() {
        self.first = self.second
        self.second = nil
    }

    /// Disarms the timer (the connection is gone).
    package mutating func cancel() {
        self.first?.callback.cancel()
        self.second?.callback.cancel()
        self.first = nil
        self.second = nil
    }
}
