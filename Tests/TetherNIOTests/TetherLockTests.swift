import Testing
import TetherNIO

@Suite("TetherLock")
struct TetherLockTests {
    @Test("a lock guards its value; in a debug build, accounting counts its acquisitions by where it was made, only while on")
    func counting() {
        let lock = TetherLock(0)
        let line: UInt = #line - 1
        lock.withLockedValue { $0 += 1 }  // not counted: accounting is off
        LockAccounting.start()
        for _ in 0..<3 { lock.withLockedValue { $0 += 1 } }
        let counts = LockAccounting.stop()
        lock.withLockedValue { $0 += 1 }
        #expect(lock.withLockedValue { $0 } == 5)

        let mine = counts.byLock.filter { $0.key.fileID == "TetherNIOTests/TetherLockTests.swift" && $0.key.line == line }
        #if DEBUG
            #expect(LockAccounting.isAvailable)
            #expect(mine.values.first == 3)
            #expect(mine.keys.first?.module == "TetherNIOTests")
            #expect(counts.byPlace.filter { $0.key.fileID == "TetherNIOTests/TetherLockTests.swift" }.values.sorted() == [3])
        #else
            #expect(mine.isEmpty)
        #endif
    }

    @Test("a body's typed error comes through, and the lock is released after it")
    func throwing() {
        struct Refusal: Error, Equatable {}
        let lock = TetherLock([Int]())
        #expect(throws: Refusal.self) {
            try lock.withLockedValue { (_: inout [Int]) throws(Refusal) in throw Refusal() }
        }
        lock.withLockedValue { $0.append(1) }
        #expect(lock.withLockedValue { $0 } == [1])
    }
}
