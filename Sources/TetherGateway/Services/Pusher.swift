import Foundation
import NIOCore
import TetherCore

/// Pushes to connections, clients, rooms or everyone: what ``Gateway/push(_:_:to:)`` and a
/// handler's ``RequestContext/push(_:_:to:)`` share.
///
/// A push is encoded once, whatever the number of recipients, and makes one hop per event
/// loop: each loop's ``PushBatcher`` joins the pushes made during its current batch of work and
/// writes them to each member at once.
struct Pusher: Sendable {
    let registry: ConnectionRegistry
    /// The ``PushBatcher`` of each loop of the gateway's group.
    let batchers: [ObjectIdentifier: PushBatcher]
    /// The cluster that shares pushes to clients, rooms and everyone with the other nodes.
    let cluster: (any GatewayCluster)?
    let metrics: GatewayMetrics
    /// The gateway's channels, if it offers them.
    let channels: ChannelHub?
    /// Where the publications of channels whose history is in the store go first.
    let channelWriter: ChannelWriter?
    /// The gateway's clock: a publication's time in the store.
    let clock: any TetherClock

    private static let allocator = ByteBufferAllocator()

    /// Pushes to the connections `target` names, and, in a cluster, publishes the push to the
    /// other nodes (unless it names a connection, which is this node's own).
    /// - Parameter publish: Whether to publish it to the other nodes (not what one of them published).
    /// - Returns: The number of this node's connections the push was sent to.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for a bad topic.
    func push(_ topic: String, _ body: ByteBuffer, to target: PushTarget, publish: Bool = true) throws(GatewayError) -> Int {
        guard !topic.isEmpty, topic.utf8.count <= Int(UInt16.max) else {
            throw GatewayError(code: .invalidArgument, message: "a push topic must be 1 to 65535 bytes long")
        }
        if publish, let cluster = self.cluster {
            if case .connection = target {} else { cluster.publish(ClusterPush(topic: topic, body: body, target: target)) }
        }
        let recipients = self.registry.recipients(for: target)
        guard !recipients.isEmpty else {
            self.metrics.pushed(target.metricLabel, recipients: 0)
            return 0
        }
        let push: EncodedPush
        do {
            push = try EncodedPush(Frame.Push(topic: topic, body: body), allocator: Self.allocator)
        } catch {
            throw GatewayError(code: .invalidArgument, message: "the push cannot be encoded: \(error.message)")
        }
        let count = self.send(push, to: recipients)
        self.metrics.pushed(target.metricLabel, recipients: count)
        return count
    }

    /// Publishes `body` to a channel: appended to its history (if it keeps one; in the store
    /// before anything is sent, if it keeps it there), then sent to its subscribers on this node.
    /// - Returns: The publication's position (epoch and offset; both 0 without history) and
    ///   the number of connections it was sent to.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for a bad
    ///   channel name, ``GatewayError/Code/disabled`` when the gateway has no channels,
    ///   ``GatewayError/Code/storage`` when the store failed (nothing was sent; a commit that
    ///   failed as the disk did may still have kept it, to be sent after a restart).
    func publish(_ body: ByteBuffer, to channel: String, publisher: String) async throws(GatewayError) -> (ChannelPosition, Int) {
        guard let hub = self.channels else {
            throw GatewayError(code: .disabled, message: "this gateway has no channels (its configuration's channels is nil)")
        }
        guard Frame.isValidChannelName(channel) else {
            throw GatewayError(code: .invalidArgument, message: "a channel name must be 1 to \(Frame.maxChannelLength) bytes long")
        }
        guard publisher.utf8.count <= Int(UInt16.max) else {
            throw GatewayError(code: .invalidArgument, message: "a publisher must be at most 65535 bytes long")
        }
        if let writer = self.channelWriter, let retention = hub.configuration.storedHistory(of: channel) {
            let append = ChannelAppend(
                channel: channel,
                publisher: publisher,
                body: body,
                time: self.clock.wallClockDate,
                maxCount: retention.maxCount
            )
            return try await writer.publish(append, through: self)
        }
        let (publication, sequence, recipients) = hub.publish(body, to: channel, publisher: publisher)
        guard !recipients.isEmpty else {
            self.metrics.pushed("channel", recipients: 0)
            return (publication.position, 0)
        }
        let push: EncodedPush
        do {
            push = try EncodedPush(.publication(publication, sequence: sequence), allocator: Self.allocator)
        } catch {
            throw GatewayError(code: .invalidArgument, message: "the publication cannot be encoded: \(error.message)")
        }
        let count = self.send(push, to: recipients)
        self.metrics.pushed("channel", recipients: count)
        return (publication.position, count)
    }

