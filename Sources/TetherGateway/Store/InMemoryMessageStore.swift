public import Foundation
import NIOCore
public import TetherCore
import TetherNIO

/// A ``MessageStore`` in memory, for tests and for gateways that may lose their state on restart.
public final class InMemoryMessageStore: MessageStore {
    private struct ConversationKey: Hashable {
        var outbox: OutboxID
        var conversation: String
    }

    private struct Stream {
        var next: UInt64 = 1
        var deliveries: [StoredDelivery] = []  // ascending by sequence
    }

    private struct State {
        var outboxes: [OutboxID: Date] = [:]  // last seen
        var lastProcessed: [ConversationKey: UInt64] = [:]
        var outcomes: [ConversationKey: [UInt64: RecordedOutcome]] = [:]
        var streams: [String: Stream] = [:]
    }

    public let epoch: UInt64
    private let state = TetherLock(State())

    /// Creates an empty store with a random epoch.
    public init() {
        self.epoch = UInt64.random(in: 1...UInt64.max)
    }

    public func touchOutboxes(_ outboxes: [OutboxID], at time: Date) async throws {
        self.state.withLockedValue { state in
            for outbox in outboxes { state.outboxes[outbox] = max(state.outboxes[outbox] ?? time, time) }
        }
    }

    public func forgetOutboxes(notSeenSince time: Date) async throws -> Int {
        self.state.withLockedValue { state in
            let forgotten = Set(state.outboxes.lazy.filter { $0.value < time }.map(\.key))
            guard !forgotten.isEmpty else { return 0 }
            for outbox in forgotten { state.outboxes[outbox] = nil }
            state.lastProcessed = state.lastProcessed.filter { !forgotten.contains($0.key.outbox) }
            state.outcomes = state.outcomes.filter { !forgotten.contains($0.key.outbox) }
            return forgotten.count
        }
    }

    public func dedupState(of outbox: OutboxID, conversations: Set<String>, outcomes: [ConversationSequence]) async throws -> DedupState {
        self.state.withLockedValue { state in
            var result = DedupState()
            for conversation in conversations {
                result.lastProcessed[conversation] = state.lastProcessed[ConversationKey(outbox: outbox, conversation: conversation)] ?? 0
            }
            for position in outcomes {
                let key = ConversationKey(outbox: outbox, conversation: position.conversation)
                if let outcome = state.outcomes[key]?[position.sequence] { result.outcomes[position] = outcome }
            }
            return result
        }
    }

    public func apply(_ writes: [StoreWrite]) async throws -> [Result<[DeliveryReceipt], MessageStoreError>] {
        self.state.withLockedValue { state in
            writes.map { write in Self.apply(write, to: &state) }
        }
    }

    private static func apply(_ write: StoreWrite, to state: inout State) -> Result<[DeliveryReceipt], MessageStoreError> {
        // Check everything first: nothing is written unless all of it can be.
        var last: [ConversationKey: UInt64] = [:]
        for message in write.processed {
            let key = ConversationKey(outbox: message.outbox, conversation: message.conversation)
            let current = last[key] ?? state.lastProcessed[key] ?? 0
            guard message.sequence == current + 1 else {
                return .failure(
                    MessageStoreError(
                        code: .conflict,
                        message: "message \(message.sequence) of '\(message.conversation)' does not follow \(current)"
                    )
                )
            }
            last[key] = message.sequence
        }
        for message in write.processed {
            let key = ConversationKey(outbox: message.outbox, conversation: message.conversation)
            state.lastProcessed[key] = message.sequence
            state.outcomes[key, default: [:]][message.sequence] = RecordedOutcome(status: message.status, messageID: message.messageID)
            // Sequences follow one another: the one leaving the window is the one to forget.
            if message.sequence > messageStoreOutcomeWindow { state.outcomes[key]?[message.sequence - messageStoreOutcomeWindow] = nil }
        }
        let receipts = write.deliveries.map { delivery in
            var stream = state.streams[delivery.recipient] ?? Stream()
            let sequence = stream.next
            stream.next += 1
            stream.deliveries.append(
                StoredDelivery(sequence: sequence, topic: delivery.topic, body: delivery.body, compressed: delivery.compressed)
            )
            state.streams[delivery.recipient] = stream
            return DeliveryReceipt(recipient: delivery.recipient, sequence: sequence)
        }
        for (recipient, sequence) in write.acknowledgements {
            state.streams[recipient]?.deliveries.removeAll { $0.sequence <= sequence }
        }
        return .success(receipts)
    }

    public func deliveries(for recipient: String, after sequence: UInt64, limit: Int) async throws -> [StoredDelivery] {
        self.state.withLockedValue { state in
            guard let stream = state.streams[recipient] else { return [] }
            return Array(stream.deliveries.lazy.filter { $0.sequence > sequence }.prefix(max(0, limit)))
        }
    }

    public func totalUsage() async throws -> StreamUsage? {
        self.state.withLockedValue { state in
            var total = StreamUsage(deliveries: 0, bytes: 0)
            for stream in state.streams.values {
                total.deliveries += stream.deliveries.count
                total.bytes += stream.deliveries.reduce(0) { $0 + $1.body.readableBytes }
            }
            return total
        }
    }

    public func usage(of recipients: [String]) async throws -> [String: StreamUsage] {
        self.state.withLockedValue { state in
            var usage: [String: StreamUsage] = [:]
            for recipient in recipients {
                let waiting = state.streams[recipient]?.deliveries ?? []
                usage[recipient] = StreamUsage(deliveries: waiting.count, bytes: waiting.reduce(0) { $0 + $1.body.readableBytes })
            }
            return usage
        }
    }
}
