import Atomics
import TetherCore

/// The result of one ``ReliableEngine/send(topic:body:conversation:priority:ttl:)``, filled in by
/// whichever caller commits its group, and awaited by the caller that sent it: a one-shot
/// handover without a lock (one compare-and-swap on each side).
final class SendTicket: @unchecked Sendable {
    // Unchecked: each side writes its own field (`result`, `waiter`) before the releasing
    // compare-and-swap that publishes it, and reads the other's only after an acquiring one
    // that saw it published; each field is written once.
    private let state = ManagedAtomic<UInt8>(State.empty)
    private var result: Result<MessageReceipt, TetherError>?
    private var waiter: CheckedContinuation<MessageReceipt, any Error>?

    private enum State {
        static let empty: UInt8 = 0
        static let waiting: UInt8 = 1
        static let resolved: UInt8 = 2
    }

    /// Settles the ticket; call once.
    func resolve(_ result: Result<MessageReceipt, TetherError>) {
        self.result = result
        let (exchanged, _) = self.state.compareExchange(
            expected: State.empty,
            desired: State.resolved,
            ordering: .acquiringAndReleasing
        )
        guard !exchanged else { return }  // nobody waits yet: `value` finds the result
        // The sender waits: its continuation is published.
        self.state.store(State.resolved, ordering: .releasing)
        self.waiter!.resume(with: result.mapError { $0 as any Error })
    }

    /// The result, once the ticket is settled; await it once.
    var value: MessageReceipt {
        get async throws(TetherError) {
            do {
                return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<MessageReceipt, any Error>) in
                    self.waiter = continuation
                    let (exchanged, _) = self.state.compareExchange(
                        expected: State.empty,
                        desired: State.waiting,
                        ordering: .acquiringAndReleasing
                    )
                    guard !exchanged else { return }  // `resolve` resumes it
                    continuation.resume(with: self.result!.mapError { $0 as any Error })
                }
            } catch {
                throw error as? TetherError ?? TetherError(code: .storage, message: "\(error)")
            }
        }
    }
}
