/// A sender's place in the engine, from ``ReliableEngine/send(topic:body:conversation:priority:ttl:traceContext:)``
/// until the event loop answers it: one object, no lock, no atomic.
///
/// The sending task sets ``continuation`` before it submits the send, and the queue that
/// carries the send to the loop publishes it; from then on only the loop touches the ticket.
/// A cancellation reaches the loop as a command of its own, which may overtake the send: the
/// loop then marks the ticket (``cancelled``), and the send, arriving, is refused rather than
/// left waiting for room.
final class SendTicket: @unchecked Sendable {
    // Unchecked: `continuation` is written by the sending task before the send is queued, then
    // read by the loop only; `cancelled` is the loop's alone.
    var continuation: UnsafeContinuation<ReliableEngine.SendStep, Never>?
    var cancelled = false

    init() {}

    /// Answers the sender; once, on the loop.
    func resume(_ step: ReliableEngine.SendStep) {
        self.continuation!.resume(returning: step)
    }
}