    /// A page of a channel's history: the publications after `after`, or (`nil`) its latest
    /// `limit`; read from the store for a channel that keeps its history there.
    /// - Throws: ``GatewayError`` with code ``GatewayError/Code/invalidArgument`` for a bad
    ///   channel name or limit, ``GatewayError/Code/disabled`` when the gateway has no
    ///   channels, ``GatewayError/Code/storage`` when the store failed.
    func history(of channel: String, after: ChannelPosition?, limit: Int) async throws(GatewayError) -> ChannelHistoryPage {
        guard let hub = self.channels else {
            throw GatewayError(code: .disabled, message: "this gateway has no channels (its configuration's channels is nil)")
        }
        guard Frame.isValidChannelName(channel) else {
            throw GatewayError(code: .invalidArgument, message: "a channel name must be 1 to \(Frame.maxChannelLength) bytes long")
        }
        guard (1...ChannelHistoryQuery.maxLimit).contains(limit) else {
            throw GatewayError(code: .invalidArgument, message: "the limit must be 1 to \(ChannelHistoryQuery.maxLimit), got \(limit)")
        }
        if let writer = self.channelWriter, let retention = hub.configuration.storedHistory(of: channel) {
            return try await writer.history(of: channel, after: after, limit: limit, notBefore: retention.notBefore(self.clock))
        }
        return hub.history(of: channel, after: after, limit: limit)
    }

    /// Sends publications the store appended to the subscribers of their channels on this
    /// node, in order (see ``ChannelWriter``).
    /// - Returns: The number of connections each was sent to.
    func sendStored(_ publications: [Frame.Publication]) -> [Int] {
        guard let hub = self.channels else { return publications.map { _ in 0 } }
        return zip(publications, hub.sendStored(publications)).map { publication, sending in
            guard let (sequence, recipients) = sending, !recipients.isEmpty else {
                self.metrics.pushed("channel", recipients: 0)
                return 0
            }
            guard let push = try? EncodedPush(.publication(publication, sequence: sequence), allocator: Self.allocator) else {
                return 0  // a channel name and publisher checked before, a body the store kept: it encodes
            }
            let count = self.send(push, to: recipients)
            self.metrics.pushed("channel", recipients: count)
            return count
        }
    }

    /// Hands `push` to the batcher of each loop of `recipients`, one hop per loop.
    /// - Returns: The number of connections.
    private func send(_ push: EncodedPush, to recipients: [ConnectionRegistry.LoopRecipients]) -> Int {
        var count = 0
        for (index, recipients) in recipients.enumerated() {
            count += recipients.handlers.count
            let push = index == 0 ? push : push.copy(allocator: Self.allocator)
            let loop = recipients.loop
            let batcher = self.batchers[ObjectIdentifier(loop)]
            if loop.inEventLoop {
                Self.deliver(push, to: recipients, batcher: batcher)
            } else {
                loop.execute { Self.deliver(push, to: recipients, batcher: batcher) }
            }
        }
        return count
    }

    /// Queues `push` in the batcher of the recipients' loop, or writes it at once for
    /// connections on a loop outside the gateway's group (see ``Gateway/accept(_:framing:)``).
    private static func deliver(_ push: EncodedPush, to recipients: ConnectionRegistry.LoopRecipients, batcher: PushBatcher?) {
        if let batcher {
            batcher.add(push, to: recipients)
        } else {
            PushBatcher.writeNow(push, to: recipients)
        }
    }
}

extension PushTarget {
    /// The kind of target, as a metric label: never the client id or room it names.
    var metricLabel: String {
        switch self {
        case .connection: "connection"
        case .client: "client"
        case .room: "room"
        case .all: "all"
        }
    }
}
