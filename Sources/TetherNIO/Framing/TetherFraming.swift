public import NIOCore
import TetherCore

/// Installs Tether's framing on a byte-stream channel.
public enum TetherFraming {
    /// Adds the frame decoder and encoder to a channel's pipeline, synchronously.
    ///
    /// Afterwards the channel reads and writes ``Frame``s. Call it on the channel's event loop,
    /// typically from a channel initializer.
    public static func addHandlers(to pipeline: ChannelPipeline.SynchronousOperations) throws {
        try pipeline.addHandler(FrameDecodingHandler())
        try pipeline.addHandler(FrameEncodingHandler())
    }
}
