import NIOCore
import TetherCompression
import TetherCore

/// One push or channel publication, or several consecutive ones to the same recipients, encoded
/// once for all of them: with and without a checksum, since each connection negotiated whether
/// its frames carry one.
struct EncodedPush: Sendable {
    /// A frame sent to many connections: a PUSH, or a channel's PUBLICATION.
    enum Message: Sendable {
        case push(Frame.Push)
        /// `sequence`: the publication's number among every publication of its channel on this
        /// node (with or without history), which tells a subscriber's connection whether it
        /// was published after the subscription went live (see ``ChannelHub``).
        case publication(Frame.Publication, sequence: UInt64)

        var payload: Frame.Payload {
            switch self {
            case .push(let push): .push(push)
            case .publication(let publication, _): .publication(publication)
            }
        }

        var bodySize: Int {
            switch self {
            case .push(let push): push.bodySize
            case .publication(let publication, _): publication.bodySize
            }
        }

        /// The push's topic or the publication's channel, for logs.
        var name: String {
            switch self {
            case .push(let push): push.topic
            case .publication(let publication, _): publication.channel
            }
        }
    }

    /// The messages themselves, in order, for connections that cannot take these bytes: a
    /// channel without Tether's encoder, one still in its handshake, or one whose size limit is
    /// below ``largestBody``.
    var pushes: [Message]
    /// The frames without a checksum, one after another.
    var plain: ByteBuffer
    /// The frames with their CRC-32C, one after another.
    var checksummed: ByteBuffer
    /// The size of the largest body among ``pushes``, for the recipients' size limits.
    var largestBody: Int
    /// Whether a channel publication is among ``pushes`` (each recipient checks it is for one
    /// of its live subscriptions).
    var hasPublications: Bool

    init(_ push: Frame.Push, allocator: ByteBufferAllocator) throws(FrameEncodingError) {
        try self.init(.push(push), allocator: allocator)
    }

    init(_ push: Message, allocator: ByteBufferAllocator) throws(FrameEncodingError) {
        let encoder = FrameEncoder()
        self.pushes = [push]
        // Both encodings in one buffer (one allocation), each a slice of it. Each takes the
        // header, the body, and at most a 4-byte checksum.
        var both = allocator.buffer(capacity: 2 * (FrameHeader.size + push.bodySize + 4))
        let payload = push.payload
        try encoder.encode(Frame(payload), into: &both)
        let plainSize = both.readableBytes
        try encoder.encode(Frame(payload, flags: .checksum), into: &both)
        self.plain = both.readSlice(length: plainSize)!
        self.checksummed = both
        self.largestBody = push.bodySize
        if case .publication = push { self.hasPublications = true } else { self.hasPublications = false }
    }

    /// Several encoded pushes as one, their frames joined in order.
    init(joining parts: some Collection<EncodedPush>, allocator: ByteBufferAllocator) {
        self.pushes = []
        self.largestBody = 0
        self.hasPublications = false
        self.plain = allocator.buffer(capacity: parts.reduce(0) { $0 + $1.plain.readableBytes })
        self.checksummed = allocator.buffer(capacity: parts.reduce(0) { $0 + $1.checksummed.readableBytes })
        for part in parts {
            self.pushes.append(contentsOf: part.pushes)
            self.plain.writeImmutableBuffer(part.plain)
            self.checksummed.writeImmutableBuffer(part.checksummed)
            self.largestBody = max(self.largestBody, part.largestBody)
            self.hasPublications = self.hasPublications || part.hasPublications
        }
    }

    /// The same pushes in buffers of their own.
    ///
    /// Every connection that gets the bytes retains their storage; threads that share one
    /// storage fight over its reference count, so each event loop gets its own copy.
    func copy(allocator: ByteBufferAllocator) -> EncodedPush {
        var copy = self
        copy.plain = allocator.buffer(buffer: self.plain)
        copy.checksummed = allocator.buffer(buffer: self.checksummed)
        return copy
    }
}

/// A push's frames compressed once for every connection of one batch that compresses them.
///
/// Every connection that negotiated compression compresses with the gateway's one
/// ``Compression`` (threshold and level), and each payload on its own: the compressed frames
/// are the same bytes for all of them. The first connection of a batch to need them compresses
/// them (its own compression budget pays for it), the others write those bytes. Lives on one
/// event loop, for one write of one ``EncodedPush``.
struct CompressedPush {
    private var plain: ByteBuffer?
    private var checksummed: ByteBuffer?

    init() {}

    /// The frames of `push`, compressed with `deflater`'s settings, with or without their checksum.
    mutating func frames(
        of push: EncodedPush,
        checksum: Bool,
        deflater: PayloadDeflater,
        allocator: ByteBufferAllocator
    ) throws(FrameEncodingError) -> ByteBuffer {
        if let ready = checksum ? self.checksummed : self.plain { return ready }
        var bytes = allocator.buffer(capacity: push.plain.readableBytes)
        let encoder = FrameEncoder()
        for frame in push.pushes {
            try encoder.encode(Frame(frame.payload, flags: checksum ? .checksum : []), into: &bytes, deflater: deflater)
        }
        if checksum { self.checksummed = bytes } else { self.plain = bytes }
        return bytes
    }
}
