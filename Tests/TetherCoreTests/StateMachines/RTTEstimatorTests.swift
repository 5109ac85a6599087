import Testing

@testable import TetherCore

@Suite("RTT estimator")
struct RTTEstimatorTests {
    @Test("the first sample sets the estimate; later ones are smoothed (RFC 6298)")
    func smoothing() {
        var estimator = RTTEstimator(minimumTimeout: .milliseconds(1))
        #expect(estimator.retransmissionTimeout == .seconds(1))
        estimator.record(sample: .milliseconds(100))
        #expect(estimator.smoothed == .milliseconds(100))
        #expect(estimator.variation == .milliseconds(50))
        #expect(estimator.retransmissionTimeout == .milliseconds(300))
        estimator.record(sample: .milliseconds(200))
        // variation = 3/4 × 50 + 1/4 × 100 = 62.5; smoothed = 7/8 × 100 + 1/8 × 200 = 112.5
        #expect(estimator.variation == .microseconds(62_500))
        #expect(estimator.smoothed == .microseconds(112_500))
        #expect(estimator.retransmissionTimeout == .microseconds(362_500))
    }

    @Test("the timeout stays within its floor and ceiling and doubles per retransmission")
    func bounds() {
        var estimator = RTTEstimator(minimumTimeout: .milliseconds(200), maximumTimeout: .seconds(2))
        estimator.record(sample: .microseconds(100))
        #expect(estimator.retransmissionTimeout == .milliseconds(200))
        #expect(estimator.retransmissionTimeout(afterRetransmissions: 1) == .milliseconds(400))
        #expect(estimator.retransmissionTimeout(afterRetransmissions: 3) == .milliseconds(1600))
        #expect(estimator.retransmissionTimeout(afterRetransmissions: 30) == .seconds(2))
    }
}
