/// The deadlines of many keys (requests in flight, say), earliest first, so that one timer can
/// serve them all instead of one timer each.
///
/// It reads no clock: the owner passes the current instant to ``popExpired(at:)`` and arms a
/// single timer for ``earliest``. Removing a key is O(1) (its heap entry is dropped lazily); the
/// heap is rebuilt when stale entries outnumber the live ones, so memory stays proportional to
/// the keys present.
///
/// ```swift
/// var deadlines = DeadlineQueue<UInt64, TetherInstant>()
/// deadlines.insert(7, deadline: now + .seconds(5))
/// deadlines.remove(7)                 // answered in time
/// for id in deadlines.popExpired(at: now) { fail(id) }
/// if let next = deadlines.earliest { armTimer(at: next) }
/// ```
public struct DeadlineQueue<Key: Hashable, Instant: Comparable> {
    @usableFromInline
    struct Entry {
        @usableFromInline var deadline: Instant
        @usableFromInline var key: Key

        @inlinable
        init(deadline: Instant, key: Key) {
            self.deadline = deadline
            self.key = key
        }
    }

    /// A binary min-heap on `deadline`; entries whose key was removed (or re-inserted with
    /// another deadline) are stale and skipped.
    @usableFromInline var heap: [Entry] = []
    /// The live deadline of each key.
    @usableFromInline var live: [Key: Instant] = [:]

    @inlinable
    public init() {}

    /// The number of keys with a deadline.
    @inlinable
    public var count: Int { self.live.count }

    /// Whether no key has a deadline.
    @inlinable
    public var isEmpty: Bool { self.live.isEmpty }

    /// The deadline of `key`, if it has one.
    @inlinable
    public func deadline(of key: Key) -> Instant? { self.live[key] }

    /// Sets `key`'s deadline, replacing any earlier one.
    @inlinable
    public mutating func insert(_ key: Key, deadline: Instant) {
        self.live[key] = deadline
        self.push(Entry(deadline: deadline, key: key))
        self.compactIfNeeded()
    }

    /// Forgets `key`'s deadline.
    /// - Returns: Whether it had one.
    @inlinable
    @discardableResult
    public mutating func remove(_ key: Key) -> Bool {
        guard self.live.removeValue(forKey: key) != nil else { return false }
        if self.live.isEmpty {
            self.heap.removeAll(keepingCapacity: self.heap.count <= 1024)
        }
        return true
    }

    /// The earliest live deadline, or `nil` if there is none.
    @inlinable
    public var earliest: Instant? {
        mutating get {
            self.dropStaleTop()
            return self.heap.first?.deadline
        }
    }

    /// Removes and returns the keys whose deadline is at or before `now`, earliest first.
    @inlinable
    public mutating func popExpired(at now: Instant) -> [Key] {
        var expired: [Key] = []
        while true {
            self.dropStaleTop()
            guard let top = self.heap.first, top.deadline <= now else { break }
            self.popTop()
            self.live[top.key] = nil
            expired.append(top.key)
        }
        return expired
    }

    /// Forgets every deadline.
    /// - Returns: The keys that had one.
    @inlinable
    public mutating func removeAll() -> [Key] {
        let keys = Array(self.live.keys)
        self.live.removeAll()
        self.heap.removeAll()
        return keys
    }

    // MARK: Heap

    @inlinable
    func isLive(_ entry: Entry) -> Bool {
        self.live[entry.key] == entry.deadline
    }

    @inlinable
    mutating func dropStaleTop() {
        while let top = self.heap.first, !self.isLive(top) {
            self.popTop()
        }
    }

    /// Rebuilds the heap from the live keys once stale entries are the majority.
    @inlinable
    mutating func compactIfNeeded() {
        guard self.heap.count > 64, self.heap.count > 2 * self.live.count else { return }
        self.heap = self.live.map { Entry(deadline: $0.value, key: $0.key) }
        var index = self.heap.count / 2
        while index > 0 {
            index -= 1
            self.siftDown(from: index)
        }
    }

    @inlinable
    mutating func push(_ entry: Entry) {
        self.heap.append(entry)
        var child = self.heap.count - 1
        while child > 0 {
            let parent = (child - 1) / 2
            guard self.heap[child].deadline < self.heap[parent].deadline else { break }
            self.heap.swapAt(child, parent)
            child = parent
        }
    }

    @inlinable
    mutating func popTop() {
        let last = self.heap.removeLast()
        guard !self.heap.isEmpty else { return }
        self.heap[0] = last
        self.siftDown(from: 0)
    }

    @inlinable
    mutating func siftDown(from start: Int) {
        var parent = start
        let count = self.heap.count
        while true {
            let left = 2 * parent + 1
            guard left < count else { return }
            let right = left + 1
            var smallest = left
            if right < count, self.heap[right].deadline < self.heap[left].deadline { smallest = right }
            guard self.heap[smallest].deadline < self.heap[parent].deadline else { return }
            self.heap.swapAt(parent, smallest)
            parent = smallest
        }
    }
}

extension DeadlineQueue: Sendable where Key: Sendable, Instant: Sendable {}
extension DeadlineQueue.Entry: Sendable where Key: Sendable, Instant: Sendable {}
