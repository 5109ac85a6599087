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
        let broadcaster = self.topics.withLockedValue { topics in
            if let existing = topics[topic] { return existing }
            let created = Broadcaster<Push>(bufferSize: self.bufferSize)
            if self.finished.withLockedValue({ $0 }) { created.finish() }
            topics[topic] = created
            return created
        }
        return broadcaster.subscribe()
    }

    /// Delivers a push.
    /// - Returns: How many subscribers had to drop an old push to make room.
    func route(_ push: Push) -> Int {
        let broadcaster = self.topics.withLockedValue { topics -> Broadcaster<Push>? in
            guard let broadcaster = topics[push.topic] else { return nil }
            if !broadcaster.hasSubscribers {
                topics[push.topic] = nil  // nobody listens any more
                return nil
            }
            return broadcaster
        }
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
