import TetherCore

/// What the engine needs from the current connection.
protocol ReliableSink: AnyObject, Sendable {
    /// Sends these messages (in addition to those already queued).
    ///
    /// Called under the engine's lock, in the order the messages were committed: it must only
    /// queue them (never send inline, which could overtake records queued just before from
    /// another thread, and never call back into the engine).
    func enqueue(_ records: [OutboxRecord])
    /// A queued or unacknowledged message expired: send its tombstone instead.
    func replace(with tombstone: OutboxRecord)
    /// Tells the gateway that every delivery up to `sequence` was processed.
    func acknowledgeDeliveries(upTo sequence: UInt64)
}

/// What the client's reliable engine hears from a connection.
struct ReliableCallbacks: Sendable {
    var acknowledged: @Sendable ([Frame.MessageAck.Entry]) -> Void
    var sent: @Sendable ([UInt64]) -> Void
    /// A DELIVERY arrived on a connection whose WELCOME announced this delivery epoch.
    var delivery: @Sendable (Frame.Delivery, _ epoch: UInt64) -> DeliveryVerdict
}

/// What to do with an inbound DELIVERY.
typealias DeliveryVerdict = InboxMachine.Verdict

extension MessageEvent {
    init(_ record: OutboxRecord, _ state: State) {
        self.init(id: record.id, conversation: record.conversation, sequence: record.sequence, state: state)
    }
}
