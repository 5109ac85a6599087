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
    /// Completes when the channel has closed, with the reason.
    let closeFuture: EventLoopFuture<ConnectionClosure>
    private let handler: NIOLoopBound<ClientConnectionHandler>
    /// Requests submitted from outside the event loop, waiting for the one hop that sends them
    /// all: many callers at once cost one wake-up of the loop and one write, not one each.
    private let submissions = NIOLockedValueBox(Submissions())

    private struct Submissions: Sendable {
        var requests: [ClientConnectionHandler.RequestSubmission] = []
        var hopScheduled = false
    }

    init(
        channel: any Channel,
        handler: NIOLoopBound<ClientConnectionHandler>,
        endpoint: Endpoint,
        negotiated: Handshake.Negotiated,
        closeFuture: EventLoopFuture<ConnectionClosure>
    ) {
        self.channel = channel
        self.handler = handler
        self.endpoint = endpoint
        self.negotiated = negotiated
        self.closeFuture = closeFuture
    }

    /// Sends `request` and waits for its response until `deadline`; task cancellation cancels it at once.
    func execute(_ request: Frame.Request, deadline: NIODeadline) async throws -> ByteBuffer {
        let eventLoop = self.channel.eventLoop
        let promise = eventLoop.makePromise(of: ByteBuffer.self)
        let handler = self.handler
        if eventLoop.inEventLoop {
            handler.value.sendRequest(request, deadline: deadline, promise: promise)
        } else {
            let hop = self.submissions.withLockedValue { submissions in
                submissions.requests.append((request, deadline, promise))
                defer { submissions.hopScheduled = true }
                return !submissions.hopScheduled
            }
            if hop { eventLoop.execute { self.sendSubmitted() } }
        }
        let id = request.id
        return try await withTaskCancellationHandler {
            try await promise.futureResult.get()
        } onCancel: {
            eventLoop.execute { handler.value.cancelRequest(id: id) }
        }
    }

    /// Sends every request submitted so far. On the event loop.
    private func sendSubmitted() {
        let requests = self.submissions.withLockedValue { submissions in
            submissions.hopScheduled = false
            defer { submissions.requests.removeAll(keepingCapacity: true) }
            return submissions.requests
        }
        self.handler.value.sendRequests(requests)
    }

    /// Stops new requests and closes once those in flight are answered.
    func drain() {
        let handler = self.handler
        self.channel.eventLoop.execute { handler.value.drain() }
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
