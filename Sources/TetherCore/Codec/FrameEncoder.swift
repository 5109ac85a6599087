public import NIOCore

/// Serialises ``Frame``s into the wire format of PROTOCOL.md.
///
/// The encoder is stateless. It computes a checksum for every frame whose ``Frame/flags``
/// contain ``FrameFlags/checksum``; deciding which frames get one is the connection's job.
///
/// ```swift
/// var buffer = ByteBuffer()
/// try FrameEncoder().encode(Frame(.ping(.init(id: 1))), into: &buffer)
/// ```
public struct FrameEncoder: Sendable {
    /// The version byte written into every header.
    public static let version: UInt8 = 1

    public init() {}

    /// Appends the encoding of `frame` to `buffer`.
    ///
    /// On failure nothing is appended.
    /// - Throws: ``FrameEncodingError`` if a field exceeds its size limit or the body exceeds
    ///   ``FrameHeader/absoluteMaximumBodySize``.
    /// - Parameter deflater: With ``Features/compression`` negotiated: compresses the payload
    ///   of a REQUEST, RESPONSE, PUSH, MESSAGE, DELIVERY or PUBLICATION when it is worth it.
    public func encode(_ frame: Frame, into buffer: inout ByteBuffer, deflater: (any PayloadDeflating)? = nil) throws(FrameEncodingError) {
        let start = buffer.writerIndex
        do {
            try self.encodeUnchecked(frame, into: &buffer, start: start, deflater: deflater)
        } catch {
            buffer.moveWriterIndex(to: start)
            throw error
        }
    }

    /// The encoding of `frame` in a buffer of its own, allocated at about the right size.
    ///
    /// ```swift
    /// let bytes = try FrameEncoder().encode(frame, allocator: channel.allocator)
    /// ```
    /// - Throws: ``FrameEncodingError``, as ``encode(_:into:)``.
    public func encode(_ frame: Frame, allocator: ByteBufferAllocator) throws(FrameEncodingError) -> ByteBuffer {
        var buffer = allocator.buffer(capacity: FrameHeader.size + Self.bodySizeHint(frame.payload))
        try self.encodeUnchecked(frame, into: &buffer, start: buffer.writerIndex)
        return buffer
    }

    private func encodeUnchecked(
        _ frame: Frame,
        into buffer: inout ByteBuffer,
        start: Int,
        deflater: (any PayloadDeflating)? = nil
    ) throws(FrameEncodingError) {
        var flags = frame.flags.intersection(.checksum)
        // A payload compressed already (a delivery stored so): written as it is.
        if frame.flags.contains(.compressed), frame.type.mayCompress { flags.insert(.compressed) }
        switch frame.payload {
        case .message(let message):
            if message.expired { flags.insert(.expired) }
            if message.traceContext != nil { flags.insert(.traceContext) }
        case .request(let request) where request.traceContext != nil:
            flags.insert(.traceContext)
        case .delivery(let delivery) where delivery.afterAcknowledged:
            flags.insert(.ackedElsewhere)
        default:
            break
        }
        buffer.reserveCapacity(minimumWritableBytes: FrameHeader.size + Self.bodySizeHint(frame.payload))
        // Length and checksum are patched in once the body is written.
        FrameHeader.write(
            version: Self.version,
            type: frame.type,
            flags: flags,
            stream: frame.stream,
            id: Self.headerID(of: frame.payload),
            length: 0,
            into: &buffer
        )

        let bodyStart = buffer.writerIndex
        let payload = try Self.writeBody(frame.payload, into: &buffer)
        if let payload, !flags.contains(.compressed), let deflater, deflater.deflate(payload, into: &buffer) {
            flags.insert(.compressed)
            buffer.setInteger(flags.rawValue, at: start + FrameHeader.flagsOffset)
        } else if let payload {
            buffer.writeImmutableBuffer(payload)
        }
        let length = buffer.writerIndex - bodyStart
        guard length <= FrameHeader.absoluteMaximumBodySize else {
            throw FrameEncodingError(message: "the body is \(length) bytes; the protocol limit is \(FrameHeader.absoluteMaximumBodySize)")
        }
        buffer.setInteger(UInt32(length), at: start + FrameHeader.lengthOffset)

        if flags.contains(.checksum) {
            let checksum = buffer.withUnsafeReadableBytes { bytes in
                let frameBytes = UnsafeRawBufferPointer(rebasing: bytes[(start - buffer.readerIndex)...])
                return Self.checksum(header: frameBytes, body: UnsafeRawBufferPointer(rebasing: frameBytes[FrameHeader.size...]))
            }
            buffer.setInteger(checksum, at: start + FrameHeader.checksumOffset)
        }
    }

