import Atomics
import NIOCore
import TetherNIO

/// Routes pushes to the subscribers of their topic, and to the subscribers of all topics.
///
/// Routing takes no lock: it reads the topics from a snapshot that subscribing to a new topic
/// and dropping one (rare) replace under the lock.
final class PushRouter: Sendable {
    /// The topics as ``route(_:)`` reads them.
    private final class Snapshot: AtomicReference, Sendable {
        let topics: [String: Broadcaster<Push>]
        init(_ topics: [String: Broadcaster<Push>]) { self.topics = topics }
    }

    private let topics = TetherLock<[String: Broadcaster<Push>]>([:])
    /// Written under the lock of ``topics`` each time a topic is added or dropped.
    private let snapshot = ManagedAtomic(Snapshot([:]))
    private let everything: Broadcaster<Push>
    private let finished = TetherLock(false)
    private let bufferSize: Int

    init(bufferSize: Int) {
        self.bufferSize = bufferSize
        self.everything = Broadcaster(bufferSize: bufferSize)
    }

    /// Subscribes to one topic, or to every topic if `topic` is `nil`.
    func subscribe(topic: String?) -> AsyncStream<Push> {
        guard let topic else { return self.everything.subscribe() }
        return self.topics.withLockedValue { topics in
            // Subscribing under the lock, so that the topic cannot be dropped in between.
            if let existing = topics[topic] { return existing.subscribe() }
            let created = Broadcaster<Push>(bufferSize: self.bufferSize) { [weak self] in
                self?.dropTopic(topic)
            }
            if self.finished.withLockedValue({ $0 }) { created.finish() }
            topics[topic] = created
            self.snapshot.store(Snapshot(topics), ordering: .releasing)
            return created.subscribe()
        }
    }

    /// The number of topics with subscribers.
    var topicCount: Int { self.topics.withLockedValue { $0.count } }

    /// Forgets a topic whose last subscriber left (unless someone subscribed again meanwhile).
    private func dropTopic(_ topic: String) {
        self.topics.withLockedValue { topics in
            if let broadcaster = topics[topic], !broadcaster.hasSubscribers {
                topics[topic] = nil
                self.snapshot.store(Snapshot(topics), ordering: .releasing)
            }
        }
    }

    /// Delivers a push.
    /// - Returns: How many subscribers had to drop an old push to make room.
    func route(_ push: Push) -> Int {
        let broadcaster = self.snapshot.load(ordering: .acquiring).topics[push.topic]
        return (broadcaster?.yield(push) ?? 0) + self.everything.yield(push)
    }

    /// Ends every subscription.
    func finish() {
        let all = self.topics.withLockedValue { topics in
            self.finished.withLockedValue { $0 = true }
            return Array(topics.values)
        }
        for broadcaster in all { broadcaster.finish() }
        self.everything.finish()
    }
}
