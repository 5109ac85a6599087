public import NIOCore

/// Parses ``Frame``s from a byte stream, one complete frame at a time.
///
/// The decoder validates as early as the bytes allow: the magic as soon as two bytes are
/// there, and the version, flags and body length as soon as the 26-byte header is there, so
/// garbage is rejected at once and an oversized length is refused before a single body byte
/// is buffered. It never allocates according to a length the peer merely claims.
///
/// It conforms to `NIOSingleStepByteToMessageDecoder` so that it can be wrapped in a
/// `ByteToMessageHandler`, but it performs no I/O itself.
///
/// ```swift
/// var decoder = FrameDecoder(maxBodySize: 1 << 20)
/// while let frame = try decoder.decode(buffer: &bytes) { handle(frame) }
/// ```
public struct FrameDecoder: NIOSingleStepByteToMessageDecoder, Sendable {
    public typealias InboundOut = Frame

    /// The largest body this side accepts; a frame announcing more is rejected.
    public var maxBodySize: Int
    /// Whether REQUEST and MESSAGE may carry a trace context (``Features/traceContext`` was
    /// negotiated); without it, the TRACE_CONTEXT flag is a `protocol error`.
    public var acceptsTraceContext = false
    /// Whether a DELIVERY may say it follows deliveries acknowledged elsewhere
    /// (``Features/sharedDeliveries`` was negotiated); without it, the ACKED_ELSEWHERE flag is a
    /// `protocol error`.
    public var acceptsSharedDeliveries = false

    /// Creates a decoder.
    /// - Parameter maxBodySize: The largest body accepted, at most
    ///   ``FrameHeader/absoluteMaximumBodySize``.
    public init(maxBodySize: Int) {
        self.maxBodySize = min(max(0, maxBodySize), FrameHeader.absoluteMaximumBodySize)
    }

    /// Decodes the next frame from the front of `buffer`, or returns `nil` if it is not complete yet.
    /// - Throws: ``ProtocolError`` if the bytes cannot be the start of a valid frame.
    public mutating func decode(buffer: inout ByteBuffer) throws -> Frame? {
        try self.decodeFrame(from: &buffer)
    }

    /// Decodes what remains once the stream has ended; an incomplete trailing frame is dropped.
    public mutating func decodeLast(buffer: inout ByteBuffer, seenEOF: Bool) throws -> Frame? {
        if let frame = try self.decodeFrame(from: &buffer) { return frame }
        buffer.moveReaderIndex(to: buffer.writerIndex)
        return nil
    }

