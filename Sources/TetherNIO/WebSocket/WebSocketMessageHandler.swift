import Crypto
public import NIOCore
public import NIOWebSocket
import TetherCore

/// Carries Tether frames as WebSocket messages: one frame per binary message (PROTOCOL.md,
/// "Transport bindings").
///
/// It sits between NIOWebSocket's frame codec (and its ``NIOWebSocketFrameAggregator``, so
/// that fragmented messages arrive whole) and a Tether connection handler in
/// ``Framing/messages`` mode:
/// - reads: a binary message's payload goes on as one `ByteBuffer`; a PING is answered with
///   a PONG; a text message is refused (close 1003); a CLOSE is answered and reported as a
///   ``TransportError`` with code ``TransportError/Code/webSocketClosed``.
/// - writes: each `ByteBuffer` (one Tether frame) becomes one binary message, masked when
///   this side is the client.
/// - close: a CLOSE frame goes first, with the code that matches the last Tether frame sent:
///   1001 after GOAWAY, 1002/1008/1009/1011/1013 after ERROR, 1000 otherwise.
///
/// Tether's own heartbeat stays the liveness check; WebSocket PINGs are only answered.
public final class WebSocketMessageHandler: ChannelDuplexHandler, RemovableChannelHandler {
    public typealias InboundIn = WebSocketFrame
    public typealias InboundOut = ByteBuffer
    public typealias OutboundIn = ByteBuffer
    public typealias OutboundOut = WebSocketFrame

    /// Which end of the WebSocket this is: clients mask what they send (RFC 6455, 5.3).
    public enum Role: Sendable, Hashable {
        case client
        case server
    }

    private let role: Role
    /// Where a client's masking keys come from.
    private var maskingKeys = MaskingKeys()
    /// The type byte of the last Tether frame written, and the code of the last ERROR.
    private var lastFrameType: UInt8 = 0
    private var lastErrorCode = StatusCode.ok
    private var closeSent = false
    private var closeReceived = false

    /// - Parameter role: Whether this end is the client (it masks its frames) or the server.
    public init(role: Role) {
        self.role = role
    }

    // MARK: Reads

    public func channelRead(context: ChannelHandlerContext, data: NIOAny) {
        let frame = Self.unwrapInboundIn(data)
        if self.role == .server, frame.maskKey == nil, frame.opcode != .connectionClose {
            // RFC 6455, 5.1: a server must close the connection on an unmasked client frame.
            self.sendClose(code: .protocolError, reason: "client frames must be masked", context: context)
            return
        }
        switch frame.opcode {
        case .binary:
            context.fireChannelRead(Self.wrapInboundOut(frame.unmaskedData))
        case .ping:
            guard !self.closeSent else { return }
            let pong = WebSocketFrame(fin: true, opcode: .pong, maskKey: self.maskKey(), data: frame.unmaskedData)
            context.writeAndFlush(Self.wrapOutboundOut(pong), promise: nil)
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
        let frame = WebSocketFrame(fin: true, opcode: .binary, maskKey: self.maskKey(), data: buffer)
        context.write(Self.wrapOutboundOut(frame), promise: promise)
    }

    public func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        guard mode == .all, !self.closeSent, context.channel.isActive else {
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
        var data = context.channel.allocator.buffer(capacity: 2 + reason.utf8.count)
        data.write(webSocketErrorCode: code)
        data.writeString(reason)
        let frame = WebSocketFrame(fin: true, opcode: .connectionClose, maskKey: self.maskKey(), data: data)
        context.writeAndFlush(Self.wrapOutboundOut(frame)).assumeIsolated().whenComplete { _ in
            context.close(mode: .all, promise: promise)
        }
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

/// Masking keys from a strong random source (RFC 6455, 5.3), drawn 1 KiB at a time:
/// `WebSocketMaskingKey.random()` costs a `getrandom` system call per message on Linux.
struct MaskingKeys {
    private var pool: [UInt8] = []
    private var index = 0

    mutating func next() -> WebSocketMaskingKey {
        if self.index + 4 > self.pool.count { self.refill() }
        defer { self.index += 4 }
        return WebSocketMaskingKey(self.pool[self.index..<self.index + 4])!
    }

    private mutating func refill() {
        // A key of swift-crypto is 1 KiB from the platform's CSPRNG (BoringSSL's RAND_bytes
        // on Linux), in one call.
        self.pool = SymmetricKey(size: SymmetricKeySize(bitCount: 8192)).withUnsafeBytes { Array($0) }
        self.index = 0
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
