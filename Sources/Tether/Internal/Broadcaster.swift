import Atomics
import TetherNIO

/// Fans elements out to any number of `AsyncStream` subscribers.
///
/// Publishing takes no lock: it reads the subscribers from a snapshot that subscribing and
/// unsubscribing (rare) replace under the lock.
final class Broadcaster<Element: Sendable>: Sendable {
    private struct State {
        var nextID = 0
        var subscribers: [Int: AsyncStream<Element>.Continuation] = [:]
        var finished = false
    }

    /// The subscribers as ``yield(_:)`` reads them.
    private final class Snapshot: AtomicReference, Sendable {
        let subscribers: [AsyncStream<Element>.Continuation]
        init(_ subscribers: [AsyncStream<Element>.Continuation]) { self.subscribers = subscribers }
    }

    private let state = TetherLock(State())
    /// Written under the lock, each time the subscribers change.
    private let snapshot = ManagedAtomic(Snapshot([]))
    private let bufferSize: Int
    private let onLastSubscriberGone: (@Sendable () -> Void)?

    /// - Parameters:
    ///   - bufferSize: How many elements a slow subscriber may fall behind before its oldest
    ///     ones are dropped.
    ///   - onLastSubscriberGone: Called when a subscription ends and none is left.
    init(bufferSize: Int, onLastSubscriberGone: (@Sendable () -> Void)? = nil) {
        self.bufferSize = bufferSize
        self.onLastSubscriberGone = onLastSubscriberGone
    }

    /// A stream of the elements published from now on; finished when the broadcaster is.
    func subscribe() -> AsyncStream<Element> {
        let (stream, continuation) = AsyncStream.makeStream(of: Element.self, bufferingPolicy: .bufferingNewest(self.bufferSize))
        let id: Int? = self.state.withLockedValue { state in
            guard !state.finished else { return nil }
            let id = state.nextID
            state.nextID += 1
            state.subscribers[id] = continuation
            self.snapshot.store(Snapshot(Array(state.subscribers.values)), ordering: .releasing)
            return id
        }
        guard let id else {
            continuation.finish()
            return stream
        }
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            let empty = self.state.withLockedValue { state in
                state.subscribers.removeValue(forKey: id)
                self.snapshot.store(Snapshot(Array(state.subscribers.values)), ordering: .releasing)
                return state.subscribers.isEmpty && !state.finished
            }
            if empty { self.onLastSubscriberGone?() }
        }
        return stream
    }

    /// Publishes an element to every subscriber.
    /// - Returns: How many subscribers had to drop an element because they fell behind.
    @discardableResult
    func yield(_ element: Element) -> Int {
        var dropped = 0
        for subscriber in self.snapshot.load(ordering: .acquiring).subscribers {
            if case .dropped = subscriber.yield(element) { dropped += 1 }
        }
        return dropped
    }

    /// Whether anyone is subscribed.
    var hasSubscribers: Bool { !self.snapshot.load(ordering: .acquiring).subscribers.isEmpty }

    /// Ends every stream; later subscriptions end at once.
    func finish() {
        let subscribers = self.state.withLockedValue { state in
            state.finished = true
            self.snapshot.store(Snapshot([]), ordering: .releasing)
            defer { state.subscribers.removeAll() }
            return Array(state.subscribers.values)
        }
        for subscriber in subscribers { subscriber.finish() }
    }
}
