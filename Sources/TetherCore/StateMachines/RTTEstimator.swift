/// Estimates the round-trip time and derives a retransmission timeout from it, as TCP does
/// (RFC 6298): a smoothed RTT and its variation, updated with each sample.
///
/// ```swift
/// var estimator = RTTEstimator()
/// estimator.record(sample: .milliseconds(40))
/// let rto = estimator.retransmissionTimeout  // 40 ms + 4 × 20 ms = 120 ms, raised to the floor
/// ```
/// Only record samples of messages sent once (Karn's rule): the answer to a retransmitted one
/// cannot tell which transmission it answers.
public struct RTTEstimator: Sendable, Hashable {
    /// The timeout before the first sample.
    public var initialTimeout: Duration
    /// The smallest timeout returned.
    public var minimumTimeout: Duration
    /// The largest timeout returned.
    public var maximumTimeout: Duration

    /// The smoothed round-trip time, once there is a sample.
    public private(set) var smoothed: Duration?
    /// The smoothed variation of the round-trip time.
    public private(set) var variation: Duration = .zero

    public init(
        initialTimeout: Duration = .seconds(1),
        minimumTimeout: Duration = .milliseconds(200),
        maximumTimeout: Duration = .seconds(60)
    ) {
        self.initialTimeout = initialTimeout
        self.minimumTimeout = minimumTimeout
        self.maximumTimeout = maximumTimeout
    }

    /// Adds a round-trip measurement.
    public mutating func record(sample: Duration) {
        guard sample >= .zero else { return }
        guard let smoothed = self.smoothed else {
            self.smoothed = sample
            self.variation = sample / 2
            return
        }
        let error = sample > smoothed ? sample - smoothed : smoothed - sample
        self.variation = self.variation * 3 / 4 + error / 4
        self.smoothed = smoothed * 7 / 8 + sample / 8
    }

    /// How long to wait for an acknowledgement before sending again.
    public var retransmissionTimeout: Duration {
        guard let smoothed = self.smoothed else { return self.clamp(self.initialTimeout) }
        return self.clamp(smoothed + self.variation * 4)
    }

    /// The timeout after `retransmissions` unanswered retransmissions: doubled each time.
    public func retransmissionTimeout(afterRetransmissions retransmissions: Int) -> Duration {
        var timeout = self.retransmissionTimeout
        for _ in 0..<min(retransmissions, 16) {
            timeout = self.clamp(timeout * 2)
            if timeout == self.maximumTimeout { break }
        }
        return timeout
    }

    private func clamp(_ value: Duration) -> Duration {
        min(self.maximumTimeout, max(self.minimumTimeout, value))
    }
}
