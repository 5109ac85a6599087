import Atomics
import NIOCore

/// Decides, without a lock, who ends an `async` request submitted from outside the event loop:
/// the loop that sends it, or a cancellation that arrives while the request still waits for its
/// hop — which then ends it at once, and the loop never sends it.
///
/// The caller's continuation is published once; exactly one of ``take()`` and ``cancel()`` wins it.
/// One allocation per request: the continuation is the buffer's header and the atomic state its
/// one element (a `ManagedAtomic` would be a second object).
///
/// ```swift
/// let ticket = SubmissionTicket.make()
/// if ticket.publish(continuation) { queue.push(…) }    // the caller
/// if ticket.take() { send(…) }                         // the event loop, after the hop
/// ```
struct SubmissionTicket: @unchecked Sendable {
    // Unchecked: the continuation (the header) is written once, before the releasing exchange
    // that publishes it, and read only by the side whose acquiring exchange won it.

    private final class Buffer: ManagedBuffer<UnsafeContinuation<ByteBuffer, any Error>?, UnsafeAtomic<UInt8>.Storage> {}
    private let buffer: Buffer

    private enum State {
        static let created: UInt8 = 0
        static let published: UInt8 = 1
        static let taken: UInt8 = 2
        static let cancelled: UInt8 = 3
    }

    /// A ticket for a request that has not published its continuation yet.
    static func make() -> SubmissionTicket {
        let buffer = Buffer.create(minimumCapacity: 1) { _ in nil }
        buffer.withUnsafeMutablePointerToElements { $0.initialize(to: UnsafeAtomic<UInt8>.Storage(State.created)) }
        return SubmissionTicket(buffer: unsafeDowncast(buffer, to: Buffer.self))
    }

    /// Runs `body` with the ticket's state.
    private func withState<T>(_ body: (UnsafeAtomic<UInt8>) -> T) -> T {
        self.buffer.withUnsafeMutablePointerToElements { body(UnsafeAtomic(at: $0)) }
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
        self.buffer.header = continuation
        return self.exchange(from: State.created, to: State.published)
    }

    /// Claims the request for a caller already on the loop (no hop to wait for).
    /// - Returns: `false` if it was cancelled before.
    func takeDirectly() -> Bool {
        self.exchange(from: State.created, to: State.taken)
    }

    /// Claims the request for the loop; `false` if a cancellation ended it on the way.
    func take() -> Bool {
        self.exchange(from: State.published, to: State.taken)
    }

    private func exchange(from expected: UInt8, to desired: UInt8) -> Bool {
        self.withState { $0.compareExchange(expected: expected, desired: desired, ordering: .acquiringAndReleasing).exchanged }
    }

    /// Claims the request for a cancellation.
    func cancel() -> Cancellation {
        var current = self.withState { $0.load(ordering: .acquiring) }
        while true {
            switch current {
            case State.created, State.published:
                let (exchanged, original) = self.withState {
                    $0.compareExchange(expected: current, desired: State.cancelled, ordering: .acquiringAndReleasing)
                }
                guard exchanged else {
                    current = original
                    continue
                }
                guard current == State.published, let continuation = self.buffer.header else { return .beforePublished }
                return .waitingForHop(continuation)
            case State.taken:
                return .onTheLoop
            default:
                return .beforePublished  // cancelled already: nothing more to do
            }
        }
    }
}
