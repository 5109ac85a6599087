package import NIOCore
package import NIOHTTP1
import NIOWebSocket
import TetherCore
package import TetherNIO

/// The constants of the WebSocket binding, and the pipeline it installs.
public enum WebSocketBinding {
    /// The subprotocol a Tether WebSocket speaks (`Sec-WebSocket-Protocol`).
    public static let subprotocol = "tether.v1"

    /// The largest WebSocket frame accepted: the largest Tether frame (16 MiB body and its header).
    package static let maxFrameSize = FrameHeader.size + FrameHeader.absoluteMaximumBodySize

    /// Installs the WebSocket binding on a channel that has just been upgraded: NIOWebSocket's
    /// frame decoder, then the ``WebSocketMessageHandler`` (which reassembles fragmented
    /// messages and writes frames itself); on the gateway, with `intake`, also the budget's
    /// ``WebSocketIntake/Meter`` below the decoder.
    /// - Parameters:
    ///   - maxMessageSize: The largest message accepted, all its fragments together.
    ///   - intake: On the gateway, the monitor of the channel's loop.
    package static func addMessageHandlers(
        to channel: any Channel,
        role: WebSocketMessageHandler.Role,
        maxMessageSize: Int = Self.maxFrameSize,
        intake: IntakeMonitor? = nil
    ) throws {
        let pipeline = channel.pipeline.syncOperations
        let decoder = ByteToMessageHandler(WebSocketFrameDecoder(maxFrameSize: maxMessageSize))
        try pipeline.addHandler(decoder)
        let webSocketIntake = intake.map { WebSocketIntake(intake: $0) }
        if let webSocketIntake {
            try pipeline.addHandler(webSocketIntake.makeMeter(), position: .before(decoder))
        }
        try pipeline.addHandler(WebSocketMessageHandler(role: role, maxMessageSize: maxMessageSize, intake: webSocketIntake))
    }
}

/// The server's side of the WebSocket upgrade of a Tether connection: NIOWebSocket's
/// handshake (the request's checks, `Sec-WebSocket-Accept`), then `upgraded`, which installs
/// the binding (``WebSocketBinding/addMessageHandlers(to:role:maxMessageSize:intake:)``) in
/// place of NIOWebSocket's encoder and decoder.
package struct WebSocketServerUpgrade: HTTPServerProtocolUpgrader, Sendable {
    private let handshake: NIOWebSocketServerUpgrader
    private let upgraded: @Sendable (any Channel, HTTPRequestHead) throws -> Void

    /// - Parameters:
    ///   - shouldUpgrade: The headers to add to the upgrade's response, or `nil` to decline it.
    ///   - upgraded: Installs the pipeline on the upgraded channel.
    package init(
        shouldUpgrade: @escaping @Sendable (any Channel, HTTPRequestHead) -> EventLoopFuture<HTTPHeaders?>,
        upgraded: @escaping @Sendable (any Channel, HTTPRequestHead) throws -> Void
    ) {
        // Only its handshake is used: `upgrade(context:upgradeRequest:)` below installs the pipeline.
        self.handshake = NIOWebSocketServerUpgrader(
            automaticErrorHandling: false,
            shouldUpgrade: shouldUpgrade,
            upgradePipelineHandler: { channel, _ in channel.eventLoop.makeSucceededVoidFuture() }
        )
        self.upgraded = upgraded
    }

    package var supportedProtocol: String { self.handshake.supportedProtocol }
    package var requiredUpgradeHeaders: [String] { self.handshake.requiredUpgradeHeaders }

    package func buildUpgradeResponse(
        channel: any Channel,
        upgradeRequest: HTTPRequestHead,
        initialResponseHeaders: HTTPHeaders
    ) -> EventLoopFuture<HTTPHeaders> {
        self.handshake.buildUpgradeResponse(
            channel: channel,
            upgradeRequest: upgradeRequest,
            initialResponseHeaders: initialResponseHeaders
        )
    }

    package func upgrade(context: ChannelHandlerContext, upgradeRequest: HTTPRequestHead) -> EventLoopFuture<Void> {
        let channel = context.channel
        return context.eventLoop.makeCompletedFuture { try self.upgraded(channel, upgradeRequest) }
    }
}

/// The client's side of the WebSocket upgrade: NIOWebSocket's handshake (the request's key,
/// the response's checks), then `upgraded`, which installs the binding.
package struct WebSocketClientUpgrade: NIOHTTPClientProtocolUpgrader, Sendable {
    private let handshake: NIOWebSocketClientUpgrader
    private let upgraded: @Sendable (any Channel, HTTPResponseHead) throws -> Void

    /// - Parameter upgraded: Installs the pipeline on the upgraded channel.
    package init(upgraded: @escaping @Sendable (any Channel, HTTPResponseHead) throws -> Void) {
        // Only its handshake is used: `upgrade(context:upgradeResponse:)` below installs the pipeline.
        self.handshake = NIOWebSocketClientUpgrader(automaticErrorHandling: false) { channel, _ in
            channel.eventLoop.makeSucceededVoidFuture()
        }
        self.upgraded = upgraded
    }

    package var supportedProtocol: String { self.handshake.supportedProtocol }
    package var requiredUpgradeHeaders: [String] { self.handshake.requiredUpgradeHeaders }

    package func addCustom(upgradeRequestHeaders: inout HTTPHeaders) {
        self.handshake.addCustom(upgradeRequestHeaders: &upgradeRequestHeaders)
    }

    package func shouldAllowUpgrade(upgradeResponse: HTTPResponseHead) -> Bool {
        self.handshake.shouldAllowUpgrade(upgradeResponse: upgradeResponse)
    }

    package func upgrade(context: ChannelHandlerContext, upgradeResponse: HTTPResponseHead) -> EventLoopFuture<Void> {
        let channel = context.channel
        return context.eventLoop.makeCompletedFuture { try self.upgraded(channel, upgradeResponse) }
    }
}
