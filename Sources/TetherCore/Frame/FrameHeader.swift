public import NIOCore

/// Constants of the fixed frame header (see PROTOCOL.md, "Frame header").
///
/// ```
///  0      2   3   4       6           10                  18          22          26
///  +------+---+---+-------+-----------+-------------------+-----------+-----------+------
///  |magic |ver|typ| flags |  stream   |        id         |  length   | checksum  | body…
///  +------+---+---+-------+-----------+-------------------+-----------+-----------+------
/// ```
/// All integers are big-endian.
public enum FrameHeader {
    /// The two bytes every frame starts with: ASCII "TH".
    public static let magic: UInt16 = 0x5448
    /// The size of the fixed header in bytes.
    public static let size = 26
    /// The number of header bytes covered by the checksum (everything before the checksum field).
    public static let checksummedSize = 22
    /// The offset of the body-length field.
    public static let lengthOffset = 18
    /// Where the flags field starts.
    public static let flagsOffset = 4
    /// The offset of the checksum field.
    public static let checksumOffset = 22
    /// The largest body a peer may ever announce, whatever it negotiates (16 MiB).
    public static let absoluteMaximumBodySize = 16 * 1024 * 1024
    /// The body limit in force before the handshake has negotiated one (64 KiB).
    public static let handshakeMaximumBodySize = 64 * 1024
}

extension FrameHeader {
    /// Writes a 26-byte header with the given fields, big-endian.
    ///
    /// ``FrameEncoder`` writes every header through this. Tests and tools use it to write what
    /// an encoder never would: a length that does not match the body, a reserved flag, a wrong
    /// version.
    /// - Parameters:
    ///   - version: The version byte; 1 for this protocol version.
    ///   - length: The body length to announce.
    ///   - checksum: The checksum field, 0 when the ``FrameFlags/checksum`` flag is clear.
    public static func write(
        version: UInt8 = 1,
        type: FrameType,
        flags: FrameFlags = [],
        stream: UInt32 = 0,
        id: UInt64 = 0,
        length: UInt32,
        checksum: UInt32 = 0,
        into buffer: inout ByteBuffer
    ) {
        // One bounds and uniqueness check for the 26 bytes, not one per field.
        buffer.writeWithUnsafeMutableBytes(minimumWritableBytes: Self.size) { bytes in
            bytes.storeBytes(of: Self.magic.bigEndian, toByteOffset: 0, as: UInt16.self)
            bytes.storeBytes(of: version, toByteOffset: 2, as: UInt8.self)
            bytes.storeBytes(of: type.rawValue, toByteOffset: 3, as: UInt8.self)
            bytes.storeBytes(of: flags.rawValue.bigEndian, toByteOffset: 4, as: UInt16.self)
            bytes.storeBytes(of: stream.bigEndian, toByteOffset: 6, as: UInt32.self)
            bytes.storeBytes(of: id.bigEndian, toByteOffset: 10, as: UInt64.self)
            bytes.storeBytes(of: length.bigEndian, toByteOffset: Self.lengthOffset, as: UInt32.self)
            bytes.storeBytes(of: checksum.bigEndian, toByteOffset: Self.checksumOffset, as: UInt32.self)
            return Self.size
        }
    }

    /// The fields of a header, as ``read(from:)`` finds them (not validated).
    public struct Fields: Hashable, Sendable {
        public var magic: UInt16
        public var version: UInt8
        public var type: FrameType
        public var flags: FrameFlags
        public var stream: UInt32
        public var id: UInt64
        public var length: UInt32
        public var checksum: UInt32
    }

    /// Reads the header at the front of `bytes`, or returns `nil` if it holds fewer than
    /// ``size`` bytes.
    public static func read(from bytes: UnsafeRawBufferPointer) -> Fields? {
        guard bytes.count >= Self.size else { return nil }
        return Fields(
            magic: UInt16(bigEndian: bytes.loadUnaligned(fromByteOffset: 0, as: UInt16.self)),
            version: bytes[2],
            type: FrameType(rawValue: bytes[3]),
            flags: FrameFlags(rawValue: UInt16(bigEndian: bytes.loadUnaligned(fromByteOffset: 4, as: UInt16.self))),
            stream: UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: 6, as: UInt32.self)),
            id: UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 10, as: UInt64.self)),
            length: UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: Self.lengthOffset, as: UInt32.self)),
            checksum: UInt32(bigEndian: bytes.loadUnaligned(fromByteOffset: Self.checksumOffset, as: UInt32.self))
        )
    }
}

