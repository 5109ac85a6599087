import NIOConcurrencyHelpers
import NIOCore

/// Routes pushes to the subscribers of their topic, and to the subscribers of all topics.
final class PushRouter: Sendable {
    private let topics = NIOLockedValueBox<[String: Broadcaster<Push>]>([:])
    private let everything: Broadcaster<Push>
    private let finished = NIOLockedValueBox(false)
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
            }
        }
    }

    /// Delivers a push.
    /// - Returns: How many subscribers had to drop an old push to make room.
    func route(_ push: Push) -> Int {
        let broadcaster = self.topics.withLockedValue { $0[push.topic] }
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
