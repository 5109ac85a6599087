/// A value kept on the heap behind one reference, copied only when written while shared.
///
/// A connection's state value is moved out of its enum and back on every event; large data
/// behind this box (the client's established phase, the gateway's reliable state) makes each
/// move one word, not the whole value. Mutating through ``value`` writes in place while the
/// box is not shared.
package struct CopyOnWriteBox<Value: Sendable>: Sendable {
    private final class Storage: @unchecked Sendable {
        // Sendable: only ever mutated through `value`'s `_modify`, which first makes the
        // storage unique to the box being mutated (the value semantics of a Swift array).
        var value: Value

        init(_ value: Value) {
            self.value = value
        }
    }

    private var storage: Storage

    package init(_ value: Value) {
        self.storage = Storage(value)
    }

    package var value: Value {
        // `_read`, not `get`: reading a field through the box borrows the value in place
        // instead of copying all of it out (a retain per reference it holds) first.
        _read { yield self.storage.value }
        _modify {
            if !isKnownUniquelyReferenced(&self.storage) {
                self.storage = Storage(self.storage.value)
            }
            yield &self.storage.value
        }
    }
}
