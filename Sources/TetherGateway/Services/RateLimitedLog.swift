import Logging
import TetherCore
import TetherNIO

/// Logs a recurring event at most once per interval, with how many were not logged since: a
/// flood of refusals costs a few lines, not one per refusal.
final class RateLimitedLog: Sendable {
    private struct State {
        var last: TetherInstant?
        var suppressed = 0
    }

    private let interval: Duration
    private let clock: any TetherClock
    private let state = TetherLock(State())

    init(clock: any TetherClock, interval: Duration = .seconds(10)) {
        self.clock = clock
        self.interval = interval
    }

    /// Logs `message` at `level` unless a line went out less than the interval ago.
    func log(
        _ logger: Logger,
        _ level: Logger.Level,
        _ message: @autoclosure () -> Logger.Message,
        metadata: @autoclosure () -> Logger.Metadata = [:]
    ) {
        let now = self.clock.now
        let suppressed: Int? = self.state.withLockedValue { state in
            if let last = state.last, now - last < self.interval {
                state.suppressed += 1
                return nil
            }
            defer { state.suppressed = 0 }
            state.last = now
            return state.suppressed
        }
        guard let suppressed else { return }
        var metadata = metadata()
        if suppressed > 0 { metadata["suppressed-since-last"] = "\(suppressed)" }
        logger.log(level: level, message(), metadata: metadata)
    }
}