    /// The CRC-32C of a frame: header bytes 0–21, then the body.
    static func checksum(header: UnsafeRawBufferPointer, body: UnsafeRawBufferPointer) -> UInt32 {
        var crc = CRC32C()
        crc.update(UnsafeRawBufferPointer(rebasing: header[..<FrameHeader.checksummedSize]))
        crc.update(body)
        return crc.value
    }

    /// The value of the header's id field for a payload.
    static func headerID(of payload: Frame.Payload) -> UInt64 {
        switch payload {
        case .request(let request): request.id
        case .response(let response): response.id
        case .ping(let ping), .pong(let ping): ping.id
        case .cancel(let cancel): cancel.requestID
        case .error(let error): error.relatedID
        case .message(let message): message.id
        case .delivery(let delivery): delivery.sequence
        case .deliveryAck(let ack): ack.sequence
        case .subscribe(let subscribe): subscribe.id
        case .subscribed(let subscribed): subscribed.id
        case .extension(let ext): ext.id
        case .hello, .welcome, .push, .goAway, .messageAck, .publication, .unsubscribe, .presence: 0
        }
    }

    private static func bodySizeHint(_ payload: Frame.Payload) -> Int {
        switch payload {
        case .request(let request): request.bodySize
        case .response(let response): response.bodySize
        case .push(let push): push.bodySize
        case .ping(let ping), .pong(let ping): ping.data.readableBytes
        case .message(let message):
            16 + message.topic.utf8.count + message.conversation.utf8.count + message.body.readableBytes
                + (message.traceContext?.encodedSize ?? 0)
        case .messageAck(let ack): 2 + 10 * ack.entries.count
        case .delivery(let delivery): 2 + delivery.topic.utf8.count + delivery.body.readableBytes
        case .publication(let publication): publication.bodySize
        case .presence(let presence): presence.bodySize
        case .extension(let ext): ext.body.readableBytes
        case .hello, .welcome, .cancel, .goAway, .error, .deliveryAck, .subscribe, .subscribed, .unsubscribe: 64
        }
    }

