import Atomics

/// Hands elements from any thread to one consumer without a lock: producers push with one
/// compare-and-swap, the consumer takes everything at once with one exchange (a Treiber stack,
/// read back in order).
///
/// ```swift
/// if queue.push(submission) { loop.execute { consume(queue.takeAll()) } }  // the first wakes the consumer
/// ```
final class SubmissionQueue<Element: Sendable>: Sendable {
    private final class Node: AtomicReference, @unchecked Sendable {
        // Unchecked: `next` is written by the pushing thread before the node is published (the
        // compare-and-swap releases it) and read by the consumer after it took the list (the
        // exchange acquires it); nobody writes it afterwards.
        let element: Element
        var next: Node?

        init(_ element: Element) {
            self.element = element
        }
    }

    private let head = ManagedAtomic<Node?>(nil)

    init() {}

    /// Adds an element.
    /// - Returns: Whether the queue was empty: the caller must then make the consumer run
    ///   (every other push finds a consumer run pending).
    func push(_ element: Element) -> Bool {
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
    func takeAll() -> [Element] {
        var node = self.head.exchange(nil, ordering: .acquiring)
        var elements: [Element] = []
        while let current = node {
            elements.append(current.element)
            node = current.next
        }
        return elements.reversed()
    }
}
