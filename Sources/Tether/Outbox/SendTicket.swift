import NIOConcurrencyHelpers
import TetherCore

/// The result of one ``ReliableEngine/send(topic:body:conversation:priority:ttl:)``, filled in by
/// whichever caller commits its group.
final class SendTicket: Sendable {
    private let state = NIOLockedValueBox<
        (result: Result<MessageReceipt, TetherError>?, waiter: CheckedContinuation<MessageReceipt, any Error>?)
    >(
        (nil, nil)
    )

    func resolve(_ result: Result<MessageReceipt, TetherError>) {
        let waiter = self.state.withLockedValue { state -> CheckedContinuation<MessageReceipt, any Error>? in
            state.result = result
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(with: result.mapError { $0 as any Error })
    }

    var value: MessageReceipt {
        get async throws(TetherError) {
            do {
                return try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<MessageReceipt, any Error>) in
                    let result = self.state.withLockedValue { state -> Result<MessageReceipt, TetherError>? in
                        if let result = state.result { return result }
                        state.waiter = continuation
                        return nil
                    }
                    if let result { continuation.resume(with: result.mapError { $0 as any Error }) }
                }
            } catch {
                throw error as? TetherError ?? TetherError(code: .storage, message: "\(error)")
            }
        }
    }
}
