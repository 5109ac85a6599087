/// A value kept on the heap behind one reference, copied only when written while shared.
///
/// A connection's state value is moved out of its enum and back on every event; large data
/// behind this box (each machine's established phase, the gateway's reliable state) makes each
/// move one word, not the whole value. Mutating through ``value`` writes in place while the
/// box is not shared.
package struct CopyOnWriteBox<Value: Sendable>: @unchecked Sendable {
    // Sendable: the storage is only ever mutated while unique to the box being mutated (the
    // value semantics of a Swift array); ManagedBuffer itself is not Sendable.
    // The value is the buffer's header, reached through its address: a class's stored `var`
    // would cost a dynamic exclusivity check (`swift_beginAccess`, a thread-local access set)
    // on every read and write, and the machines read through the box several times per event.
    // None is needed: a write goes through `unsafeMutableAddress`, which needs exclusive access
    // to the box (checked statically, as for any struct), and first makes the storage unique to
    // it; reads of shared storage are only reads.
    private final class Storage: ManagedBuffer<Value, Void> {
        static func make(_ value: Value) -> Storage {
            // `create` makes an instance of the class it is called on.
            unsafeDowncast(Storage.create(minimumCapacity: 0) { _ in value }, to: Storage.self)
        }

        var address: UnsafeMutablePointer<Value> {
            self.withUnsafeMutablePointerToHeader { $0 }
        }
    }

    private var storage: Storage

    package init(_ value: Value) {
        self.storage = Storage.make(value)
    }

    package var value: Value {
        // Reading a field through the box borrows the value in place, without copying all of
        // it out (a retain per reference it holds) first.
        unsafeAddress { UnsafePointer(self.storage.address) }
        unsafeMutableAddress {
            if !isKnownUniquelyReferenced(&self.storage) {
                self.storage = Storage.make(self.storage.address.pointee)
            }
            return self.storage.address
        }
    }
}
