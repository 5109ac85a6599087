import NIOCore
import TetherCore

/// The inbox side of the engine: deliveries handed to the application one at a time.
extension ReliableEngine {
    /// A DELIVERY arrived on a connection to the gateway store `epoch`. On the event loop.
    func receive(_ delivery: Frame.Delivery, epoch: UInt64) -> DeliveryVerdict {
        let (verdict, handOut) = self.state.withValue {
            state -> (DeliveryVerdict, (UnsafeContinuation<Result<Frame.Delivery?, TetherError>, Never>, Frame.Delivery)?) in
            let verdict = state.inbox.received(delivery, epoch: epoch)
            guard verdict == .accepted, let consumer = state.consumer, let next = state.inbox.next() else { return (verdict, nil) }
            state.consumer = nil
            return (verdict, (consumer, next))
        }
        if let (consumer, next) = handOut {
            self.publishInbox()
            consumer.resume(returning: .success(next))
        }
        return verdict
    }

    /// The next delivery for the app; the one handed out before is processed from now on.
    /// - Returns: `nil` once the client has stopped, or when the calling task is cancelled.
    func nextDelivery() async throws(TetherError) -> Frame.Delivery? {
        // One consumer at a time: the flag is this call's. Set before the command that stops
        // the wait, it keeps the loop from parking a consumer whose stop overtook it.
        self.consumerCancelled.store(false, ordering: .relaxed)
        return try await withTaskCancellationHandler {
            await withUnsafeContinuation { self.submit(.nextDelivery($0)) }
        } onCancel: {
            self.consumerCancelled.store(true, ordering: .releasing)
            self.submit(.stopWaitingForDelivery)
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

    func handOutDelivery(to consumer: UnsafeContinuation<Result<Frame.Delivery?, TetherError>, Never>) {
        let (answer, checkpointDue): (Result<Frame.Delivery?, TetherError>?, Bool) = self.state.withValue { state in
            guard state.consumer == nil else {
                return (.failure(TetherError(code: .invalidArgument, message: "another task is already consuming the deliveries")), false)
            }
            let next = state.inbox.next()  // the one handed out before is processed now
            let due = state.inbox.checkpointDue
            if let next { return (.success(next), due) }
            if state.finished || self.consumerCancelled.load(ordering: .acquiring) { return (.success(nil), due) }
            state.consumer = consumer
            return (nil, due)
        }
        self.publishInbox()
        if checkpointDue { self.storageWorkDue() }
        if let answer { consumer.resume(returning: answer) }
    }

    func stopWaitingForDelivery() {
        let consumer = self.state.withValue { state in
            defer { state.consumer = nil }
            return state.consumer
        }
        consumer?.resume(returning: .success(nil))
    }

    func processed(_ sequence: UInt64) {
        let checkpointDue = self.state.withValue { state in
            _ = state.inbox.acknowledge(sequence)
            return state.inbox.checkpointDue
        }
        self.publishInbox()
        if checkpointDue { self.storageWorkDue() }
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
