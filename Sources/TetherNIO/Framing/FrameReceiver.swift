public import NIOCore
public import TetherCore

/// A channel handler that takes inbound frames by a direct call from the handler right below it.
///
/// A pipeline read wraps each frame in `NIOAny`, which boxes it (a ``Frame`` is larger than
/// `NIOAny`'s inline storage) and casts it back in the next handler: an allocation and a dynamic
/// cast per frame and per hop. Tether's own handlers link up instead: the handler above calls
/// ``FrameReceiverLink/connect(_:context:)`` on the link of the handler below when it is added,
/// and ``FrameReceiverLink/disconnect(_:)`` when it is removed; until then, and for any other
/// handler, frames go up the pipeline as usual. ``FrameDecodingHandler`` offers its link through
/// ``FrameDecodingHandler/connect(_:context:)``.
///
/// The link assumes that nothing sits between the two handlers: a handler inserted between them
/// would not see the frames. Tether's pipelines never put anything there.
public protocol FrameReceiver: AnyObject {
    /// Handles one inbound frame, as `channelRead` would.
    /// - Parameters:
    ///   - frame: The frame.
    ///   - context: The receiver's own context.
    func receive(_ frame: Frame, context: ChannelHandlerContext)
}

/// Where a handler sends its inbound frames: to the ``FrameReceiver`` right above it if one
/// connected, else up the pipeline.
///
/// ```swift
/// // In the handler above, once it is in the pipeline:
/// decoder.connect(self, context: context)
/// // In the handler below, for each frame (from a copy: the receiver may disconnect meanwhile):
/// let link = self.link
/// link.forward(frame, from: context)
/// ```
public struct FrameReceiverLink {
    private var receiver: (any FrameReceiver)?
    /// The receiver's context. Held only while connected: the receiver disconnects when it is
    /// removed from the pipeline, and the owner when it is, which breaks the reference cycle.
    private var receiverContext: ChannelHandlerContext?

    /// A link with no receiver: frames go up the pipeline.
    public init() {}

    /// Whether frames go to a receiver directly.
    public var isConnected: Bool { self.receiver != nil }

    /// Sends frames to `receiver` from now on.
    /// - Parameters:
    ///   - receiver: The handler right above the link's owner.
    ///   - context: The receiver's context, passed back to it with each frame.
    public mutating func connect(_ receiver: any FrameReceiver, context: ChannelHandlerContext) {
        self.receiver = receiver
        self.receiverContext = context
    }

    /// Sends frames up the pipeline again.
    public mutating func disconnect() {
        self.receiver = nil
        self.receiverContext = nil
    }

    /// Sends frames up the pipeline again if `receiver` is the one connected.
    public mutating func disconnect(_ receiver: any FrameReceiver) {
        if self.receiver === receiver { self.disconnect() }
    }

    /// Passes `frame` on: to the receiver, or up the pipeline from `context`.
    /// - Parameters:
    ///   - frame: The frame.
    ///   - context: The context of the link's owner.
    public func forward(_ frame: Frame, from context: ChannelHandlerContext) {
        if let receiver = self.receiver, let receiverContext = self.receiverContext {
            receiver.receive(frame, context: receiverContext)
        } else {
            context.fireChannelRead(NIOAny(frame))
        }
    }
}
