import Atomics
import NIOConcurrencyHelpers
import TetherGateway

/// A reliable message for the backend and the connection that sent it.
struct BatchedMessage: Sendable {
    var message: ReliableMessage
    var connection: ConnectionInfo
}

/// Reliable messages waiting for the backend, sent several to a call (the `messages` batch
/// event), the way a store commits a group of writes.
///
/// The gateway hands the proxy one message at a time per lane (a client's messages in order);
/// many lanes have one waiting at once. A message that finds fewer than ``maxCallsInFlight``
/// batch calls under way leads: it takes the messages waiting (up to ``maxMessages``, its own
/// first) into one call and gives each its own outcome. Others wait in line; when a call ends,
/// the first of them leads the next. The calls are made in the callers' own tasks (no task of
/// its own), and nothing is held but the line of messages waiting, one per lane at most.
final class MessageBatcher<Item: Sendable, Outcome: Sendable>: Sendable {
    /// The most messages in one call.
    let maxMessages: Int
    /// The most batch calls under way at once: one filling while another is in flight.
    let maxCallsInFlight: Int

    private let state = NIOLockedValueBox(State())
    /// Names each waiting message, so that its cancellation finds it in the line (an atomic:
    /// no lock besides joining the line and taking from it).
    private let nextID = ManagedAtomic<UInt64>(0)

    private struct State {
        var waiting: [Waiting] = []
        var leaders = 0
    }

    private struct Waiting {
        var id: UInt64
        var item: Item
        var continuation: CheckedContinuation<Wake, Never>
    }

    /// Why a waiting message's task goes on.
    private enum Wake {
        /// It leads the next call.
        case lead
        /// Its call ended.
        case done(Outcome)
        /// Its task was cancelled while it waited in line (it was in no call).
        case cancelled
    }

    init(maxMessages: Int, maxCallsInFlight: Int = 2) {
        precondition(maxMessages > 0 && maxCallsInFlight > 0)
        self.maxMessages = maxMessages
        self.maxCallsInFlight = maxCallsInFlight
    }

    /// How many messages wait in line for a call.
    var waitingCount: Int { self.state.withLockedValue { $0.waiting.count } }

    /// Processes `item` in a call with the others waiting.
    ///
    /// - Parameters:
    ///   - cancelled: The outcome of a message whose task is cancelled while it waits in line:
    ///     it leaves the line at once. (A message already in a call has that call's outcome.)
    ///   - send: makes one call for a batch and returns one outcome per message, in order (as
    ///     many as it was given).
    func process(_ item: Item, cancelled: @autoclosure () -> Outcome, send: ([Item]) async -> [Outcome]) async -> Outcome {
        let id = self.nextID.loadThenWrappingIncrement(ordering: .relaxed)
        let wake = await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Wake, Never>) in
                let wake = self.state.withLockedValue { state -> Wake? in
                    if state.leaders < self.maxCallsInFlight {
                        state.leaders += 1
                        return .lead
                    }
                    // Checked under the lock: a cancellation before this found nothing to take out.
                    if Task.isCancelled { return .cancelled }
                    state.waiting.append(Waiting(id: id, item: item, continuation: continuation))
                    return nil
                }
                if let wake { continuation.resume(returning: wake) }
            }
        } onCancel: {
            let waiting = self.state.withLockedValue { state -> Waiting? in
                guard let index = state.waiting.firstIndex(where: { $0.id == id }) else { return nil }
                return state.waiting.remove(at: index)
            }
            waiting?.continuation.resume(returning: .cancelled)
        }
        switch wake {
        case .cancelled:
            return cancelled()
        case .done(let outcome):
            return outcome
        case .lead:
            let followers = self.state.withLockedValue { state in
                let taken = Array(state.waiting.prefix(self.maxMessages - 1))
                state.waiting.removeFirst(taken.count)
                return taken
            }
            let outcomes = await send([item] + followers.map(\.item))
            precondition(outcomes.count == followers.count + 1, "a batch call gives one outcome per message")
            for (follower, outcome) in zip(followers, outcomes.dropFirst()) {
                follower.continuation.resume(returning: .done(outcome))
            }
            // The first message waiting leads the next call; with none, one call fewer is under way.
            let next = self.state.withLockedValue { state -> Waiting? in
                guard !state.waiting.isEmpty else {
                    state.leaders -= 1
                    return nil
                }
                return state.waiting.removeFirst()
            }
            next?.continuation.resume(returning: .lead)
            return outcomes[0]
        }
    }
}
