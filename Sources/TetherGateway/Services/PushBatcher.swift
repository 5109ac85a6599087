import NIOCore
import TetherCore

/// The pushes made for the connections of one event loop during its current batch of work,
/// written together at the end of that batch.
///
/// A handler that pushes ten messages to a room would otherwise reach each member ten times,
/// with one write down its pipeline each. Here consecutive pushes to the same recipients are
/// joined into one buffer, written once to each member and flushed once. With thousands of
/// members, whose objects do not stay in the CPU's cache, each member is touched once per
/// batch instead of once per push.
///
/// Order is kept: pushes leave in the order they were made, and a connection that writes
/// anything else (a response, a reliable message, GOAWAY) or closes first calls ``drain()``,
/// so a push made before a response still arrives before it.
///
/// Everything but ``init(loop:)`` runs on `loop`.
final class PushBatcher: @unchecked Sendable {
    // Sendable: the mutable state is touched only on `loop`, which every entry point checks.

    private let loop: any EventLoop
    private var queued: [(recipients: ConnectionRegistry.LoopRecipients, push: EncodedPush)] = []
    /// The array ``drain()`` works through, kept (empty) between drains so that neither queue
    /// allocates once it has grown.
    private var draining: [(recipients: ConnectionRegistry.LoopRecipients, push: EncodedPush)] = []
    /// The connections a drain flushes, kept between drains likewise.
    private var flushes: [GatewayConnectionHandler] = []
    private var drainScheduled = false
    private static let allocator = ByteBufferAllocator()

    init(loop: any EventLoop) {
        self.loop = loop
    }

    /// Queues `push` for `recipients`, which all live on this batcher's loop.
    func add(_ push: EncodedPush, to recipients: ConnectionRegistry.LoopRecipients) {
        self.loop.preconditionInEventLoop()
        self.queued.append((recipients, push))
        guard !self.drainScheduled else { return }
        self.drainScheduled = true
        self.loop.assumeIsolated().execute {
            self.drainScheduled = false
            self.drain()
        }
    }

    /// Writes and flushes every queued push now.
    func drain() {
        self.loop.preconditionInEventLoop()
        guard !self.queued.isEmpty else { return }
        // Taken out first: a connection that a write closes may call back into `drain()`.
        var queued: [(recipients: ConnectionRegistry.LoopRecipients, push: EncodedPush)] = []
        swap(&queued, &self.draining)
        swap(&queued, &self.queued)
        var flushes: [GatewayConnectionHandler] = []
        swap(&flushes, &self.flushes)
        defer {
            // Kept for the next drain, unless a drain called from a write meanwhile kept its own.
            // (A burst's arrays are let go rather than kept.)
            queued.removeAll(keepingCapacity: queued.capacity <= 1024)
            flushes.removeAll(keepingCapacity: flushes.capacity <= 1024)
            if self.draining.capacity == 0 { swap(&queued, &self.draining) }
            if self.flushes.capacity == 0 { swap(&flushes, &self.flushes) }
        }
        var start = queued.startIndex
        while start < queued.endIndex {
            let recipients = queued[start].recipients
            var end = start + 1
            while end < queued.endIndex, queued[end].recipients === recipients { end += 1 }
            let push =
                end - start == 1
                ? queued[start].push : EncodedPush(joining: queued[start..<end].lazy.map(\.push), allocator: Self.allocator)
            Self.write(push, to: recipients.handlers, flushes: &flushes)
            start = end
        }
        for handler in flushes { handler.flushIfPending() }
    }

    /// Writes `push` and flushes it at once, for connections on a loop without a batcher.
    static func writeNow(_ push: EncodedPush, to recipients: ConnectionRegistry.LoopRecipients) {
        var flushes: [GatewayConnectionHandler] = []
        Self.write(push, to: recipients.handlers, flushes: &flushes)
        for handler in flushes { handler.flushIfPending() }
    }

    private static func write(
        _ push: EncodedPush,
        to handlers: [NIOLoopBound<GatewayConnectionHandler>],
        flushes: inout [GatewayConnectionHandler]
    ) {
        flushes.reserveCapacity(flushes.count + handlers.count)
        var compressed = CompressedPush()
        for handler in handlers {
            let handler = handler.value
            if handler.deliver(push, compressed: &compressed) { flushes.append(handler) }
        }
    }
}
