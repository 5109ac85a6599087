import NIOCore
import TetherCore

/// The inbox side of the engine: deliveries handed to the application one at a time.
extension ReliableEngine {
    /// A DELIVERY arrived on a connection to the gateway store `epoch`.
    func receive(_ delivery: Frame.Delivery, epoch: UInt64) -> DeliveryVerdict {
        let (verdict, handOut) = self.state.withLockedValue {
            state -> (DeliveryVerdict, (CheckedContinuation<Frame.Delivery?, Never>, Frame.Delivery)?) in
            let verdict = state.inbox.received(delivery, epoch: epoch)
            guard verdict == .accepted, let consumer = state.consumer, let next = state.inbox.next() else { return (verdict, nil) }
            state.consumer = nil
            state.consuming = false
            return (verdict, (consumer, next))
        }
        if let (consumer, next) = handOut { consumer.resume(returning: next) }
        return verdict
    }

    /// The next delivery for the app; the one handed out before is processed from now on.
    /// - Returns: `nil` once the client has stopped.
    func nextDelivery() async throws(TetherError) -> Frame.Delivery? {
        let (immediate, checkpointDue): (Result<Frame.Delivery?, TetherError>?, Bool) = self.state.withLockedValue { state in
            guard !state.consuming else {
                return (.failure(TetherError(code: .invalidArgument, message: "another task is already consuming the deliveries")), false)
            }
            let next = state.inbox.next()  // the one handed out before is processed now
            let due = state.inbox.checkpointDue
            if let next { return (.success(next), due) }
            if state.finished { return (.success(nil), due) }
            state.consuming = true
            return (nil, due)
        }
        if checkpointDue { self.wakeup.continuation.yield() }
        if let immediate { return try immediate.get() }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Frame.Delivery?, Never>) in
                let ready: Frame.Delivery?? = self.state.withLockedValue { state in
                    if let next = state.inbox.next() {
                        state.consuming = false
                        return .some(next)
                    }
                    if state.finished || Task.isCancelled {
                        state.consuming = false
                        return .some(nil)
                    }
                    state.consumer = continuation
                    return .none
                }
                if let ready { continuation.resume(returning: ready) }
            }
        } onCancel: {
            let consumer = self.state.withLockedValue { state -> CheckedContinuation<Frame.Delivery?, Never>? in
                defer { state.consumer = nil; state.consuming = false }
                return state.consumer
            }
            consumer?.resume(returning: nil)
        }
    }

    /// The app processed the delivery with this sequence (it was handed out and not yet processed).
    func acknowledgeDelivery(_ sequence: UInt64) throws(TetherError) {
        let (known, checkpointDue) = self.state.withLockedValue { ($0.inbox.acknowledge(sequence), $0.inbox.checkpointDue) }
        guard known else {
            throw TetherError(code: .invalidArgument, message: "delivery \(sequence) is not the one the app holds")
        }
        if checkpointDue { self.wakeup.continuation.yield() }
    }

    /// The consumer stopped (its loop ended or threw): the delivery it held and did not
    /// acknowledge is handed out again.
    func consumerEnded() {
        self.state.withLockedValue { state in
            state.inbox.consumerStopped()
            state.consuming = false
        }
    }
}
