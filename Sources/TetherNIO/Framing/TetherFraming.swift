public import NIOCore
public import TetherCore

/// A pipeline of ``Frame``s on a byte-stream channel, for tools and test peers that speak the
/// protocol frame by frame (a load generator, a raw test client).
///
/// Tether's own connection handlers do not use it: each owns its codec as values
/// (``FrameReader``, ``FrameWriter``) and reads and writes bytes. This is NIO's
/// `ByteToMessageHandler` and `MessageToByteHandler` around the same ``FrameDecoder`` and
/// ``FrameEncoder``.
///
/// ```swift
/// try TetherFraming.addHandlers(to: channel.pipeline.syncOperations, maxBodySize: 1 << 20)
/// channel.writeAndFlush(Frame(.hello(hello), flags: .checksum), promise: nil)
/// ```
public enum TetherFraming {
    /// Adds a frame decoder and encoder to a channel's pipeline, synchronously.
    ///
    /// Afterwards the channel reads and writes ``Frame``s. Call it on the channel's event loop,
    /// typically from a channel initializer.
    /// - Parameters:
    ///   - pipeline: The channel's pipeline.
    ///   - maxBodySize: The largest frame body accepted; larger ones are a ``ProtocolError``.
    public static func addHandlers(
        to pipeline: ChannelPipeline.SynchronousOperations,
        maxBodySize: Int = FrameHeader.handshakeMaximumBodySize
    ) throws {
        try pipeline.addHandler(ByteToMessageHandler(FrameDecoder(maxBodySize: maxBodySize)))
        try pipeline.addHandler(MessageToByteHandler(FrameEncoder()))
    }
}