    /// Decodes the next frame from the front of `buffer`, or returns `nil` if it is not complete yet.
    /// - Parameter inflater: With ``Features/compression`` negotiated: inflates COMPRESSED
    ///   payloads, up to ``maxBodySize``. Without it, a COMPRESSED frame is a `protocol error`.
    public mutating func decodeFrame(from buffer: inout ByteBuffer, inflater: (any PayloadInflating)? = nil) throws(ProtocolError) -> Frame?
    {
        let base = buffer.readerIndex
        guard let header = buffer.withUnsafeReadableBytes({ FrameHeader.read(from: $0) }) else {
            // Not a whole header yet; a wrong magic is reported as soon as its two bytes are here.
            if let magic = buffer.getInteger(at: base, as: UInt16.self), magic != FrameHeader.magic {
                throw ProtocolError(code: .badMagic, message: "expected magic 0x5448, got 0x\(String(magic, radix: 16))")
            }
            return nil
        }
        guard header.magic == FrameHeader.magic else {
            throw ProtocolError(code: .badMagic, message: "expected magic 0x5448, got 0x\(String(header.magic, radix: 16))")
        }
        let (version, type, flags, stream, id) = (header.version, header.type, header.flags, header.stream, header.id)
        let length = Int(header.length)
        let checksum = header.checksum

        guard version == FrameEncoder.version else {
            throw ProtocolError(code: .unsupportedVersion, message: "frame version \(version) is not supported; this peer speaks version 1")
        }
        var allowed: FrameFlags = type == .message ? [.checksum, .expired] : .checksum
        if inflater != nil, type.mayCompress { allowed.insert(.compressed) }
        if self.acceptsTraceContext, type == .request || type == .message { allowed.insert(.traceContext) }
        if self.acceptsSharedDeliveries, type == .delivery { allowed.insert(.ackedElsewhere) }
        guard allowed.isSuperset(of: flags) else {
            throw ProtocolError(
                code: .protocolError,
                message: "flag bits 0x\(String(flags.subtracting(allowed).rawValue, radix: 16)) are not allowed on \(type)"
            )
        }
        guard length <= self.maxBodySize else {
            throw ProtocolError(code: .frameTooLarge, message: "\(type) body of \(length) bytes exceeds the limit of \(self.maxBodySize)")
        }
        guard buffer.readableBytes >= FrameHeader.size + length else { return nil }

        if flags.contains(.checksum) {
            let computed = buffer.withUnsafeReadableBytes { bytes in
                FrameEncoder.checksum(
                    header: bytes,
                    body: UnsafeRawBufferPointer(rebasing: bytes[FrameHeader.size..<(FrameHeader.size + length)])
                )
            }
            guard computed == checksum else {
                throw ProtocolError(
                    code: .checksumMismatch,
                    message: "\(type) checksum 0x\(String(checksum, radix: 16)) does not match computed 0x\(String(computed, radix: 16))"
                )
            }
        } else if checksum != 0 {
            throw ProtocolError(code: .protocolError, message: "checksum field is set but the checksum flag is not")
        }

        var body = buffer.getSlice(at: base + FrameHeader.size, length: length)!
        var payload = try Self.parsePayload(type: type, id: id, traced: flags.contains(.traceContext), body: &body)
        if flags.contains(.compressed), let inflater {
            payload = try payload.inflated(by: inflater, limit: self.maxBodySize)
        }
        if flags.contains(.expired), case .message(var message) = payload {
            message.expired = true
            payload = .message(message)
        }
        if flags.contains(.ackedElsewhere), case .delivery(var delivery) = payload {
            delivery.afterAcknowledged = true
            payload = .delivery(delivery)
        }
        buffer.moveReaderIndex(forwardBy: FrameHeader.size + length)
        return Frame(payload, stream: stream, flags: flags.intersection(.checksum))
    }

