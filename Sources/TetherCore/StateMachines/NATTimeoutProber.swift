/// Learns, per network, the longest heartbeat interval the path keeps an idle connection open
/// (WeChat Mars's "smart heartbeat").
///
/// NATs and firewalls forget a TCP connection that carried nothing for a while: on many mobile
/// networks after 1 to 5 minutes, on some after 30 seconds. After that, the connection is dead
/// without either end knowing; pushes from the gateway go nowhere. A heartbeat more frequent
/// than that timeout keeps the connection alive, and every extra ping costs radio time and
/// battery. The prober finds the timeout by experiment:
///
/// - It starts at ``Configuration/initialInterval``. Each idle probe (a PING sent after the link
///   was silent both ways for a whole interval) that is answered proves that interval safe;
///   after ``Configuration/successesPerStep`` of them, the interval grows by
///   ``Configuration/step``, up to ``Configuration/maximumInterval``.
/// - An idle probe that goes unanswered (the link died) counts as a failure of its interval.
///   After ``Configuration/failuresToBackOff`` consecutive failures the prober backs off to the
///   longest interval proven safe, less ``Configuration/settleMargin`` (or one step down if
///   none is), and stops growing: the network has settled. One failure is not enough, since a
///   link can die for reasons other than the NAT.
/// - Optionally, after ``Configuration/reprobeAfter`` successes at a settled interval, it tries
///   the next step again, in case the network's timeout grew.
///
/// Results are kept per network identity (``NetworkPath/identity``), so that a phone moving
/// between home Wi-Fi and cellular uses what it learned on each. The least recently used
/// networks are forgotten beyond ``Configuration/maximumNetworks``.
///
/// The prober is a value with no clock and no I/O: the client reports the fate of each idle
/// probe and reads the interval to use.
///
/// ```swift
/// var prober = NATTimeoutProber(configuration: .defaults)
/// prober.interval(for: "wifi:en0")                                   // 60 s to start
/// prober.probeSucceeded(network: "wifi:en0", interval: .seconds(60))  // now 90 s
/// ```
public struct NATTimeoutProber: Sendable, Hashable {
    /// How the prober searches.
    public struct Configuration: Sendable, Hashable {
        /// The interval used on a network seen for the first time; it should be safe nearly
        /// everywhere.
        public var initialInterval: Duration
        /// How much the interval grows after successful probes, and shrinks after failures.
        public var step: Duration
        /// The interval never goes below this.
        public var minimumInterval: Duration
        /// The interval never grows beyond this (the client also caps it at half the gateway's
        /// idle timeout).
        public var maximumInterval: Duration
        /// Answered idle probes at one interval before it grows.
        public var successesPerStep: Int
        /// Consecutive unanswered idle probes at one interval before the prober backs off.
        public var failuresToBackOff: Int
        /// After this many answered idle probes at a settled interval, the next step is tried
        /// again; `nil` never re-probes a settled network.
        public var reprobeAfter: Int?
        /// How many networks are remembered.
        public var maximumNetworks: Int
        /// After failures, the interval settles this fraction (0 to 0.5) below the longest one
        /// proven safe: an interval that only just survived sits at the NAT's edge, where a
        /// late timer or a slow answer decides.
        public var settleMargin: Double

        /// - Throws: ``ConfigurationError`` if a value is out of range.
        public init(
            initialInterval: Duration = .seconds(60),
            step: Duration = .seconds(30),
            minimumInterval: Duration = .seconds(15),
            maximumInterval: Duration = .seconds(600),
            successesPerStep: Int = 1,
            failuresToBackOff: Int = 2,
            reprobeAfter: Int? = nil,
            maximumNetworks: Int = 32,
            settleMargin: Double = 0.1
        ) throws(ConfigurationError) {
            self.initialInterval = initialInterval
            self.step = step
            self.minimumInterval = minimumInterval
            self.maximumInterval = maximumInterval
            self.successesPerStep = successesPerStep
            self.failuresToBackOff = failuresToBackOff
            self.reprobeAfter = reprobeAfter
            self.maximumNetworks = maximumNetworks
            self.settleMargin = settleMargin
            try self.validate()
        }

        /// Start at 60 s, grow by 30 s per answered probe up to 10 minutes, never below 15 s;
        /// back off after two failures to 10 % below the longest safe interval; no
        /// re-probing; 32 networks remembered.
        public static var defaults: Configuration { try! Configuration() }

        /// Checks every value; called by the initialiser and by the configurations that embed this.
        public func validate() throws(ConfigurationError) {
            guard self.minimumInterval > .zero else { throw ConfigurationError("natProbing.minimumInterval must be positive") }
            guard self.step > .zero else { throw ConfigurationError("natProbing.step must be positive") }
            guard self.minimumInterval <= self.initialInterval, self.initialInterval <= self.maximumInterval else {
                throw ConfigurationError("natProbing intervals must satisfy minimumInterval ≤ initialInterval ≤ maximumInterval")
            }
            guard self.successesPerStep >= 1 else { throw ConfigurationError("natProbing.successesPerStep must be at least 1") }
            guard self.failuresToBackOff >= 1 else { throw ConfigurationError("natProbing.failuresToBackOff must be at least 1") }
            if let reprobeAfter = self.reprobeAfter, reprobeAfter < 1 {
                throw ConfigurationError("natProbing.reprobeAfter must be at least 1 (or nil to never re-probe)")
            }
            guard self.maximumNetworks >= 1 else { throw ConfigurationError("natProbing.maximumNetworks must be at least 1") }
            guard (0...0.5).contains(self.settleMargin) else { throw ConfigurationError("natProbing.settleMargin must be from 0 to 0.5") }
        }
    }

