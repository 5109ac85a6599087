/// A point in time on a ``TetherClock``: nanoseconds since the clock's origin.
///
/// Every deadline in Tether's machines is one of these, read from the one clock the client or
/// the gateway was given; the machines never read a clock themselves. For ``SystemClock`` the
/// origin is the machine's boot (the monotonic clock NIO's deadlines count from too), so an
/// instant turns into a `NIODeadline` exactly, at the one edge where a timer is armed.
///
/// ```swift
/// let deadline = clock.now + .seconds(5)
/// if clock.now >= deadline { … }
/// let waited: Duration = clock.now - start
/// ```
public struct TetherInstant: Sendable, Hashable, Comparable, InstantProtocol, CustomStringConvertible {
    /// Nanoseconds since the clock's origin.
    public var nanoseconds: Int64

    /// The instant `nanoseconds` after the clock's origin.
    @inlinable
    public init(nanoseconds: Int64) {
        self.nanoseconds = nanoseconds
    }

    /// The clock's origin.
    public static let zero = TetherInstant(nanoseconds: 0)

    /// An instant later than any a clock reaches.
    public static let distantFuture = TetherInstant(nanoseconds: .max)

    @inlinable
    public static func < (lhs: TetherInstant, rhs: TetherInstant) -> Bool {
        lhs.nanoseconds < rhs.nanoseconds
    }

    /// The instant `duration` later (earlier if negative), saturating at the bounds.
    @inlinable
    public func advanced(by duration: Duration) -> TetherInstant {
        let step = duration.nanoseconds
        let (sum, overflow) = self.nanoseconds.addingReportingOverflow(step)
        return TetherInstant(nanoseconds: overflow ? (step > 0 ? .max : .min) : sum)
    }

    @inlinable
    public func duration(to other: TetherInstant) -> Duration {
        .nanoseconds(other.nanoseconds &- self.nanoseconds)
    }

    @inlinable
    public static func + (lhs: TetherInstant, rhs: Duration) -> TetherInstant {
        lhs.advanced(by: rhs)
    }

    @inlinable
    public static func - (lhs: TetherInstant, rhs: Duration) -> TetherInstant {
        lhs.advanced(by: .zero - rhs)
    }

    @inlinable
    public static func - (lhs: TetherInstant, rhs: TetherInstant) -> Duration {
        rhs.duration(to: lhs)
    }

    public var description: String { "\(Duration.nanoseconds(self.nanoseconds).shortDescription) after the clock's origin" }
}
