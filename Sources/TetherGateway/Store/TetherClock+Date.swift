import Foundation
import TetherCore

extension TetherClock {
    /// The clock's wall-clock time as a `Date`: what the stores keep (an outbox last seen, a
    /// publication's time).
    var wallClockDate: Date { Date(timeIntervalSince1970: Double(self.wallClockMilliseconds) / 1000) }
}

extension ChannelRetention {
    /// The oldest time a publication still kept was published at, by `clock`'s wall clock.
    func notBefore(_ clock: any TetherClock) -> Date {
        clock.wallClockDate - self.maxAge.totalSeconds
    }
}
