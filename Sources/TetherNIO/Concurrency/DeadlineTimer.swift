public import NIOCore

/// The one timer that serves a `DeadlineQueue` on an event loop.
///
/// It is armed at the queue's earliest deadline and re-armed only when an earlier deadline
/// arrives. When it fires early (the request it was armed for was answered), the owner pops
/// nothing and arms it again for the next deadline.
public struct DeadlineTimer {
    private var armed: (at: NIODeadline, task: Scheduled<Void>)?

    public init() {}

    /// Whether ``arm(at:on:_:)`` would schedule a timer for `earliest`. Check it first on hot
    /// paths: building the `fire` closure costs an allocation even when the timer is left alone.
    public func needsArming(at earliest: NIODeadline?) -> Bool {
        guard let earliest else { return false }
        guard let armed = self.armed else { return true }
        return earliest < armed.at
    }

    /// Makes the timer fire at `earliest`, unless it already fires at or before it.
    /// - Parameters:
    ///   - earliest: The queue's earliest deadline; `nil` leaves the timer as it is.
    ///   - eventLoop: The loop the owner runs on; `fire` runs there.
    ///   - fire: Runs on `eventLoop` once the deadline is reached; it must call ``fired()``
    ///     first, so that re-arming from it schedules a new timer.
    public mutating func arm(at earliest: NIODeadline?, on eventLoop: any EventLoop, _ fire: @escaping () -> Void) {
        guard let earliest else { return }
        if let armed = self.armed {
            guard earliest < armed.at else { return }
            armed.task.cancel()
        }
        let task = eventLoop.assumeIsolated().scheduleTask(deadline: earliest, fire)
        self.armed = (earliest, task)
    }

    /// The timer fired: it is no longer armed.
    public mutating func fired() {
        self.armed = nil
    }

    /// Stops the timer.
    public mutating func cancel() {
        self.armed?.task.cancel()
        self.armed = nil
    }
}
