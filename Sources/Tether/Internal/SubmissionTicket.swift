import Atomics
import NIOCore

/// Decides, without a lock, who ends an `async` request submitted from outside the event loop:
/// the loop that sends it, or a cancellation that arrives while the request still waits for its
/// hop — which then ends it at once, and the loop never sends it.
///
/// The caller's continuation is published once; exactly one of ``take()`` and ``cancel()`` wins it.
final class SubmissionTicket: @unchecked Sendable {
    // Unchecked: `continuation` is written once, before the releasing exchange that publishes it,
    // and read only by the side whose acquiring exchange won it.
    private let state = ManagedAtomic<UInt8>(State.created)
    private var continuation: UnsafeContinuation<ByteBuffer, any Error>?

    private enum State {
        static let created: UInt8 = 0
        static let published: UInt8 = 1
        static let taken: UInt8 = 2
        static let cancelled: UInt8 = 3
    }

    /// What a cancellation found.
    enum Cancellation {
        /// The operation has not published its continuation yet: it will see the cancellation.
        case beforePublished
        /// The request still waits for its hop: the canceller owns the continuation and resumes it.
        case waitingForHop(UnsafeContinuation<ByteBuffer, any Error>)
        /// The loop took the request: cancel it there.
        case onTheLoop
    }

    /// Publishes the caller's continuation; `false` if the request was cancelled before.
    func publish(_ continuation: UnsafeContinuation<ByteBuffer, any Error>) -> Bool {
        self.continuation = continuation
        return self.state.compareExchange(expected: State.created, desired: State.published, ordering: .acquiringAndReleasing).exchanged
    }

    /// Claims the request for a caller already on the loop (no hop to wait for).
    /// - Returns: `false` if it was cancelled before.
    func takeDirectly() -> Bool {
        self.state.compareExchange(expected: State.created, desired: State.taken, ordering: .acquiringAndReleasing).exchanged
    }

    /// Claims the request for the loop; `false` if a cancellation ended it on the way.
    func take() -> Bool {
        self.state.compareExchange(expected: State.published, desired: State.taken, ordering: .acquiringAndReleasing).exchanged
    }

    /// Claims the request for a cancellation.
    func cancel() -> Cancellation {
        var current = self.state.load(ordering: .acquiring)
        while true {
            switch current {
            case State.created, State.published:
                let (exchanged, original) = self.state.compareExchange(
                    expected: current,
                    desired: State.cancelled,
                    ordering: .acquiringAndReleasing
                )
                guard exchanged else {
                    current = original
                    continue
                }
                guard current == State.published, let continuation = self.continuation else { return .beforePublished }
                return .waitingForHop(continuation)
            case State.taken:
                return .onTheLoop
            default:
                return .beforePublished  // cancelled already: nothing more to do
            }
        }
    }
}
