import NIOConcurrencyHelpers

/// Wakes the delivery pumps of recipients when new deliveries were committed for them.
final class DeliveryNotifier: Sendable {
    private struct State {
        var nextID = 0
        var pumps: [String: [Int: AsyncStream<Void>.Continuation]] = [:]
    }

    private let state = NIOLockedValueBox(State())

    /// Registers a pump's wakeup continuation for a recipient.
    /// - Returns: A token for ``unregister(_:recipient:)``.
    func register(_ wakeup: AsyncStream<Void>.Continuation, for recipient: String) -> Int {
        self.state.withLockedValue { state in
            let id = state.nextID
            state.nextID += 1
            state.pumps[recipient, default: [:]][id] = wakeup
            return id
        }
    }

    func unregister(_ token: Int, recipient: String) {
        self.state.withLockedValue { state in
            state.pumps[recipient]?[token] = nil
            if state.pumps[recipient]?.isEmpty == true { state.pumps[recipient] = nil }
        }
    }

    /// Wakes the pumps of these recipients.
    func notify<Recipients: Sequence<String>>(_ recipients: Recipients) {
        let wakeups = self.state.withLockedValue { state in
            Set(recipients).flatMap { state.pumps[$0]?.values.map { $0 } ?? [] }
        }
        for wakeup in wakeups { wakeup.yield() }
    }
}
