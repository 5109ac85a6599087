import Logging
import NIOConcurrencyHelpers
import NIOCore

/// Logs a recurring event at most once per interval, with how many were not logged since: a
/// flood of refusals costs a few lines, not one per refusal.
final class RateLimitedLog: Sendable {
    private struct State {
        var last: NIODeadline?
        var suppressed = 0
    }

    private let interval: TimeAmount
    private let state = NIOLockedValueBox(State())

    init(interval: TimeAmount = .seconds(10)) {
        self.interval = interval
    }

    /// Logs `message` at `level` unless a line went out less than the interval ago.
    func log(
        _ logger: Logger,
        _ level: Logger.Level,
        _ message: @autoclosure () -> Logger.Message,
        metadata: @autoclosure () -> Logger.Metadata = [:],
        now: NIODeadline = .now()
    ) {
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
