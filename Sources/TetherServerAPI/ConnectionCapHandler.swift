import NIOCore

/// Holds a listener to at most `maxConnections` open connections: at the cap it stops
/// accepting (the next wait in the listen backlog), and a connection accepted in the same read
/// as the last one allowed waits here, not served, until one closes.
///
/// On the listening channel, before the bootstrap's accept handler. (Hummingbird's
/// `AvailableConnectionsChannelHandler` stops reading at the cap too, but passes on every
/// connection of a read already under way: up to the channel's `maxMessagesPerRead` more.)
final class ConnectionCapHandler: ChannelDuplexHandler {
    typealias InboundIn = any Channel
    typealias InboundOut = any Channel
    typealias OutboundIn = Never
    typealias OutboundOut = Never

    private let maxConnections: Int
    /// Connections passed on and not closed yet.
    private var open = 0
    /// Accepted beyond the cap, in order; passed on as others close.
    private var waiting: [any Channel] = []
    /// A read asked for while at the cap.
    private var readPending = false

    init(maxConnections: Int) {
        precondition(maxConnections > 0)
        self.maxConnections = maxConnections
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let channel = Self.unwrapInboundIn(data)
        if self.open < self.maxConnections {
            self.admit(channel, context: context)
        } else {
            self.waiting.append(channel)
        }
    }

    func read(context: ChannelHandlerContext) {
        if self.open + self.waiting.count >= self.maxConnections {
            self.readPending = true
        } else {
            context.read()
        }
    }

    func channelInactive(context: ChannelHandlerContext) {
        // The listener closed: those never served are closed too.
        let waiting = self.waiting
        self.waiting = []
        for channel in waiting { channel.close(promise: nil) }
        context.fireChannelInactive()
    }

    private func admit(_ channel: any Channel, context: ChannelHandlerContext) {
        self.open += 1
        let bound = NIOLoopBound((handler: self, context: context), eventLoop: context.eventLoop)
        channel.closeFuture.hop(to: context.eventLoop).whenComplete { _ in
            bound.value.handler.closed(context: bound.value.context)
        }
        context.fireChannelRead(Self.wrapInboundOut(channel))
    }

    private func closed(context: ChannelHandlerContext) {
        self.open -= 1
        if !self.waiting.isEmpty {
            self.admit(self.waiting.removeFirst(), context: context)
            context.fireChannelReadComplete()
        } else if self.readPending {
            self.readPending = false
            context.read()
        }
    }
}
