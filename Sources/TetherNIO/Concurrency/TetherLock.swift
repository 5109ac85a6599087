import NIOConcurrencyHelpers

#if DEBUG
    import Atomics
#endif

/// A value behind a lock: the one lock type of Tether's modules.
///
/// Every lock Tether takes is one of these, so that the lock budgets of the hot paths (how many
/// locks a request, a push or a reliable message takes) are counted, not estimated: in debug
/// builds, ``LockAccounting`` counts each acquisition by the place the lock was made, while it
/// is on. Release builds count nothing.
///
/// ```swift
/// let names = TetherLock<[String]>([])
/// names.withLockedValue { $0.append("alice") }
/// ```
package final class TetherLock<Value> {
    private let lock = NIOLock()
    private var value: Value
    #if DEBUG
        private let site: LockAccounting.Site
    #endif

    /// - Parameter value: The value the lock guards.
    package init(_ value: Value, fileID: StaticString = #fileID, line: UInt = #line) {
        self.value = value
        #if DEBUG
            self.site = LockAccounting.Site(fileID: fileID, line: line)
        #endif
    }

    /// Runs `body` with the value, holding the lock.
    /// - Parameters:
    ///   - fileID: Where the lock is taken, for ``LockAccounting`` (leave the default).
    ///   - line: Where the lock is taken, for ``LockAccounting`` (leave the default).
    @inline(__always)
    package func withLockedValue<Result, Failure: Error>(
        fileID: StaticString = #fileID,
        line: UInt = #line,
        _ body: (inout Value) throws(Failure) -> Result
    ) throws(Failure) -> Result {
        #if DEBUG
            LockAccounting.acquired(self.site, fileID: fileID, line: line)
        #endif
        self.lock.lock()
        defer { self.lock.unlock() }
        return try body(&self.value)
    }
}

extension TetherLock: @unchecked Sendable where Value: Sendable {}

/// Counts the acquisitions of every ``TetherLock`` while on (debug builds): what the lock-budget
/// tests read.
package enum LockAccounting {
    /// Where a lock was made: its file and line.
    package struct Site: Hashable, Sendable, CustomStringConvertible {
        package var fileID: String
        package var line: UInt

        init(fileID: StaticString, line: UInt) {
            self.fileID = "\(fileID)"
            self.line = line
        }

        /// The module the lock belongs to (the first component of its file id).
        package var module: Substring { self.fileID.prefix { $0 != "/" } }

        package var description: String { "\(self.fileID):\(self.line)" }
    }

    /// Whether this build counts (a debug build).
    package static var isAvailable: Bool {
        #if DEBUG
            true
        #else
            false
        #endif
    }

    /// The acquisitions counted: by lock (where each was made) and by where each was taken.
    package struct Counts: Sendable {
        package var byLock: [Site: Int] = [:]
        package var byPlace: [Site: Int] = [:]
    }

    #if DEBUG
        private static let on = ManagedAtomic(false)
        private static let counts = NIOLockedValueBox(Counts())

        @inline(__always)
        static func acquired(_ site: Site, fileID: StaticString, line: UInt) {
            guard Self.on.load(ordering: .relaxed) else { return }
            let place = Site(fileID: fileID, line: line)
            Self.counts.withLockedValue {
                $0.byLock[site, default: 0] += 1
                $0.byPlace[place, default: 0] += 1
            }
        }
    #endif

    /// Clears the counts and starts counting.
    package static func start() {
        #if DEBUG
            Self.counts.withLockedValue { $0 = Counts() }
            Self.on.store(true, ordering: .sequentiallyConsistent)
        #endif
    }

    /// Stops counting and returns the acquisitions since ``start()`` (none in a release build).
    package static func stop() -> Counts {
        #if DEBUG
            Self.on.store(false, ordering: .sequentiallyConsistent)
            return Self.counts.withLockedValue { $0 }
        #else
            return Counts()
        #endif
    }
}