    /// Writes the body, but for the trailing payload of the types that may compress it.
    /// - Returns: That payload, which the caller writes (compressed or not).
    private static func writeBody(_ payload: Frame.Payload, into buffer: inout ByteBuffer) throws(FrameEncodingError) -> ByteBuffer? {
        switch payload {
        case .hello(let hello):
            buffer.writeInteger(hello.versions.lowerBound)
            buffer.writeInteger(hello.versions.upperBound)
            buffer.writeInteger(hello.features.rawValue)
            buffer.writeInteger(hello.maxBodySize)
            try buffer.writeTLV(tag: HelloField.clientID, field: "client id", hello.clientID)
            if let token = hello.authToken {
                try buffer.writeTLV(tag: HelloField.authToken, field: "auth token", token)
            }
            if let userAgent = hello.userAgent {
                try buffer.writeTLV(tag: HelloField.userAgent, field: "user agent", userAgent)
            }
            if let resume = hello.resume {
                var value = ByteBuffer()
                value.writeInteger(resume.epoch)
                value.writeInteger(resume.lastSequence)
                try buffer.writeTLV(tag: HelloField.resume, field: "resume", value)
            }
            if let epoch = hello.outboxEpoch {
                var value = ByteBuffer()
                value.writeInteger(epoch)
                try buffer.writeTLV(tag: HelloField.outboxEpoch, field: "outbox epoch", value)
            }

        case .welcome(let welcome):
            buffer.writeInteger(welcome.version)
            buffer.writeInteger(welcome.features.rawValue)
            buffer.writeInteger(welcome.connectionID)
            buffer.writeMilliseconds(welcome.heartbeatInterval)
            buffer.writeMilliseconds(welcome.idleTimeout)
            buffer.writeInteger(welcome.maxBodySize)
            buffer.writeInteger(welcome.maxConcurrentRequests)
            if let serverName = welcome.serverName {
                try buffer.writeTLV(tag: WelcomeField.serverName, field: "server name", serverName)
            }
            if let epoch = welcome.deliveryEpoch {
                var value = ByteBuffer()
                value.writeInteger(epoch)
                try buffer.writeTLV(tag: WelcomeField.deliveryEpoch, field: "delivery epoch", value)
            }

        case .request(let request):
            // Rounded up: the gateway's deadline must not come before the client's.
            buffer.writeMillisecondsRoundingUp(request.timeout ?? .zero)
            try buffer.writeShortString(request.method, field: "method")
            if let traceContext = request.traceContext { try buffer.writeTraceContext(traceContext) }
            return request.body

        case .response(let response):
            buffer.writeInteger(response.status.rawValue)
            try buffer.writeShortString(response.message, field: "message")
            return response.body

        case .push(let push):
            try buffer.writeShortString(push.topic, field: "topic")
            return push.body

        case .ping(let ping), .pong(let ping):
            buffer.writeImmutableBuffer(ping.data)

        case .cancel:
            break

        case .goAway(let goAway):
            buffer.writeInteger(goAway.reason.rawValue)
            buffer.writeMilliseconds(goAway.retryAfter)
            try buffer.writeShortString(goAway.alternateEndpoint ?? "", field: "alternate endpoint")
            try buffer.writeShortString(goAway.message, field: "message")

        case .error(let error):
            buffer.writeInteger(error.code.rawValue)
            try buffer.writeShortString(error.message, field: "message")

        case .message(let message):
            buffer.writeMillisecondsRoundingUp(message.ttl ?? .zero)
            try buffer.writeShortString(message.topic, field: "topic")
            try buffer.writeShortString(message.conversation, field: "conversation")
            buffer.writeInteger(message.sequence)
            if let traceContext = message.traceContext { try buffer.writeTraceContext(traceContext) }
            return message.body

        case .messageAck(let ack):
            guard !ack.entries.isEmpty, ack.entries.count <= Int(UInt16.max) else {
                throw FrameEncodingError(message: "a MESSAGE_ACK carries 1 to 65535 entries, not \(ack.entries.count)")
            }
            buffer.writeInteger(UInt16(ack.entries.count))
            for entry in ack.entries {
                buffer.writeInteger(entry.id)
                buffer.writeInteger(entry.status.rawValue)
            }

        case .delivery(let delivery):
            try buffer.writeShortString(delivery.topic, field: "topic")
            return delivery.body

        case .deliveryAck:
            break

        case .subscribe(let subscribe):
            try buffer.writeChannel(subscribe.channel)
            var flags: UInt8 = subscribe.presenceEvents ? Frame.Subscribe.Flag.presenceEvents : 0
            if subscribe.recoverFrom != nil { flags |= Frame.Subscribe.Flag.recover }
            buffer.writeInteger(flags)
            buffer.writeInteger(subscribe.recoverFrom?.epoch ?? 0)
            buffer.writeInteger(subscribe.recoverFrom?.offset ?? 0)

        case .subscribed(let subscribed):
            buffer.writeInteger(subscribed.status.rawValue)
            try buffer.writeShortString(subscribed.message, field: "message")
            buffer.writeInteger(subscribed.epoch)
            buffer.writeInteger(subscribed.startingAfter)
            buffer.writeInteger(UInt8(subscribed.gap ? 1 : 0))

        case .publication(let publication):
            guard (publication.position.epoch == 0) == (publication.position.offset == 0) else {
                throw FrameEncodingError(
                    message: "a publication's position has both an epoch and an offset, or neither: \(publication.position)"
                )
            }
            try buffer.writeChannel(publication.channel)
            buffer.writeInteger(publication.position.epoch)
            buffer.writeInteger(publication.position.offset)
            try buffer.writeShortString(publication.publisher, field: "publisher")
            return publication.body

        case .unsubscribe(let unsubscribe):
            try buffer.writeChannel(unsubscribe.channel)
            buffer.writeInteger(unsubscribe.status.rawValue)
            try buffer.writeShortString(unsubscribe.message, field: "message")

        case .presence(let presence):
            guard !presence.clientID.isEmpty else { throw FrameEncodingError(message: "a PRESENCE names a client: its client id is empty") }
            guard presence.kind == .joined || presence.info.isEmpty else {
                throw FrameEncodingError(message: "a PRESENCE of a client that left carries no info")
            }
            try buffer.writeChannel(presence.channel)
            buffer.writeInteger(presence.kind.rawValue)
            try buffer.writeShortString(presence.clientID, field: "client id")
            guard presence.info.utf8.count <= Int(UInt32.max) else { throw FrameEncodingError(message: "a presence's info is too long") }
            buffer.writeInteger(UInt32(presence.info.utf8.count))
            buffer.writeString(presence.info)

        case .extension(let ext):
            buffer.writeImmutableBuffer(ext.body)
        }
        return nil
    }
}

/// The TLV tags of HELLO (PROTOCOL.md, "HELLO").
enum HelloField {
    static let clientID: UInt16 = 0x0001
    static let authToken: UInt16 = 0x0002
    static let userAgent: UInt16 = 0x0003
    static let resume: UInt16 = 0x0004
    static let outboxEpoch: UInt16 = 0x0005
}

/// The TLV tags of WELCOME (PROTOCOL.md, "WELCOME").
enum WelcomeField {
    static let serverName: UInt16 = 0x0001
    static let deliveryEpoch: UInt16 = 0x0002
}
