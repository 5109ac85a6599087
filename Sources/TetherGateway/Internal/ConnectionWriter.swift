import NIOCore
import TetherCore

/// Writes frames to one connection from the gateway's tasks.
///
/// Frames go down the channel's pipeline, through the protocol handler, which stamps the
/// negotiated flags, enforces the limits and coalesces the flushes of one loop batch. From a
/// task on the connection's event loop, a write costs no thread hop, and ``send(_:)`` hands the
/// frame to the protocol handler directly rather than down the pipeline from its tail.
struct ConnectionWriter: Sendable {
    let channel: any Channel
    /// The connection's protocol handler, for ``send(_:)`` from its event loop.
    let handler: NIOLoopBound<GatewayConnectionHandler>?

    init(channel: any Channel, handler: NIOLoopBound<GatewayConnectionHandler>? = nil) {
        self.channel = channel
        self.handler = handler
    }

    /// Writes a frame without waiting for it to be written: for RESPONSEs, whose loss with the
    /// connection is the client's to notice.
    func send(_ frame: Frame) {
        if let handler = self.handler, handler.eventLoop.inEventLoop {
            handler.value.writeAndFlush(frame)
        } else {
            self.channel.writeAndFlush(frame, promise: nil)
        }
    }

    /// Writes a frame and returns once it was written.
    /// - Throws: The channel's error, e.g. `ChannelError.ioOnClosedChannel` once it closed.
    func write(_ frame: Frame) async throws {
        try await self.channel.writeAndFlush(frame).get()
    }

    /// Writes frames in order, with one flush, and returns once the last was written.
    func write(contentsOf frames: [Frame]) async throws {
        guard let last = frames.last else { return }
        for frame in frames.dropLast() { self.channel.write(frame, promise: nil) }
        try await self.channel.writeAndFlush(last).get()
    }

    /// Closes the connection once what was written before has gone out.
    func close() {
        self.channel.close(promise: nil)
    }
}