    private static func parsePayload(
        type: FrameType,
        id: UInt64,
        traced: Bool,
        body: inout ByteBuffer
    ) throws(ProtocolError) -> Frame.Payload {
        switch type {
        case .hello:
            return .hello(try Self.parseHello(&body))
        case .welcome:
            return .welcome(try Self.parseWelcome(&body))
        case .request:
            let timeout = try body.readMilliseconds(field: "timeout", in: type)
            let method = try body.readShortString(field: "method", in: type)
            guard !method.isEmpty else { throw .malformed(type, "the method is empty") }
            let traceContext = traced ? try body.readTraceContext(in: type) : nil
            return .request(
                Frame.Request(id: id, method: method, timeout: timeout == .zero ? nil : timeout, body: body, traceContext: traceContext)
            )
        case .response:
            let status = StatusCode(rawValue: try body.readField(UInt16.self, field: "status", in: type))
            let message = try body.readShortString(field: "message", in: type)
            return .response(Frame.Response(id: id, status: status, message: message, body: body))
        case .push:
            let topic = try body.readShortString(field: "topic", in: type)
            return .push(Frame.Push(topic: topic, body: body))
        case .ping:
            return .ping(Frame.Ping(id: id, data: body))
        case .pong:
            return .pong(Frame.Ping(id: id, data: body))
        case .cancel:
            try Self.expectEnd(body, type)
            return .cancel(Frame.Cancel(requestID: id))
        case .goAway:
            let reason = Frame.GoAway.Reason(rawValue: try body.readField(UInt16.self, field: "reason", in: type))
            let retryAfter = try body.readMilliseconds(field: "retry-after", in: type)
            let alternate = try body.readShortString(field: "alternate endpoint", in: type)
            let message = try body.readShortString(field: "message", in: type)
            try Self.expectEnd(body, type)
            return .goAway(
                Frame.GoAway(
                    reason: reason,
                    retryAfter: retryAfter,
                    alternateEndpoint: alternate.isEmpty ? nil : alternate,
                    message: message
                )
            )
        case .error:
            let code = StatusCode(rawValue: try body.readField(UInt16.self, field: "code", in: type))
            let message = try body.readShortString(field: "message", in: type)
            try Self.expectEnd(body, type)
            return .error(Frame.ErrorReport(code: code, message: message, relatedID: id))
        case .message:
            let ttl = try body.readMilliseconds(field: "ttl", in: type)
            let topic = try body.readShortString(field: "topic", in: type)
            let conversation = try body.readShortString(field: "conversation", in: type)
            let sequence = try body.readField(UInt64.self, field: "sequence", in: type)
            guard sequence >= 1 else { throw .malformed(type, "sequence numbers start at 1") }
            let traceContext = traced ? try body.readTraceContext(in: type) : nil
            return .message(
                Frame.Message(
                    id: id,
                    topic: topic,
                    conversation: conversation,
                    sequence: sequence,
                    ttl: ttl == .zero ? nil : ttl,
                    body: body,
                    traceContext: traceContext
                )
            )
        case .messageAck:
            let count = try body.readField(UInt16.self, field: "count", in: type)
            guard count >= 1 else { throw .malformed(type, "it acknowledges no message") }
            var entries: [Frame.MessageAck.Entry] = []
            entries.reserveCapacity(Int(count))
            for _ in 0..<count {
                let messageID = try body.readField(UInt64.self, field: "message id", in: type)
                let status = StatusCode(rawValue: try body.readField(UInt16.self, field: "status", in: type))
                entries.append(.init(id: messageID, status: status))
            }
            try Self.expectEnd(body, type)
            return .messageAck(Frame.MessageAck(entries: entries))
        case .delivery:
            guard id >= 1 else { throw .malformed(type, "sequence numbers start at 1") }
            let topic = try body.readShortString(field: "topic", in: type)
            return .delivery(Frame.Delivery(sequence: id, topic: topic, body: body))
        case .deliveryAck:
            try Self.expectEnd(body, type)
            return .deliveryAck(Frame.DeliveryAck(sequence: id))
        case .subscribe:
            let channel = try body.readChannel(in: type)
            let flags = try body.readField(UInt8.self, field: "flags", in: type)
            let epoch = try body.readField(UInt64.self, field: "epoch", in: type)
            let offset = try body.readField(UInt64.self, field: "offset", in: type)
            try Self.expectEnd(body, type)
            guard flags & ~Frame.Subscribe.Flag.known == 0 else { throw .malformed(type, "reserved flag bits are set") }
            let recovering = flags & Frame.Subscribe.Flag.recover != 0
            guard recovering || (epoch == 0 && offset == 0) else { throw .malformed(type, "a position without the recover flag") }
            return .subscribe(
                Frame.Subscribe(
                    id: id,
                    channel: channel,
                    recoverFrom: recovering ? ChannelPosition(epoch: epoch, offset: offset) : nil,
                    presenceEvents: flags & Frame.Subscribe.Flag.presenceEvents != 0
                )
            )
        case .subscribed:
            let status = StatusCode(rawValue: try body.readField(UInt16.self, field: "status", in: type))
            let message = try body.readShortString(field: "message", in: type)
            let epoch = try body.readField(UInt64.self, field: "epoch", in: type)
            let startingAfter = try body.readField(UInt64.self, field: "starting after", in: type)
            let gap = try body.readField(UInt8.self, field: "gap", in: type)
            try Self.expectEnd(body, type)
            guard gap <= 1 else { throw .malformed(type, "gap is 0 or 1, not \(gap)") }
            return .subscribed(
                Frame.Subscribed(id: id, status: status, message: message, epoch: epoch, startingAfter: startingAfter, gap: gap == 1)
            )
        case .publication:
            let channel = try body.readChannel(in: type)
            let epoch = try body.readField(UInt64.self, field: "epoch", in: type)
            let offset = try body.readField(UInt64.self, field: "offset", in: type)
            guard (epoch == 0) == (offset == 0) else {
                throw .malformed(type, "a channel with history has an epoch and offsets from 1; one without has neither")
            }
            let publisher = try body.readShortString(field: "publisher", in: type)
            return .publication(
                Frame.Publication(
                    channel: channel,
                    position: ChannelPosition(epoch: epoch, offset: offset),
                    publisher: publisher,
                    body: body
                )
            )
        case .unsubscribe:
            let channel = try body.readChannel(in: type)
            let status = StatusCode(rawValue: try body.readField(UInt16.self, field: "status", in: type))
            let message = try body.readShortString(field: "message", in: type)
            try Self.expectEnd(body, type)
            return .unsubscribe(Frame.Unsubscribe(channel: channel, status: status, message: message))
        case .presence:
            let channel = try body.readChannel(in: type)
            let rawKind = try body.readField(UInt8.self, field: "kind", in: type)
            guard let kind = Frame.Presence.Kind(rawValue: rawKind) else {
                throw .malformed(type, "kind is 1 (joined) or 2 (left), not \(rawKind)")
            }
            let clientID = try body.readShortString(field: "client id", in: type)
            guard !clientID.isEmpty else { throw .malformed(type, "the client id is empty") }
            let length = try body.readField(UInt32.self, field: "info length", in: type)
            guard length <= body.readableBytes, let info = body.readValidatedString(length: Int(length)) else {
                throw .malformed(type, "info is truncated or not valid UTF-8")
            }
            try Self.expectEnd(body, type)
            guard kind == .joined || info.isEmpty else { throw .malformed(type, "a client that left carries no info") }
            return .presence(Frame.Presence(channel: channel, kind: kind, clientID: clientID, info: info))
        default:
            guard type.isIgnorableExtension else {
                throw ProtocolError(code: .unknownFrameType, message: "unknown frame type 0x\(String(type.rawValue, radix: 16))")
            }
            return .extension(Frame.Extension(type: type, id: id, body: body))
        }
    }