    /// What the prober knows about one network.
    public struct Network: Sendable, Hashable {
        /// The interval to use now.
        public internal(set) var interval: Duration
        /// The longest interval an idle probe survived, if any.
        public internal(set) var longestSafe: Duration?
        /// The shortest interval whose probes failed ``Configuration/failuresToBackOff`` times in
        /// a row: while there is one, the prober does not grow. `nil` while none has.
        public internal(set) var failedAt: Duration?
        var successes = 0
        var failures = 0
        var lastUsed: UInt64 = 0

        func isSettled(maximum: Duration) -> Bool {
            self.failedAt != nil || self.interval >= maximum
        }
    }

    /// How a report changed the interval of its network.
    public enum Change: Sendable, Hashable {
        /// The interval stays.
        case unchanged
        /// Probes succeeded: the interval grew to this.
        case grew(to: Duration)
        /// Probes failed: the interval shrank to this.
        case backedOff(to: Duration)
    }

    public let configuration: Configuration
    /// What is known, by network identity.
    public private(set) var networks: [String: Network] = [:]
    private var useCounter: UInt64 = 0

    public init(configuration: Configuration) {
        self.configuration = configuration
    }

    /// The heartbeat interval to use on `network`.
    public func interval(for network: String) -> Duration {
        self.networks[network]?.interval ?? self.configuration.initialInterval
    }

    /// Whether the search on `network` is over: an interval failed, or the maximum is reached.
    public func isSettled(_ network: String) -> Bool {
        (self.networks[network] ?? Network(interval: self.configuration.initialInterval))
            .isSettled(maximum: self.configuration.maximumInterval)
    }

    /// An idle probe sent after `interval` of silence was answered on `network`.
    ///
    /// A report for a shorter interval than the network's current one (the heartbeat was still
    /// running at an older interval, or in another mode) only refines what is known to be safe.
    @discardableResult
    public mutating func probeSucceeded(network: String, interval: Duration) -> Change {
        var record = self.record(network)
        defer { self.networks[network] = record }
        record.longestSafe = max(record.longestSafe ?? .zero, interval)
        if let failedAt = record.failedAt, interval >= failedAt {
            // The failures there were not the NAT's doing after all.
            record.failedAt = nil
        }
        guard interval >= record.interval else { return .unchanged }
        record.failures = 0
        record.successes += 1
        let configuration = self.configuration
        if record.isSettled(maximum: configuration.maximumInterval) {
            // Re-probe a settled network now and then: its timeout may have grown.
            guard let reprobeAfter = configuration.reprobeAfter, record.successes >= reprobeAfter,
                record.interval < configuration.maximumInterval
            else { return .unchanged }
            record.failedAt = nil
        } else if record.successes < configuration.successesPerStep {
            return .unchanged
        }
        record.successes = 0
        record.interval = min(record.interval + configuration.step, configuration.maximumInterval)
        return .grew(to: record.interval)
    }

    /// An idle probe sent after `interval` of silence went unanswered on `network` (the link
    /// was declared dead, or broke, while the probe waited).
    ///
    /// Only failures at the network's current interval count.
    @discardableResult
    public mutating func probeFailed(network: String, interval: Duration) -> Change {
        var record = self.record(network)
        defer { self.networks[network] = record }
        // A failure after a shorter or longer silence says nothing certain about this interval.
        guard interval == record.interval else { return .unchanged }
        record.successes = 0
        record.failures += 1
        guard record.failures >= self.configuration.failuresToBackOff else { return .unchanged }
        record.failures = 0
        let failed = record.interval
        record.failedAt = min(record.failedAt ?? failed, failed)
        if let safe = record.longestSafe, safe < failed {
            record.interval = max(self.configuration.minimumInterval, safe * (1 - self.configuration.settleMargin))
        } else {
            // Even the interval once proven safe fails now: the network changed its mind.
            record.longestSafe = nil
            record.interval = max(self.configuration.minimumInterval, failed - self.configuration.step)
        }
        return record.interval < failed ? .backedOff(to: record.interval) : .unchanged
    }

    /// Forgets everything learned about `network`.
    public mutating func forget(network: String) {
        self.networks[network] = nil
    }

    private mutating func record(_ network: String) -> Network {
        self.useCounter &+= 1
        var record = self.networks[network] ?? Network(interval: self.configuration.initialInterval)
        record.lastUsed = self.useCounter
        if self.networks[network] == nil, self.networks.count >= self.configuration.maximumNetworks,
            let oldest = self.networks.min(by: { $0.value.lastUsed < $1.value.lastUsed })?.key
        {
            self.networks[oldest] = nil
        }
        return record
    }
}
