import Crypto
public import NIOCore
public import NIOWebSocket
import TetherCore
import TetherNIO

/// Carries Tether frames as WebSocket messages: one frame per binary message (PROTOCOL.md,
/// "Transport bindings").
///
/// It sits above NIOWebSocket's frame decoder, below a Tether connection handler in
/// ``Framing/messages`` mode, and writes WebSocket frames itself (no NIOWebSocket encoder is
/// in the pipeline: ``WebSocketBinding`` installs the two):
/// - reads: a binary message's payload goes on as one `ByteBuffer`, reassembled from however
///   many fragments it came in (RFC 6455, 5.4), with control frames between them; a PING is
///   answered with a PONG; a text message is refused (close 1003); a message over
///   `maxMessageSize` with close 1009; on the server, any unmasked client frame, a continuation
///   without a message, or a new message before the last one ended with close 1002; a CLOSE is
///   answered and reported as a ``TransportError`` with code
///   ``TransportError/Code/webSocketClosed``.
/// - writes: each `ByteBuffer` (one Tether frame) becomes one binary message, masked when
///   this side is the client. The messages written between two flushes are joined into one
///   buffer, header and payload (one allocation and one `iovec` per flush, not three objects
///   per message as NIOWebSocket's `WebSocketFrame` and encoder take); on the server, a payload
///   over 16 KiB follows its header as it is, not copied.
/// - close: a CLOSE frame goes first, with the code that matches the last Tether frame sent:
///   1001 after GOAWAY, 1002/1008/1009/1011/1013 after ERROR, 1000 otherwise.
///
/// Tether's own heartbeat stays the liveness check; WebSocket PINGs are only answered.
///
/// The WebSocket upgrades install it (the client transports for `ws://` and `wss://`,
/// `Gateway.webSocketUpgrader()` on a gateway): it writes bytes, so it cannot sit above
/// NIOWebSocket's encoder, which NIOWebSocket's own upgraders add.
public final class WebSocketMessageHandler: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = WebSocketFrame
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = ByteBuffer

    /// Messages written are passed on without waiting for a flush once this many bytes wait.
    package static let maxJoinedBytes = FrameWriter.maxJoinedBytes
    /// On the server, a larger payload is not copied into the joined buffer: its header is,
    /// and the payload follows as a buffer of its own.
    package static let maxCopiedPayload = 16 * 1024

    /// Which end of the WebSocket this is: clients mask what they send (RFC 6455, 5.3).
    public enum Role: Sendable, Hashable {
        case client
        case server
    }

    private let role: Role
    /// The largest message accepted, all its fragments together.
    private let maxMessageSize: Int
    /// The fragments of a message received so far, joined; `nil` between messages.
    private var message: ByteBuffer?
    /// Where the bytes below it (a frame NIOWebSocket's decoder has in part) and the message
    /// being reassembled count against the gateway's memory budget; `nil` on the client.
    let intake: WebSocketIntake?
    /// Where a client's masking keys come from.
    private var maskingKeys = MaskingKeys()
    /// The type byte of the last Tether frame written, and the code of the last ERROR.
    private var lastFrameType: UInt8 = 0
    private var lastErrorCode = StatusCode.ok
    private var closeSent = false
    private var closeReceived = false
    /// The messages written since the last flush, headers and payloads, to pass on at the
    /// flush; empty (no storage) between flushes.
    private var joined = ByteBuffer()
    /// Completed once `joined` is written: the promises of the writes joined in it.
    private var joinedPromise: EventLoopPromise<Void>?

    /// - Parameter role: Whether this end is the client (it masks its frames) or the server.
    package convenience init(role: Role) {
        self.init(role: role, maxMessageSize: WebSocketBinding.maxFrameSize)
    }

    /// - Parameters:
    ///   - role: Whether this end is the client (it masks its frames) or the server.
    ///   - maxMessageSize: The largest message accepted, all its fragments together: 26 plus
    ///     the largest Tether body this end accepts.
    ///   - intake: On the gateway, the memory budget's account of the connection, shared with
    ///     the ``WebSocketIntake/Meter`` below NIOWebSocket's decoder.
    package init(role: Role, maxMessageSize: Int, intake: WebSocketIntake? = nil) {
        self.role = role
        self.maxMessageSize = maxMessageSize
        self.intake = intake
    }

    public func handlerRemoved(context: ChannelHandlerContext) {
        self.message = nil
        self.joined = ByteBuffer()
        self.joinedPromise?.fail(ChannelError.ioOnClosedChannel)
        self.joinedPromise = nil
    }

    /// A frame NIOWebSocket's decoder refused (a control frame fragmented or over 125 bytes, a
    /// frame over the largest message): closed with 1002 or 1009, as RFC 6455 asks.
    public func errorCaught(context: ChannelHandlerContext, error: any Error) {
        guard let error = error as? NIOWebSocketError else {
            context.fireErrorCaught(error)
            return
        }
        switch error {
        case .invalidFrameLength:
            self.sendClose(
                code: .messageTooLarge,
                reason: "a frame of more than \(self.maxMessageSize) bytes (the largest Tether frame accepted)",
                context: context
            )
        case .fragmentedControlFrame:
            self.sendClose(code: .protocolError, reason: "a fragmented control frame", context: context)
        case .multiByteControlFrameLength:
            self.sendClose(code: .protocolError, reason: "a control frame of more than 125 bytes", context: context)
        }
    }

    // MARK: Reads

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = Self.unwrapInboundIn(data)
        self.intake?.decoded(frame)
        if self.role == .server, frame.maskKey == nil {
            // RFC 6455, 5.1: a server must close the connection on an unmasked client frame.
            self.sendClose(code: .protocolError, reason: "client frames must be masked", context: context)
            return
        }
        if frame.rsv1 || frame.rsv2 || frame.rsv3 {
            self.sendClose(code: .protocolError, reason: "reserved bits set without a negotiated extension", context: context)
            return
        }
        switch frame.opcode {
        case .binary, .continuation:
            self.received(fragment: frame, context: context)
        case .ping:
            guard !self.closeSent else { return }
            self.writeControl(.pong, payload: frame.unmaskedData, context: context, promise: nil)
        case .pong:
            break
        case .connectionClose:
            self.received(close: frame, context: context)
        case .text:
            self.sendClose(code: .unacceptableData, reason: "Tether frames travel in binary messages", context: context)
        default:
            self.sendClose(code: .protocolError, reason: "unexpected WebSocket opcode \(frame.opcode)", context: context)
        }
    }

    /// A binary frame, or a continuation: passed on once the message it ends is whole.
    private func received(fragment frame: WebSocketFrame, context: ChannelHandlerContext) {
        guard !self.closeSent else { return }  // what follows our CLOSE is not read
        let continuation = frame.opcode == .continuation
        guard continuation == (self.message != nil) else {
            let reason =
                continuation
                ? "a continuation frame without a message to continue" : "a new message began before the last one ended"
            self.sendClose(code: .protocolError, reason: reason, context: context)
            return
        }
        let size = (self.message?.readableBytes ?? 0) + frame.length
        guard size <= self.maxMessageSize else {
            self.message = nil
            self.intake?.assembling(0)
            self.sendClose(
                code: .messageTooLarge,
                reason: "a message of more than \(self.maxMessageSize) bytes (the largest Tether frame accepted)",
                context: context
            )
            return
        }
        if frame.fin, self.message == nil {
            context.fireChannelRead(Self.wrapInboundOut(frame.unmaskedData))  // a message in one frame: no copy
            return
        }
        var data = frame.unmaskedData
        if self.message == nil {
            self.message = context.channel.allocator.buffer(capacity: frame.fin ? data.readableBytes : max(data.readableBytes * 2, 256))
        }
        self.message!.writeBuffer(&data)
        guard frame.fin, let message = self.message else {
            self.intake?.assembling(self.message?.readableBytes ?? 0)
            return
        }
        self.message = nil
        self.intake?.assembling(0)
        context.fireChannelRead(Self.wrapInboundOut(message))
    }

    private func received(close frame: WebSocketFrame, context: ChannelHandlerContext) {
        guard !self.closeReceived else { return }
        self.closeReceived = true
        var payload = frame.unmaskedData
        let code = payload.readInteger(as: UInt16.self)
        let reason = payload.readString(length: payload.readableBytes) ?? ""
        guard !self.closeSent else {
            context.close(promise: nil)
            return
        }
        // Answer with the same code (RFC 6455, 5.5.1) and close, then tell the handlers above
        // why (answering first: their close must not write a CLOSE of its own).
        self.writeClose(code.map { WebSocketErrorCode(codeNumber: Int($0)) } ?? .normalClosure, context: context)
        let meaning = code.map { Self.describe(closeCode: $0) } ?? "no close code"
        context.fireErrorCaught(
            TransportError(
                code: .webSocketClosed,
                message: "the peer closed the WebSocket: \(code.map(String.init) ?? "-") \(meaning)\(reason.isEmpty ? "" : " (\(reason))")",
                webSocketCloseCode: code
            )
        )
    }

    /// A close code's name (RFC 6455, 7.4.1).
    public static func describe(closeCode code: UInt16) -> String {
        switch code {
        case 1000: "normal closure"
        case 1001: "going away"
        case 1002: "protocol error"
        case 1003: "unsupported data"
        case 1007: "invalid payload"
        case 1008: "policy violation"
        case 1009: "message too big"
        case 1011: "internal error"
        case 1013: "try again later"
        default: "close code \(code)"
        }
    }

    // MARK: Writes

    public func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        let buffer = Self.unwrapOutboundIn(data)
        guard !self.closeSent else {
            promise?.fail(ChannelError.outputClosed)
            return
        }
        self.remember(buffer)
        let header = WebSocketFrameHeader(opcode: .binary, length: buffer.readableBytes, maskKey: self.maskKey())
        if header.maskKey == nil, buffer.readableBytes > Self.maxCopiedPayload {
            // Large and not masked: the header ends the joined bytes; the payload follows them.
            self.reserveJoined(header.size, context: context)
            header.write(into: &self.joined)
            self.passOnJoined(context: context)
            context.write(Self.wrapOutboundOut(buffer), promise: promise)
            return
        }
        self.reserveJoined(header.size + buffer.readableBytes, context: context)
        header.write(payload: buffer, into: &self.joined)
        if let promise {
            if let joinedPromise = self.joinedPromise {
                joinedPromise.futureResult.cascade(to: promise)
            } else {
                self.joinedPromise = promise
            }
        }
        if self.joined.readableBytes >= Self.maxJoinedBytes { self.passOnJoined(context: context) }
    }

    public func flush(context: ChannelHandlerContext) {
        self.passOnJoined(context: context)
        context.flush()
    }

    /// Gives the joined buffer storage, if it has none, for `bytes` at least.
    private func reserveJoined(_ bytes: Int, context: ChannelHandlerContext) {
        guard self.joined.capacity == 0 else { return }
        self.joined = context.channel.allocator.buffer(capacity: max(bytes, 512))
    }

    /// Passes on the messages joined since the last flush.
    private func passOnJoined(context: ChannelHandlerContext) {
        guard self.joined.readableBytes > 0 else { return }
        let bytes = self.joined
        self.joined = ByteBuffer()
        let promise = self.joinedPromise
        self.joinedPromise = nil
        context.write(Self.wrapOutboundOut(bytes), promise: promise)
    }

    /// Writes and flushes a control frame (PONG, CLOSE) after the messages written before it.
    private func writeControl(
        _ opcode: WebSocketOpcode,
        payload: ByteBuffer,
        context: ChannelHandlerContext,
        promise: EventLoopPromise<Void>?
    ) {
        self.passOnJoined(context: context)
        let header = WebSocketFrameHeader(opcode: opcode, length: payload.readableBytes, maskKey: self.maskKey())
        var frame = context.channel.allocator.buffer(capacity: header.size + payload.readableBytes)
        header.write(payload: payload, into: &frame)
        context.writeAndFlush(Self.wrapOutboundOut(frame), promise: promise)
    }

    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard mode == .all, !self.closeSent, context.channel.isActive else {
            self.passOnJoined(context: context)  // what was written goes before a half-close
            context.close(mode: mode, promise: promise)
            return
        }
        self.writeClose(self.closeCode(), context: context, promise: promise)
    }

    /// Refuses what the peer sent: reports why, then closes with `code`.
    private func sendClose(code: WebSocketErrorCode, reason: String, context: ChannelHandlerContext) {
        guard !self.closeSent else { return }
        // The CLOSE first: told of the error, the handlers above close the channel, and that
        // close must not write a CLOSE of its own (with the code of a normal end) before this one.
        self.writeClose(code, reason: reason, context: context)
        context.fireErrorCaught(
            TransportError(
                code: .webSocketClosed,
                message: "closing the WebSocket: \(reason)",
                webSocketCloseCode: UInt16(webSocketErrorCode: code)
            )
        )
    }

    /// Writes a CLOSE frame with `code` and `reason`, then closes the connection once it is
    /// written: waiting for the peer's answer would let a peer that never answers hold it.
    private func writeClose(
        _ code: WebSocketErrorCode,
        reason: String = "",
        context: ChannelHandlerContext,
        promise: EventLoopPromise<Void>? = nil
    ) {
        self.closeSent = true
        let reason = Self.closeReason(reason)
        var data = context.channel.allocator.buffer(capacity: 2 + reason.count)
        data.write(webSocketErrorCode: code)
        data.writeBytes(reason)
        let written = context.eventLoop.makePromise(of: Void.self)
        self.writeControl(.connectionClose, payload: data, context: context, promise: written)
        written.futureResult.assumeIsolated().whenComplete { _ in
            context.close(mode: .all, promise: promise)
        }
    }

    /// The bytes of `reason` that fit in a CLOSE frame beside its 2-byte code: a control frame
    /// carries 125 bytes at most (RFC 6455, 5.5), and the reason must stay UTF-8 (5.5.1), so it
    /// is cut between characters.
    package static func closeReason(_ reason: String) -> Substring.UTF8View {
        var length = 0
        for scalar in reason.unicodeScalars {
            let width = UTF8.width(scalar)
            guard length + width <= 123 else { break }
            length += width
        }
        return reason.utf8.prefix(length)
    }

    /// Notes the type of the Tether frame in `buffer` (and an ERROR's code), for the close code.
    private func remember(_ buffer: ByteBuffer) {
        let start = buffer.readerIndex
        guard let type = buffer.getInteger(at: start + 3, as: UInt8.self) else { return }
        self.lastFrameType = type
        if type == FrameType.error.rawValue, let code = buffer.getInteger(at: start + FrameHeader.size, as: UInt16.self) {
            self.lastErrorCode = StatusCode(rawValue: code)
        }
    }

    /// The close code for the last Tether frame sent (PROTOCOL.md, "Transport bindings").
    private func closeCode() -> WebSocketErrorCode {
        switch self.lastFrameType {
        case FrameType.goAway.rawValue:
            return .goingAway
        case FrameType.error.rawValue:
            switch self.lastErrorCode {
            case .frameTooLarge: return .messageTooLarge
            case let code where code.isConnectionError: return .protocolError
            case .invalidRequest, .unauthenticated, .permissionDenied: return .policyViolation
            case .resourceExhausted: return WebSocketErrorCode(codeNumber: 1013)  // try again later
            default: return .unexpectedServerError
            }
        default:
            return .normalClosure
        }
    }

    private func maskKey() -> WebSocketMaskingKey? {
        self.role == .client ? self.maskingKeys.next() : nil
    }
}

@available(*, unavailable)
extension WebSocketMessageHandler: Sendable {}

extension UInt16 {
    init(webSocketErrorCode code: WebSocketErrorCode) {
        var buffer = ByteBuffer()
        buffer.write(webSocketErrorCode: code)
        self = buffer.readInteger(as: UInt16.self) ?? 1000
    }
}