/// The type byte of a frame.
///
/// Types `0x01`–`0x0A` are the core of protocol version 1; `0x10`–`0x13` belong to the
/// reliable-delivery feature (`0x14`–`0x1F` are reserved for it), `0x20`–`0x24` to the
/// channels feature (`0x25`–`0x2F` are reserved for it); `0x80`–`0xFF` are extension
/// frames, which a receiver that does not know them ignores. Any other unknown type is a
/// protocol error.
public struct FrameType: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
    public var rawValue: UInt8
    public init(rawValue: UInt8) { self.rawValue = rawValue }

    public static let hello = FrameType(rawValue: 0x01)
    public static let welcome = FrameType(rawValue: 0x02)
    public static let request = FrameType(rawValue: 0x03)
    public static let response = FrameType(rawValue: 0x04)
    public static let push = FrameType(rawValue: 0x05)
    public static let ping = FrameType(rawValue: 0x06)
    public static let pong = FrameType(rawValue: 0x07)
    public static let cancel = FrameType(rawValue: 0x08)
    public static let goAway = FrameType(rawValue: 0x09)
    public static let error = FrameType(rawValue: 0x0A)
    public static let message = FrameType(rawValue: 0x10)
    public static let messageAck = FrameType(rawValue: 0x11)
    public static let delivery = FrameType(rawValue: 0x12)
    public static let deliveryAck = FrameType(rawValue: 0x13)
    public static let subscribe = FrameType(rawValue: 0x20)
    public static let subscribed = FrameType(rawValue: 0x21)
    public static let publication = FrameType(rawValue: 0x22)
    public static let unsubscribe = FrameType(rawValue: 0x23)
    public static let presence = FrameType(rawValue: 0x24)

    /// Whether a receiver that does not know this type must ignore the frame (types `0x80`–`0xFF`).
    public var isIgnorableExtension: Bool { self.rawValue >= 0x80 }

    public var description: String {
        switch self {
        case .hello: "HELLO"
        case .welcome: "WELCOME"
        case .request: "REQUEST"
        case .response: "RESPONSE"
        case .push: "PUSH"
        case .ping: "PING"
        case .pong: "PONG"
        case .cancel: "CANCEL"
        case .goAway: "GOAWAY"
        case .error: "ERROR"
        case .message: "MESSAGE"
        case .messageAck: "MESSAGE_ACK"
        case .delivery: "DELIVERY"
        case .deliveryAck: "DELIVERY_ACK"
        case .subscribe: "SUBSCRIBE"
        case .subscribed: "SUBSCRIBED"
        case .publication: "PUBLICATION"
        case .unsubscribe: "UNSUBSCRIBE"
        case .presence: "PRESENCE"
        default: "TYPE(0x\(String(self.rawValue, radix: 16)))"
        }
    }
}

/// The flag bits of a frame header.
///
/// ``checksum`` applies to every frame; ``expired`` only to MESSAGE. Every other bit must be
/// zero, and a receiver rejects a frame that sets one.
public struct FrameFlags: OptionSet, Hashable, Sendable {
    public var rawValue: UInt16
    public init(rawValue: UInt16) { self.rawValue = rawValue }

    /// The checksum field holds the CRC-32C of header bytes 0–21 followed by the body.
    public static let checksum = FrameFlags(rawValue: 0x0001)
    /// On MESSAGE only: the client gave up on the message (its time to live ran out). Set and
    /// read through ``Frame/Message/expired``; it never appears in ``Frame/flags``.
    public static let expired = FrameFlags(rawValue: 0x0002)
    /// On REQUEST, RESPONSE, PUSH, MESSAGE and DELIVERY, once ``Features/compression`` was
    /// negotiated: the frame's payload is raw DEFLATE data. Set by the encoder when it compresses
    /// and cleared by the decoder when it inflates; it never appears in ``Frame/flags``.
    public static let compressed = FrameFlags(rawValue: 0x0004)

    /// On REQUEST and MESSAGE, once ``Features/traceContext`` was negotiated: the body holds a
    /// trace context field. Set and read through the frames' `traceContext`; it never appears
    /// in ``Frame/flags``.
    public static let traceContext = FrameFlags(rawValue: 0x0008)

    /// On DELIVERY only, once ``Features/sharedDeliveries`` was negotiated: the deliveries
    /// between the last one sent on this connection (or the HELLO's resume point) and this one
    /// were acknowledged on another connection of the same client id, so the client takes this
    /// one as the next. Set and read through ``Frame/Delivery/afterAcknowledged``; it never
    /// appears in ``Frame/flags``.
    public static let ackedElsewhere = FrameFlags(rawValue: 0x0010)

    /// Every flag this implementation knows.
    public static let known: FrameFlags = [.checksum, .expired, .compressed, .traceContext, .ackedElsewhere]
}
