import Testing

@testable import TetherCore

/// The box the connection machines keep their established data in: value semantics, writes in
/// place while unique, and the value released with the last box.
@Suite("Copy-on-write box")
struct CopyOnWriteBoxTests {
    final class Marker: Sendable {}

    struct Payload: Sendable {
        var numbers: [Int]
        var marker: Marker?
    }

    @Test("a copy is independent of the box it was copied from, whichever is written")
    func copiesAreIndependent() {
        var first = CopyOnWriteBox(Payload(numbers: [1, 2], marker: nil))
        var second = first
        second.value.numbers.append(3)
        #expect(first.value.numbers == [1, 2])
        #expect(second.value.numbers == [1, 2, 3])
        first.value.numbers[0] = 10
        #expect(first.value.numbers == [10, 2])
        #expect(second.value.numbers == [1, 2, 3])
    }

    /// Where the box keeps its value now (a write that copies moves it).
    static func address(of box: inout CopyOnWriteBox<Payload>) -> UnsafeMutableRawPointer {
        withUnsafeMutablePointer(to: &box.value) { UnsafeMutableRawPointer($0) }
    }

    @Test("a unique box is written in place: neither the value nor its array moves")
    func uniqueWritesInPlace() {
        var box = CopyOnWriteBox(Payload(numbers: [], marker: nil))
        box.value.numbers.reserveCapacity(64)
        let value = Self.address(of: &box)
        let numbers = box.value.numbers.withUnsafeBufferPointer { $0.baseAddress }
        for number in 0..<32 { box.value.numbers.append(number) }
        #expect(Self.address(of: &box) == value)
        #expect(box.value.numbers.withUnsafeBufferPointer { $0.baseAddress } == numbers)
        #expect(box.value.numbers.count == 32)
    }

    @Test("a shared box's write copies first: the value moves, and the other box is untouched")
    func sharedWriteCopies() {
        var box = CopyOnWriteBox(Payload(numbers: [1], marker: nil))
        let shared = Self.address(of: &box)  // unique still: no copy
        let other = box
        box.value.numbers[0] = 2
        #expect(Self.address(of: &box) != shared)
        #expect(other.value.numbers == [1])
        #expect(box.value.numbers == [2])
    }

    @Test("the value is released with the last box that holds it")
    func releasesTheValue() {
        weak var weakMarker: Marker?
        do {
            let marker = Marker()
            weakMarker = marker
            var box: CopyOnWriteBox<Payload>? = CopyOnWriteBox(Payload(numbers: [], marker: marker))
            var copy = box
            copy?.value.numbers.append(1)  // the copy now has storage of its own, holding the marker too
            box = nil
            #expect(copy?.value.marker != nil)
            copy = nil
        }
        #expect(weakMarker == nil)
    }
}
