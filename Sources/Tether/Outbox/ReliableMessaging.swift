public import NIOCore
public import TetherCore

/// What identifies a message ``TetherClient/send(_:body:conversation:priority:ttl:)`` accepted.
public struct MessageReceipt: Sendable, Hashable {
    /// The client message id; stable across restarts of the app.
    public var id: UInt64
    public var conversation: String
    /// The message's position in its conversation.
    public var sequence: UInt64
}

/// A change in a message's state, published on ``TetherClient/messageEvents``.
public struct MessageEvent: Sendable, Hashable, CustomStringConvertible {
    public enum State: Sendable, Hashable {
        /// Stored durably in the outbox.
        case queued
        /// Sent to the gateway for the first time.
        case sent
        /// Finished.
        case finished(MessageOutcome)
    }

    public var id: UInt64
    public var conversation: String
    public var sequence: UInt64
    public var state: State

    public var description: String {
        switch self.state {
        case .queued: "message \(self.id) queued"
        case .sent: "message \(self.id) sent"
        case .finished(let outcome): "message \(self.id) \(outcome)"
        }
    }
}

/// A reliable delivery from the gateway (PROTOCOL.md, section 9.2).
public struct Delivery: Sendable, Hashable {
    /// Its number in this client's stream of deliveries.
    public var sequence: UInt64
    public var topic: String
    public var body: ByteBuffer
}

extension ClientConfiguration {
    /// Reliable messaging: an outbox for ``TetherClient/send(_:body:conversation:priority:ttl:)``
    /// and ordered, exactly-once ``TetherClient/deliveries()``.
    public struct Reliability: Sendable {
        /// Where accepted messages and the delivery checkpoint are kept.
        public var outbox: any OutboxStore
        /// How many unacknowledged messages the outbox holds at most.
        public var capacity: Int
        /// What ``TetherClient/send(_:body:conversation:priority:ttl:)`` does when the outbox is full.
        public var whenFull: WhenFull
        /// How many messages may be sent and unacknowledged at once on a connection.
        public var window: Int
        /// How long to wait for an acknowledgement before sending a message again: derived from
        /// the measured round trip, within these bounds.
        public var retransmission: RTTEstimator

        /// - Parameter outbox: ``SQLiteOutboxStore`` to survive the app being killed;
        ///   ``InMemoryOutboxStore`` otherwise.
        public init(
            outbox: any OutboxStore,
            capacity: Int = 10_000,
            whenFull: WhenFull = .wait,
            window: Int = 256,
            retransmission: RTTEstimator = RTTEstimator()
        ) throws(ConfigurationError) {
            self.outbox = outbox
            self.capacity = capacity
            self.whenFull = whenFull
            self.window = window
            self.retransmission = retransmission
            try self.validate()
        }

        public func validate() throws(ConfigurationError) {
            guard self.capacity >= 1 else { throw ConfigurationError("reliability.capacity must be at least 1") }
            guard self.window >= 1 else { throw ConfigurationError("reliability.window must be at least 1") }
            let bounds = self.retransmission
            guard bounds.minimumTimeout > .zero, bounds.maximumTimeout >= bounds.minimumTimeout else {
                throw ConfigurationError("reliability.retransmission needs 0 < minimumTimeout <= maximumTimeout")
            }
        }

        /// What a full outbox does to a new message.
        public enum WhenFull: Sendable, Hashable {
            /// `send` waits until acknowledgements make room (or its task is cancelled).
            case wait
            /// `send` fails at once with ``TetherError/Code/outboxFull``.
            case fail
        }
    }
}
