public import NIOCore

/// How a transport hands Tether frames to a connection: as a byte stream, or one per message.
///
/// TCP and TLS (and an HTTP body) carry a **byte stream**: frames follow one another and a read
/// may hold part of a frame or several. WebSocket carries **messages**: each binary message
/// holds exactly one frame (PROTOCOL.md, "Transport bindings").
public enum Framing: Sendable, Hashable {
    /// Reads are arbitrary slices of a stream of frames; writes may join frames.
    case byteStream
    /// Each read is one whole frame, and each write must be one whole frame.
    case messages
}

/// Turns a connection's inbound bytes into frames: a ``FrameDecoder`` and the bytes it has not
/// consumed yet, owned as a value by the connection's handler.
///
/// ```swift
/// var reader = FrameReader(framing: .byteStream)
/// reader.append(bytes)                 // a read from the channel
/// while let frame = try reader.next() { handle(frame) }
/// reader.readComplete()                // gives back the space of consumed frames
/// ```
///
/// The first error is final: afterwards ``next()`` returns `nil` and ``append(_:)`` drops the
/// bytes, as the connection is being closed.
public struct FrameReader: Sendable {
    /// How the transport delivers frames.
    public let framing: Framing
    private var decoder: FrameDecoder
    private var cumulation: ByteBuffer?
    /// A decoding error happened: nothing more is decoded.
    public private(set) var failed = false

    /// - Parameters:
    ///   - framing: How the transport delivers frames.
    ///   - maxBodySize: The body limit before the handshake raises it.
    public init(framing: Framing, maxBodySize: Int = FrameHeader.handshakeMaximumBodySize) {
        self.framing = framing
        self.decoder = FrameDecoder(maxBodySize: maxBodySize)
    }

    /// The largest frame body accepted; raised once the handshake is done. Never above
    /// ``FrameHeader/absoluteMaximumBodySize``.
    public var maxBodySize: Int {
        get { self.decoder.maxBodySize }
        set { self.decoder.maxBodySize = min(newValue, FrameHeader.absoluteMaximumBodySize) }
    }

    /// Whether REQUEST and MESSAGE may carry a trace context (negotiated).
    public var acceptsTraceContext: Bool {
        get { self.decoder.acceptsTraceContext }
        set { self.decoder.acceptsTraceContext = newValue }
    }

    /// Whether a DELIVERY may carry the ACKED_ELSEWHERE flag (negotiated).
    public var acceptsSharedDeliveries: Bool {
        get { self.decoder.acceptsSharedDeliveries }
        set { self.decoder.acceptsSharedDeliveries = newValue }
    }

    /// Whether bytes of a frame not yet complete are held.
    public var hasPartialFrame: Bool { (self.cumulation?.readableBytes ?? 0) > 0 }

    /// The bytes read and not decoded yet: part of a frame, or frames left while their reader
    /// held reads.
    public var bufferedBytes: Int { self.cumulation?.readableBytes ?? 0 }

    /// Takes the bytes of one read (a slice of the stream, or one whole message).
    public mutating func append(_ bytes: ByteBuffer) {
        guard !self.failed else { return }
        if var cumulation = self.cumulation, cumulation.readableBytes > 0 {
            self.cumulation = nil  // keep the buffer uniquely referenced while appending
            var bytes = bytes
            cumulation.writeBuffer(&bytes)
            self.cumulation = cumulation
        } else {
            self.cumulation = bytes
        }
    }

    /// The next complete frame from the bytes appended so far, or `nil` if more are needed.
    /// - Throws: ``ProtocolError`` for a malformed frame, one over the body limit, or (with
    ///   ``Framing/messages``) a message that does not hold exactly one frame.
    /// - Parameter inflater: With ``Features/compression`` negotiated: inflates COMPRESSED payloads.
    public mutating func next(inflater: (any PayloadInflating)? = nil) throws(ProtocolError) -> Frame? {
        guard !self.failed, var buffer = self.cumulation, buffer.readableBytes > 0 else { return nil }
        self.cumulation = nil
        let frame: Frame?
        do {
            frame = try self.decoder.decodeFrame(from: &buffer, inflater: inflater)
        } catch {
            self.failed = true
            throw error
        }
        switch self.framing {
        case .byteStream:
            self.cumulation = buffer
        case .messages:
            guard frame != nil else {
                self.failed = true
                throw ProtocolError(code: .protocolError, message: "a message ends inside a frame; a message holds exactly one frame")
            }
            guard buffer.readableBytes == 0 else {
                self.failed = true
                throw ProtocolError(code: .protocolError, message: "a message holds more than one frame")
            }
        }
        return frame
    }

    /// The channel's read is complete: forgets a consumed buffer, or gives back the space of
    /// consumed frames before the next read appends to it.
    public mutating func readComplete() {
        if let cumulation = self.cumulation, cumulation.readableBytes == 0 {
            self.cumulation = nil
        } else if var cumulation = self.cumulation, cumulation.readerIndex > 4096 {
            self.cumulation = nil
            cumulation.discardReadBytes()
            self.cumulation = cumulation
        }
    }
}
