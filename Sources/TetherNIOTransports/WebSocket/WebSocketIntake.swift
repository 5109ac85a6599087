package import NIOCore
import NIOWebSocket
import TetherCore
package import TetherNIO

/// What one gateway WebSocket holds of the memory budget before its frames reach the Tether
/// handler: the bytes NIOWebSocket's decoder has of a frame still arriving, and the message
/// ``WebSocketMessageHandler`` is reassembling from fragments.
///
/// Its ``Meter`` sits below the decoder: it counts the bytes read, publishes what is held at the
/// end of each read, pauses reads while the budget is exhausted, and reports a frame or message
/// that takes longer than the body timeout as a `resource exhausted` ``ProtocolError`` (the
/// Tether handler sends ERROR and closes, with close code 1013).
package final class WebSocketIntake: BudgetAccountOwner {
    private var account: BudgetAccount?
    /// Bytes read and not yet part of a decoded frame: a frame in part, in the decoder.
    private var undecoded = 0
    /// Bytes of the message being reassembled.
    private var assembled = 0
    /// Frames decoded during the current read, and their size on the wire.
    private var decodedThisRead = 0
    private var decodedBytesThisRead = 0
    private weak var meter: Meter?

    /// - Parameter intake: The monitor of the connection's loop.
    package init(intake: IntakeMonitor) {
        self.account = nil
        self.monitor = intake
    }

    private let monitor: IntakeMonitor

    /// The handler to add right below NIOWebSocket's frame decoder.
    package func makeMeter() -> Meter {
        let meter = Meter(intake: self)
        self.meter = meter
        return meter
    }

    /// The decoder produced `frame`.
    func decoded(_ frame: WebSocketFrame) {
        self.decodedThisRead += 1
        self.decodedBytesThisRead += Self.wireSize(of: frame)
    }

    /// The message being reassembled now holds `bytes`.
    func assembling(_ bytes: Int) {
        self.assembled = bytes
    }

    /// A read of `count` bytes went through the decoder: what it holds now is published.
    fileprivate func read(_ count: Int) {
        self.undecoded += count - self.decodedBytesThisRead
        // A frame ended in this read: what is left of a frame is at most this read's bytes
        // (a peer's length field longer than needed makes the wire size an underestimate).
        if self.decodedThisRead > 0 { self.undecoded = min(self.undecoded, count) }
        self.undecoded = max(0, self.undecoded)
        self.decodedThisRead = 0
        self.decodedBytesThisRead = 0
        if self.account == nil { self.account = self.monitor.account(for: self) }
        let held = self.undecoded + self.assembled
        self.account?.hold(held, inProgress: held > 0)
        self.account?.publish()
    }

    fileprivate var shouldPause: Bool { self.account?.shouldPause == true }

    fileprivate func paused() {
        self.account?.paused()
    }

    fileprivate func close() {
        self.account?.close()
    }

    package func budgetHasRoom() {
        self.meter?.resume()
    }

    package func bodyTimedOut() {
        let timeout = self.monitor.bodyTimeout
        let message =
            self.account?.isPaused == true
            ? "the gateway's memory budget stayed full for \(timeout) while this connection held a message; try again later"
            : "a WebSocket message took longer than \(timeout) to arrive"
        self.meter?.fail(ProtocolError(code: .resourceExhausted, message: message))
    }

    /// A frame's size on the wire, with the shortest length field (RFC 6455, 5.2).
    static func wireSize(of frame: WebSocketFrame) -> Int {
        let length = frame.length
        var header = 2
        if length > 65535 {
            header += 8
        } else if length > 125 {
            header += 2
        }
        if frame.maskKey != nil { header += 4 }
        return header + length
    }

    /// Counts the bytes read below NIOWebSocket's decoder, and holds reads while the budget is
    /// exhausted and the connection holds bytes.
    package final class Meter: ChannelDuplexHandler, RemovableChannelHandler {
        package typealias InboundIn = ByteBuffer
        package typealias InboundOut = ByteBuffer
        package typealias OutboundIn = Never

        private let intake: WebSocketIntake
        private var context: ChannelHandlerContext?
        private var readHeld = false

        fileprivate init(intake: WebSocketIntake) {
            self.intake = intake
        }

        package func handlerAdded(context: ChannelHandlerContext) {
            self.context = context
        }

        package func handlerRemoved(context: ChannelHandlerContext) {
            self.context = nil
            self.intake.close()
        }

        package func channelRead(context: ChannelHandlerContext, data: NIOAny) {
            let count = Self.unwrapInboundIn(data).readableBytes
            context.fireChannelRead(data)
            self.intake.read(count)
        }

        package func channelInactive(context: ChannelHandlerContext) {
            self.intake.close()
            context.fireChannelInactive()
        }

        package func read(context: ChannelHandlerContext) {
            if self.intake.shouldPause {
                self.intake.paused()
                self.readHeld = true
                return
            }
            context.read()
        }

        fileprivate func resume() {
            guard self.readHeld, let context else { return }
            self.readHeld = false
            context.read()
        }

        fileprivate func fail(_ error: ProtocolError) {
            self.context?.fireErrorCaught(error)
        }
    }
}

@available(*, unavailable)
extension WebSocketIntake: Sendable {}

@available(*, unavailable)
extension WebSocketIntake.Meter: Sendable {}
