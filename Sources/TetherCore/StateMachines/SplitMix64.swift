/// A small, seedable pseudo-random generator (SplitMix64) for jitter.
///
/// State machines take one of these instead of reading the system's randomness, so that a
/// test can fix the seed and predict every delay.
package struct SplitMix64: RandomNumberGenerator, Sendable, Hashable {
    private var state: UInt64

    /// Creates a generator with a fixed seed.
    package init(seed: UInt64) { self.state = seed }

    /// Creates a generator seeded from the system's random source.
    package init() {
        var system = SystemRandomNumberGenerator()
        self.state = system.next()
    }

    package mutating func next() -> UInt64 {
        self.state &+= 0x9E37_79B9_7F4A_7C15
        var z = self.state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }

    /// A uniformly distributed value in `0..<1`.
    package mutating func nextUnit() -> Double {
        Double(self.next() >> 11) * (1.0 / 9_007_199_254_740_992.0)
    }
}
