import NIOCore
import TetherCore

/// The inbox side of the engine: deliveries handed to the application one at a time.
extension ReliableEngine {
    /// A DELIVERY arrived on a connection to the gateway store `epoch`. On the event loop.
    func receive(_ delivery: Frame.Delivery, epoch: UInt64) -> DeliveryVerdict {
        let (verdict, handOut) = self.state.withValue {
            state -> (DeliveryVerdict, (Handoff<Result<Frame.Delivery?, TetherError>>, Frame.Delivery)?) in
            let verdict = state.inbox.received(delivery, epoch: epoch)
            guard verdict == .accepted, let consumer = state.consumer, let next = state.inbox.next() else { return (verdict, nil) }
            state.consumer = nil
            return (verdict, (consumer, next))
        }
        if let (consumer, next) = handOut {
            self.publishInbox()
            consumer.resolve(.success(next))
        }
        return verdict
    }

    /// The next delivery for the app; the one handed out before is processed from now on.
    /// - Returns: `nil` once the client has stopped, or when the calling task is cancelled.
    func nextDelivery() async throws(TetherError) -> Frame.Delivery? {
        let next = Handoff<Result<Frame.Delivery?, TetherError>>()
        return try await withTaskCancellationHandler {
            self.submit(.nextDelivery(next))
            return await next.value
        } onCancel: {
            self.submit(.stopWaitingForDelivery(next))
        }.get()
    }

    /// The app processed the delivery with this sequence (it was handed out and not yet
    /// processed). Answers from what the loop published; the inbox hears of it on the loop.
    func acknowledgeDelivery(_ sequence: UInt64) throws(TetherError) {
        guard
            sequence <= self.processedDeliveries.load(ordering: .acquiring)
                || sequence == self.heldDelivery.load(ordering: .acquiring)
        else {
            throw TetherError(code: .invalidArgument, message: "delivery \(sequence) is not the one the app holds")
        }
        self.submit(.acknowledgeDelivery(sequence))
    }

    /// The consumer stopped (its loop ended or threw): the delivery it held and did not
    /// acknowledge is handed out again.
    func consumerEnded() {
        self.submit(.consumerEnded)
    }

    // MARK: On the event loop

    func handOutDelivery(to consumer: Handoff<Result<Frame.Delivery?, TetherError>>) {
        let (answer, checkpointDue): (Result<Frame.Delivery?, TetherError>?, Bool) = self.state.withValue { state in
            guard state.consumer == nil else {
                return (.failure(TetherError(code: .invalidArgument, message: "another task is already consuming the deliveries")), false)
            }
            let next = state.inbox.next()  // the one handed out before is processed now
            let due = state.inbox.checkpointDue
            if let next { return (.success(next), due) }
            if state.finished { return (.success(nil), due) }
            state.consumer = consumer
            return (nil, due)
        }
        self.publishInbox()
        if checkpointDue { self.wakeup.continuation.yield() }
        if let answer { consumer.resolve(answer) }
    }

    func stopWaiting(_ consumer: Handoff<Result<Frame.Delivery?, TetherError>>) {
        let waited = self.state.withValue { state -> Bool in
            guard state.consumer === consumer else { return false }
            state.consumer = nil
            return true
        }
        if waited { consumer.resolve(.success(nil)) }
    }

    func processed(_ sequence: UInt64) {
        let checkpointDue = self.state.withValue { state in
            _ = state.inbox.acknowledge(sequence)
            return state.inbox.checkpointDue
        }
        self.publishInbox()
        if checkpointDue { self.wakeup.continuation.yield() }
    }

    func consumerStopped() {
        self.state.value.inbox.consumerStopped()
        self.publishInbox()
    }

    /// Publishes the delivery handed out and the last one processed, for ``acknowledgeDelivery(_:)``.
    func publishInbox() {
        let inbox = self.state.value.inbox
        self.heldDelivery.store(inbox.handedOut?.sequence ?? 0, ordering: .releasing)
        self.processedDeliveries.store(inbox.processed, ordering: .releasing)
    }
}
