import NIOConcurrencyHelpers
import NIOCore
import TetherCore

/// One established connection, as the client's request path sees it.
///
/// Every operation hops onto the channel's event loop, where the handler lives.
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
    /// all: many callers at once cost one wake-up of the loop and one write, not one each.
    private let submissions = NIOLockedValueBox(Submissions())

    private struct Submissions: Sendable {
        var requests: [Submission] = []
        var hopScheduled = false
    }

    /// A request submitted from outside the event loop, and who waits for it.
    private struct Submission: Sendable {
        var request: Frame.Request
        var deadline: NIODeadline
        var waiter: ResponseWaiter
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
    }

    /// Sends `request` and waits for its response until `deadline`; task cancellation cancels it at once.
    ///
    /// From outside the event loop, the request and its waiting caller travel in the one hop
    /// that sends every submitted request: waiting on a future from outside the loop would cost
    /// a second hop per request, to register the callback.
    func execute(_ request: Frame.Request, deadline: NIODeadline) async throws -> ByteBuffer {
        let eventLoop = self.channel.eventLoop
        let handler = self.handler
        let id = request.id
        return try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (continuation: UnsafeContinuation<ByteBuffer, any Error>) in
                if eventLoop.inEventLoop {
                    handler.value.sendRequest(request, deadline: deadline, waiter: .continuation(continuation))
                } else {
                    // Checked under the lock that `cancel` takes: a cancellation either sees the
                    // request queued, or the request sees the cancellation.
                    self.submit(request, deadline: deadline, waiter: .continuation(continuation), unlessCancelled: true)
                }
            }
        } onCancel: {
            self.cancel(id)
        }
    }

    /// Sends `request` and calls `completion` with its response or error, at the latest when
    /// `deadline` passes; ``cancel(_:)`` with the request's id abandons it.
    ///
    /// `completion` runs on the event loop, inside the connection's handler: it must not block,
    /// and it may send the next request, which then leaves without a thread hop.
    func execute(
        _ request: Frame.Request,
        deadline: NIODeadline,
        completion: @escaping @Sendable (Result<ByteBuffer, TetherError>) -> Void
    ) {
        if self.channel.eventLoop.inEventLoop {
            self.handler.value.sendRequest(request, deadline: deadline, waiter: .callback(completion))
        } else {
            self.submit(request, deadline: deadline, waiter: .callback(completion), unlessCancelled: false)
        }
    }

    /// Queues a request submitted from outside the event loop for the next hop, and schedules
    /// the hop if none is. With `unlessCancelled`, a cancelled task's request fails at once.
    private func submit(_ request: Frame.Request, deadline: NIODeadline, waiter: ResponseWaiter, unlessCancelled: Bool) {
        enum Outcome {
            case hop
            case queued
            case cancelled
        }
        let outcome: Outcome = self.submissions.withLockedValue { submissions in
            if unlessCancelled, Task.isCancelled { return .cancelled }
            submissions.requests.append(Submission(request: request, deadline: deadline, waiter: waiter))
            defer { submissions.hopScheduled = true }
            return submissions.hopScheduled ? .queued : .hop
        }
        switch outcome {
        case .hop: self.channel.eventLoop.execute { self.sendSubmitted() }
        case .queued: break
        case .cancelled: waiter.fail(Self.cancelled(request.method))
        }
    }

    /// Cancels request `id`: takes it back if it still waits for the hop, or else tells the
    /// handler, after the hop that sent it. Nothing happens if the request has ended.
    func cancel(_ id: UInt64) {
        let waiting: Submission? = self.submissions.withLockedValue { submissions in
            guard let index = submissions.requests.firstIndex(where: { $0.request.id == id }) else { return nil }
            return submissions.requests.remove(at: index)
        }
        if let waiting {
            waiting.waiter.fail(Self.cancelled(waiting.request.method))
        } else {
            let handler = self.handler
            self.channel.eventLoop.execute { handler.value.cancelRequest(id: id) }
        }
    }

    private static func cancelled(_ method: String) -> TetherError {
        TetherError(code: .cancelled, message: "request '\(method)' was cancelled")
    }

    /// Sends every request submitted so far. On the event loop.
    private func sendSubmitted() {
        let submitted = self.submissions.withLockedValue { submissions in
            submissions.hopScheduled = false
            defer { submissions.requests.removeAll(keepingCapacity: true) }
            return submissions.requests
        }
        self.handler.value.sendRequests(submitted.lazy.map { (request: $0.request, deadline: $0.deadline, waiter: $0.waiter) })
    }

    /// Stops new requests and closes once those in flight are answered; at once on the event loop.
    func drain() {
        let handler = self.handler
        if self.channel.eventLoop.inEventLoop {
            handler.value.drain()
        } else {
            self.channel.eventLoop.execute { handler.value.drain() }
        }
    }

    /// Makes the heartbeat follow the client's current heartbeat mode.
    func refreshHeartbeatMode() {
        let handler = self.handler
        self.channel.eventLoop.execute { handler.value.refreshHeartbeatMode() }
    }

    /// Closes at once, on the client's own decision.
    func close() {
        let handler = self.handler
        if self.channel.eventLoop.inEventLoop {
            handler.value.closeAtClientRequest()
        } else {
            self.channel.eventLoop.execute { handler.value.closeAtClientRequest() }
        }
        self.channel.close(promise: nil)
    }
}

extension ClientConnection: ReliableSink {
    func enqueue(_ records: [OutboxRecord]) {
        guard !records.isEmpty else { return }
        let handler = self.handler
        self.channel.eventLoop.execute { handler.value.enqueueMessages(records) }
    }

    func replace(with tombstone: OutboxRecord) {
        let handler = self.handler
        self.channel.eventLoop.execute { handler.value.replaceMessage(with: tombstone) }
    }

    func acknowledgeDeliveries(upTo sequence: UInt64) {
        let handler = self.handler
        self.channel.eventLoop.execute { handler.value.acknowledgeDeliveries(upTo: sequence) }
    }
}