    private static func parseHello(_ body: inout ByteBuffer) throws(ProtocolError) -> Frame.Hello {
        let type = FrameType.hello
        let minVersion = try body.readField(UInt8.self, field: "minimum version", in: type)
        let maxVersion = try body.readField(UInt8.self, field: "maximum version", in: type)
        guard minVersion >= 1, minVersion <= maxVersion else {
            throw .malformed(type, "version range \(minVersion)...\(maxVersion) is invalid")
        }
        let features = Features(rawValue: try body.readField(UInt32.self, field: "features", in: type))
        let maxBodySize = try body.readField(UInt32.self, field: "maximum body size", in: type)
        let fields = try body.readTLVs(in: type)
        var resume: Frame.Hello.Resume?
        if var value = fields[HelloField.resume] {
            guard value.readableBytes == 16, let epoch = value.readInteger(as: UInt64.self),
                let lastSequence = value.readInteger(as: UInt64.self)
            else {
                throw .malformed(type, "the resume field must be 16 bytes")
            }
            resume = Frame.Hello.Resume(epoch: epoch, lastSequence: lastSequence)
        }
        var outboxEpoch: UInt64?
        if var value = fields[HelloField.outboxEpoch] {
            guard value.readableBytes == 8, let epoch = value.readInteger(as: UInt64.self) else {
                throw .malformed(type, "the outbox epoch field must be 8 bytes")
            }
            outboxEpoch = epoch
        }
        return Frame.Hello(
            versions: minVersion...maxVersion,
            features: features,
            maxBodySize: maxBodySize,
            clientID: try fields.string(HelloField.clientID, field: "client id", in: type) ?? "",
            authToken: fields[HelloField.authToken],
            userAgent: try fields.string(HelloField.userAgent, field: "user agent", in: type),
            resume: resume,
            outboxEpoch: outboxEpoch
        )
    }

