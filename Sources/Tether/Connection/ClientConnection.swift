import NIOCore
import TetherCore
import TetherNIO

/// One established connection, as the client's request path sees it.
///
/// Every operation runs on the channel's event loop, where the handler lives: at once for a
/// caller already there, else in a hop.
final class ClientConnection: Sendable {
    let channel: any Channel
    let endpoint: Endpoint
    let negotiated: Handshake.Negotiated
    /// The delivery resume point its HELLO carried.
    let resume: Frame.Hello.Resume?
    /// Completes when the channel has closed, with the reason.
    let closeFuture: EventLoopFuture<ConnectionClosure>
    /// How long the credentials its HELLO carried stay valid, if they expire.
    let credentialValidFor: Duration?
    private let handler: NIOLoopBound<ClientConnectionHandler>
    /// Requests submitted from outside the event loop, waiting for the one hop that sends them
    /// all: many callers at once cost one wake-up of the loop and one write, not one each, and
    /// no lock.
    private let submissions = SubmissionQueue<Submission>()
    /// The hop that sends what waits in ``submissions``: made once, so that a hop allocates
    /// no closure.
    private let sendSubmissions: @Sendable () -> Void

    /// A request submitted from outside the event loop, and who waits for it.
    private struct Submission: Sendable {
        var request: Frame.Request
        var deadline: TetherInstant
        var waiter: ResponseWaiter
        /// Decides, for an `async` caller, whether the loop or a cancellation ends the request.
        var ticket: SubmissionTicket?
    }

    init(
        channel: any Channel,
        handler: NIOLoopBound<ClientConnectionHandler>,
        endpoint: Endpoint,
        resume: Frame.Hello.Resume?,
        negotiated: Handshake.Negotiated,
        closeFuture: EventLoopFuture<ConnectionClosure>,
        credentialValidFor: Duration? = nil
    ) {
        self.channel = channel
        self.handler = handler
        self.endpoint = endpoint
        self.resume = resume
        self.negotiated = negotiated
        self.closeFuture = closeFuture
        self.credentialValidFor = credentialValidFor
        let submissions = self.submissions
        self.sendSubmissions = {
            handler.value.sendSubmitted(
                submissions.takeAll().lazy
                    .filter { $0.ticket?.take() ?? true }  // a request cancelled on the way was answered already
                    .map { (request: $0.request, deadline: $0.deadline, waiter: $0.waiter) }
            )
        }
    }

    /// Sends `request` and waits for its response until `deadline`; task cancellation cancels it at once.
    ///
    /// From outside the event loop, the request and its waiting caller travel in the one hop
    /// that sends every submitted request: waiting on a future from outside the loop would cost
    /// a second hop per request, to register the callback. It runs on its caller's executor, as
    /// ``TetherClient/request(_:body:timeout:)`` does.
    nonisolated(nonsending) func execute(_ request: Frame.Request, deadline: TetherInstant) async throws -> ByteBuffer {
        let id = request.id
        let ticket = SubmissionTicket.make()
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<ByteBuffer, any Error>) in
                if self.channel.eventLoop.inEventLoop {
                    guard ticket.takeDirectly() else {
                        continuation.resume(throwing: Self.cancelled(request.method))
                        return
                    }
                    self.handler.value.sendRequest(request, deadline: deadline, waiter: .continuation(continuation))
                } else if ticket.publish(continuation) {
                    self.submit(Submission(request: request, deadline: deadline, waiter: .continuation(continuation), ticket: ticket))
                } else {
                    continuation.resume(throwing: Self.cancelled(request.method))
                }
            }
        } onCancel: {
            switch ticket.cancel() {
            case .beforePublished: break  // the operation sees it and ends at once
            case .waitingForHop(let continuation): continuation.resume(throwing: Self.cancelled(request.method))
            case .onTheLoop: self.cancel(id)
            }
        }
    }

    private static func cancelled(_ method: String) -> TetherError {
        TetherError(code: .cancelled, message: "request '\(method)' was cancelled")
    }

    /// Sends `request` and calls `completion` with its response or error, at the latest when
    /// `deadline` passes; ``cancel(_:)`` with the request's id abandons it.
    ///
    /// `completion` runs on the event loop, inside the connection's handler: it must not block,
    /// and it may send the next request, which then leaves without a thread hop.
    func execute(
        _ request: Frame.Request,
        deadline: TetherInstant,
        completion: @escaping @Sendable (Result<ByteBuffer, TetherError>) -> Void
    ) {
        self.execute(request, deadline: deadline, waiter: .callback(completion))
    }

    private func execute(_ request: Frame.Request, deadline: TetherInstant, waiter: ResponseWaiter) {
        if self.channel.eventLoop.inEventLoop {
            self.handler.value.sendRequest(request, deadline: deadline, waiter: waiter)
        } else {
            self.submit(Submission(request: request, deadline: deadline, waiter: waiter, ticket: nil))
        }
    }

    private func submit(_ submission: consuming Submission) {
        guard self.submissions.push(submission) else { return }  // a hop is already on its way
        self.channel.eventLoop.execute(self.sendSubmissions)
    }

    /// Cancels request `id`, wherever it is: waiting for the hop, queued, or on the wire.
    /// Nothing happens if the request has ended.
    func cancel(_ id: UInt64) {
        self.handler.execute { $0.cancelRequest(id: id) }
    }

    /// Stops new requests and closes once those in flight are answered; at once on the event loop.
    func drain(for reason: DisconnectReason = .shutdown) {
        self.onLoop { $0.drain(for: reason) }
    }

    /// Writes a channel frame (SUBSCRIBE, UNSUBSCRIBE) and flushes it, on the event loop.
    func send(_ payload: Frame.Payload) {
        self.handler.execute(passing: payload) { handler, payload in
            handler.write(payload)
            handler.flushSoon()
        }
    }

    /// Makes the heartbeat follow the client's current heartbeat mode.
    func refreshHeartbeatMode() {
        self.onLoop { $0.refreshHeartbeatMode() }
    }

    /// Closes at once, on the client's own decision.
    func close() {
        self.onLoop { $0.closeAtClientRequest() }
        self.channel.close(promise: nil)
    }

    private func onLoop(_ body: @escaping @Sendable (ClientConnectionHandler) -> Void) {
        self.handler.execute(body)
    }
}

extension ClientConnection: ReliableSink {
    func enqueue(_ records: [OutboxRecord]) {
        guard !records.isEmpty else { return }
        // Always queued, even from the loop (see ReliableSink): the loop runs what is queued in
        // order, so groups reach the connection in the order the engine committed them.
        let handler = self.handler
        handler.eventLoop.execute { handler.value.enqueueMessages(records) }
    }

    func replace(with tombstone: OutboxRecord) {
        self.onLoop { $0.replaceMessage(with: tombstone) }
    }

    func acknowledgeDeliveries(upTo sequence: UInt64) {
        self.handler.execute(passing: sequence) { $0.acknowledgeDeliveries(upTo: $1) }
    }
}
