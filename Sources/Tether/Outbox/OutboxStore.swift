import NIOCore

/// Where a client keeps the messages it accepted until the gateway acknowledges them, and how
/// far it processed its deliveries (PROTOCOL.md, section 9).
///
/// Two implementations come with Tether: ``SQLiteOutboxStore`` (a file in the app's storage,
/// which survives the app being killed) and ``InMemoryOutboxStore`` (tests, or apps that accept
/// losing unsent messages when they quit).
public protocol OutboxStore: Sendable {
    /// Reads everything the store holds; called once, before the client first uses it.
    func load() async throws -> OutboxSnapshot

    /// Appends messages and records the counters that numbered them, in one transaction.
    /// - Parameters:
    ///   - records: The new messages.
    ///   - nextID: The id the next message will get.
    ///   - conversations: The last sequence given in each conversation these messages belong to.
    func append(_ records: [OutboxRecord], nextID: UInt64, conversations: [String: UInt64]) async throws

    /// Marks messages expired: their bodies are dropped, they stay until acknowledged.
    func markExpired(_ ids: [UInt64]) async throws

    /// Removes acknowledged messages.
    func remove(_ ids: [UInt64]) async throws

    /// Records how far the client processed its deliveries.
    func saveCheckpoint(_ checkpoint: DeliveryCheckpoint) async throws
}

/// A failure of an ``OutboxStore``.
public struct OutboxStoreError: Error, Hashable, Sendable, CustomStringConvertible {
    public var message: String
    public init(message: String) { self.message = message }
    public var description: String { "outbox storage failed: \(self.message)" }
}
