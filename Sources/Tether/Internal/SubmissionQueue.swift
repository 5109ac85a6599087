import Atomics

/// Hands elements from any thread to one consumer without a lock: producers push with one
/// compare-and-swap, the consumer takes everything at once with one exchange (a Treiber stack,
/// read back in order).
///
/// A node per element is the one allocation; the consumer relinks the nodes it took in order
/// and walks them, without an array.
///
/// ```swift
/// if queue.push(submission) { loop.execute { consume(queue.takeAll()) } }  // the first wakes the consumer
/// ```
final class SubmissionQueue<Element: Sendable>: Sendable {
    fileprivate final class Node: AtomicReference, @unchecked Sendable {
        // Unchecked: `next` is written by the pushing thread before the node is published (the
        // compare-and-swap releases it), then only by the consumer, after it took the list (the
        // exchange acquires it) and owns it.
        let element: Element
        var next: Node?

        init(_ element: consuming Element) {
            self.element = element
        }
    }

    private let head = ManagedAtomic<Node?>(nil)

    init() {}

    /// Adds an element.
    /// - Returns: Whether the queue was empty: the caller must then make the consumer run
    ///   (every other push finds a consumer run pending).
    func push(_ element: consuming Element) -> Bool {
        let node = Node(element)
        var current = self.head.load(ordering: .relaxed)
        while true {
            node.next = current
            let (exchanged, original) = self.head.compareExchange(expected: current, desired: node, ordering: .releasing)
            if exchanged { return current == nil }
            current = original
        }
    }

    /// Takes every element pushed so far, oldest first.
    func takeAll() -> Batch {
        var node = self.head.exchange(nil, ordering: .acquiring)
        var oldest: Node?
        while let current = node {
            node = current.next
            current.next = oldest
            oldest = current
        }
        return Batch(node: oldest)
    }

    /// The elements ``takeAll()`` took, oldest first; each node is freed as the walk passes it.
    struct Batch: Sequence, IteratorProtocol {
        fileprivate var node: Node?

        mutating func next() -> Element? {
            guard let node = self.node else { return nil }
            self.node = node.next
            return node.element
        }
    }
}
