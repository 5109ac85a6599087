/// Exponential backoff with jitter between connection attempts.
///
/// The delay before retry number `n` (1-based) is
/// `min(maximum, initial × multiplier^(n-1))`, then moved by a uniformly random factor in
/// `[1 - jitter, 1 + jitter]` and clamped to `[0, maximum]`. The default jitter of 1 is "full
/// jitter": anything from 0 to twice the delay, so that clients dropped at the same moment (a
/// gateway restart) come back spread out rather than in waves.
///
/// ```swift
/// let backoff = try Backoff(initial: .milliseconds(250), maximum: .seconds(30), multiplier: 2, jitter: 0.2)
/// ```
public struct Backoff: Hashable, Sendable {
    /// The delay before the first retry.
    public var initial: Duration
    /// The longest delay between two attempts.
    public var maximum: Duration
    /// How much the delay grows per failed attempt; at least 1.
    public var multiplier: Double
    /// The relative randomisation of each delay, 0 (none) to 1 (anything from 0 to twice the delay).
    public var jitter: Double
    /// How many consecutive failed attempts are allowed before giving up; `nil` retries forever.
    public var maxAttempts: Int?

    /// Creates a backoff policy.
    /// - Throws: ``ConfigurationError`` if a value is out of range.
    public init(
        initial: Duration = .milliseconds(250),
        maximum: Duration = .seconds(30),
        multiplier: Double = 2,
        jitter: Double = 1,
        maxAttempts: Int? = nil
    ) throws(ConfigurationError) {
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.jitter = jitter
        self.maxAttempts = maxAttempts
        try self.validate()
    }

    /// Defaults: 250 ms, doubling, up to 30 s, full jitter (0 to twice the delay), unlimited attempts.
    public static var defaults: Backoff { try! Backoff() }

    /// Checks every value; called by the initialiser and by the configurations that embed this.
    public func validate() throws(ConfigurationError) {
        guard self.initial >= .zero else { throw ConfigurationError("backoff.initial must not be negative") }
        guard self.maximum >= self.initial else { throw ConfigurationError("backoff.maximum must be at least backoff.initial") }
        guard self.multiplier >= 1, self.multiplier.isFinite else { throw ConfigurationError("backoff.multiplier must be at least 1") }
        guard (0...1).contains(self.jitter) else { throw ConfigurationError("backoff.jitter must be between 0 and 1") }
        if let maxAttempts = self.maxAttempts, maxAttempts < 1 {
            throw ConfigurationError("backoff.maxAttempts must be at least 1 (or nil for unlimited)")
        }
    }

    /// The delay before retry number `attempt`.
    /// - Parameters:
    ///   - attempt: 1 for the first retry.
    ///   - random: A uniformly distributed value in `0..<1`.
    public func delay(forAttempt attempt: Int, random: Double) -> Duration {
        let exponent = Double(max(0, attempt - 1))
        let maximumSeconds = Self.seconds(self.maximum)
        let base = min(maximumSeconds, Self.seconds(self.initial) * pow(self.multiplier, exponent))
        let factor = 1 + self.jitter * (2 * random - 1)
        let seconds = min(maximumSeconds, max(0, base * factor))
        return .nanoseconds(Int64(seconds * 1e9))
    }

    static func seconds(_ duration: Duration) -> Double {
        duration.totalSeconds
    }

    private func pow(_ base: Double, _ exponent: Double) -> Double {
        // Exponentiation by squaring keeps Foundation out of the core.
        var result = 1.0
        var factor = base
        var remaining = Int(min(exponent, 64))
        while remaining > 0 {
            if remaining & 1 == 1 { result *= factor }
            factor *= factor
            remaining >>= 1
        }
        return result
    }
}

/// A configuration value out of range.
public struct ConfigurationError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What is wrong and how to fix it.
    public var message: String
    public init(_ message: String) { self.message = message }
    public var description: String { "invalid configuration: \(self.message)" }
}
