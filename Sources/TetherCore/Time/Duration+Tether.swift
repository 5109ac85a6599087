extension Duration {
    /// The duration in whole nanoseconds, saturating at the bounds of `Int64` (about 292 years).
    @inlinable
    public var nanoseconds: Int64 {
        let (seconds, attoseconds) = self.components
        let (scaled, overflow) = seconds.multipliedReportingOverflow(by: 1_000_000_000)
        if overflow { return seconds < 0 ? .min : .max }
        let (sum, overflow2) = scaled.addingReportingOverflow(attoseconds / 1_000_000_000)
        if overflow2 { return seconds < 0 ? .min : .max }
        return sum
    }

    /// The duration in whole milliseconds, rounded down, saturating at the bounds of `Int64`.
    @inlinable
    public var wholeMilliseconds: Int64 {
        let (seconds, attoseconds) = self.components
        let (millis, overflow) = seconds.multipliedReportingOverflow(by: 1000)
        if overflow { return seconds < 0 ? .min : .max }
        let (sum, overflow2) = millis.addingReportingOverflow(attoseconds / 1_000_000_000_000_000)
        if overflow2 { return seconds < 0 ? .min : .max }
        return sum
    }

    /// The duration in seconds, with its fraction: `.milliseconds(1500).totalSeconds == 1.5`.
    public var totalSeconds: Double {
        let (seconds, attoseconds) = self.components
        return Double(seconds) + Double(attoseconds) / 1e18
    }

    /// A short human-readable form: `850 µs`, `12.3 ms`, `2.50 s`, `3 min 20 s`.
    public var shortDescription: String {
        let total = self.totalSeconds
        let magnitude = abs(total)
        func rounded(_ value: Double, _ digits: Int) -> String {
            var factor = 1.0
            for _ in 0..<digits { factor *= 10 }
            let scaled = (value * factor).rounded() / factor
            var text = "\(scaled)"
            if digits == 0, text.hasSuffix(".0") { text.removeLast(2) }
            return text
        }
        if magnitude < 0.001 { return "\(rounded(total * 1e6, 0)) µs" }
        if magnitude < 1 { return "\(rounded(total * 1e3, 1)) ms" }
        if magnitude < 120 { return "\(rounded(total, 2)) s" }
        return "\(Int(total) / 60) min \(Int(total) % 60) s"
    }
}