    private static func parseWelcome(_ body: inout ByteBuffer) throws(ProtocolError) -> Frame.Welcome {
        let type = FrameType.welcome
        let version = try body.readField(UInt8.self, field: "version", in: type)
        let features = Features(rawValue: try body.readField(UInt32.self, field: "features", in: type))
        let connectionID = try body.readField(UInt64.self, field: "connection id", in: type)
        let heartbeat = try body.readMilliseconds(field: "heartbeat interval", in: type)
        let idle = try body.readMilliseconds(field: "idle timeout", in: type)
        let maxBodySize = try body.readField(UInt32.self, field: "maximum body size", in: type)
        let maxConcurrent = try body.readField(UInt32.self, field: "maximum concurrent requests", in: type)
        let fields = try body.readTLVs(in: type)
        var deliveryEpoch: UInt64?
        if var value = fields[WelcomeField.deliveryEpoch] {
            guard value.readableBytes == 8, let epoch = value.readInteger(as: UInt64.self) else {
                throw .malformed(type, "the delivery epoch field must be 8 bytes")
            }
            deliveryEpoch = epoch
        }
        return Frame.Welcome(
            version: version,
            features: features,
            connectionID: connectionID,
            heartbeatInterval: heartbeat,
            idleTimeout: idle,
            maxBodySize: maxBodySize,
            maxConcurrentRequests: maxConcurrent,
            serverName: try fields.string(WelcomeField.serverName, field: "server name", in: type),
            deliveryEpoch: deliveryEpoch
        )
    }

    private static func expectEnd(_ body: ByteBuffer, _ type: FrameType) throws(ProtocolError) {
        guard body.readableBytes == 0 else {
            throw .malformed(type, "\(body.readableBytes) unexpected trailing bytes")
        }
    }
}

extension FrameEncoder: MessageToByteEncoder {
    public typealias OutboundIn = Frame

    /// Encodes `data` into `out`, for use in a `MessageToByteHandler`.
    public func encode(data: Frame, out: inout ByteBuffer) throws {
        try self.encode(data, into: &out)
    }
}

extension FrameType {
    /// Whether frames of this type may carry a COMPRESSED payload.
    var mayCompress: Bool {
        switch self {
        case .request, .response, .push, .message, .delivery, .publication: true
        default: false
        }
    }
}

extension Frame.Payload {
    /// The payload with its trailing application bytes inflated.
    fileprivate func inflated(by inflater: any PayloadInflating, limit: Int) throws(ProtocolError) -> Frame.Payload {
        switch self {
        case .request(var request):
            request.body = try inflater.inflate(request.body, limit: limit, of: .request)
            return .request(request)
        case .response(var response):
            response.body = try inflater.inflate(response.body, limit: limit, of: .response)
            return .response(response)
        case .push(var push):
            push.body = try inflater.inflate(push.body, limit: limit, of: .push)
            return .push(push)
        case .message(var message):
            message.body = try inflater.inflate(message.body, limit: limit, of: .message)
            return .message(message)
        case .delivery(var delivery):
            delivery.body = try inflater.inflate(delivery.body, limit: limit, of: .delivery)
            return .delivery(delivery)
        case .publication(var publication):
            publication.body = try inflater.inflate(publication.body, limit: limit, of: .publication)
            return .publication(publication)
        default:
            return self
        }
    }
}
