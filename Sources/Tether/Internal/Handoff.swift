import Atomics

/// A one-shot handover of a value from the client's event loop to the task that waits for
/// it, without a lock: one compare-and-swap on each side.
///
/// ```swift
/// let reply = Handoff<Int>()
/// engine.submit(.count(reply))   // the event loop calls reply.resolve(42) once
/// let count = await reply.value
/// ```
final class Handoff<Value: Sendable>: @unchecked Sendable {
    // Unchecked: each side writes its own field (`result`, `waiter`) before the releasing
    // compare-and-swap that publishes it, and reads the other's only after an acquiring one
    // that saw it published; each field is written once.
    private let state = ManagedAtomic<UInt8>(HandoffState.empty)
    private var result: Value?
    private var waiter: UnsafeContinuation<Value, Never>?

    init() {}

    /// Settles the handoff; call once.
    func resolve(_ value: Value) {
        self.result = value
        let (exchanged, _) = self.state.compareExchange(
            expected: HandoffState.empty,
            desired: HandoffState.resolved,
            ordering: .acquiringAndReleasing
        )
        guard !exchanged else { return }  // nobody waits yet: `value` finds the result
        // The waiter is published.
        self.state.store(HandoffState.resolved, ordering: .releasing)
        self.waiter!.resume(returning: value)
    }

    /// The value, once the handoff is settled; await it once.
    var value: Value {
        get async {
            await withUnsafeContinuation { (continuation: UnsafeContinuation<Value, Never>) in
                self.waiter = continuation
                let (exchanged, _) = self.state.compareExchange(
                    expected: HandoffState.empty,
                    desired: HandoffState.waiting,
                    ordering: .acquiringAndReleasing
                )
                guard !exchanged else { return }  // `resolve` resumes it
                continuation.resume(returning: self.result!)
            }
        }
    }
}

/// The states of a ``Handoff``.
private enum HandoffState {
    static let empty: UInt8 = 0
    static let waiting: UInt8 = 1
    static let resolved: UInt8 = 2
}
