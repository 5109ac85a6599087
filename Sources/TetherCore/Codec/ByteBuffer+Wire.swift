import NIOCore

/// Reading and writing the field encodings of PROTOCOL.md ("Field encodings").
extension ByteBuffer {
    /// Writes a `u16`-length-prefixed UTF-8 string.
    mutating func writeShortString(_ string: String, field: StaticString) throws(FrameEncodingError) {
        let length = string.utf8.count
        guard length <= Int(UInt16.max) else {
            throw FrameEncodingError(message: "\(field) is \(length) bytes; the limit is 65535")
        }
        self.writeInteger(UInt16(length))
        self.writeString(string)
    }

    /// Reads a `u16`-length-prefixed string, rejecting invalid UTF-8.
    mutating func readShortString(field: StaticString, in type: FrameType) throws(ProtocolError) -> String {
        guard let length = self.readInteger(as: UInt16.self) else {
            throw .malformed(type, "\(field) length is truncated")
        }
        guard let string = self.readValidatedString(length: Int(length)) else {
            throw .malformed(type, "\(field) is truncated or not valid UTF-8")
        }
        return string
    }

    /// Writes a channel name: a string of 1 to ``Frame/maxChannelLength`` bytes.
    mutating func writeChannel(_ channel: String) throws(FrameEncodingError) {
        let length = channel.utf8.count
        guard length >= 1, length <= Frame.maxChannelLength else {
            throw FrameEncodingError(message: "a channel name is 1 to \(Frame.maxChannelLength) bytes, not \(length)")
        }
        try self.writeShortString(channel, field: "channel")
    }

    /// Reads a channel name: a string of 1 to ``Frame/maxChannelLength`` bytes.
    mutating func readChannel(in type: FrameType) throws(ProtocolError) -> String {
        let channel = try self.readShortString(field: "channel", in: type)
        guard Frame.isValidChannelName(channel) else {
            throw .malformed(type, "a channel name is 1 to \(Frame.maxChannelLength) bytes, not \(channel.utf8.count)")
        }
        return channel
    }

    /// Reads `length` bytes as UTF-8, returning `nil` if they are missing or not valid UTF-8.
    mutating func readValidatedString(length: Int) -> String? {
        guard length >= 0, self.readableBytes >= length else { return nil }
        let string: String? = self.withUnsafeReadableBytes { readable in
            let bytes = UnsafeRawBufferPointer(rebasing: readable[..<length])
            let string = String(decoding: bytes, as: UTF8.self)
            // ASCII is valid UTF-8; anything else was repaired with U+FFFD if it was invalid,
            // and a repaired string differs from the bytes.
            if bytes.allSatisfy({ $0 < 0x80 }) { return string }
            var copy = string
            let same = copy.withUTF8 { $0.elementsEqual(bytes) }
            return same ? copy : nil
        }
        guard let string else { return nil }
        self.moveReaderIndex(forwardBy: length)
        return string
    }

    /// Writes a duration as whole milliseconds in a `u32`, saturating.
    mutating func writeMilliseconds(_ duration: Duration) {
        self.writeInteger(UInt32(clamping: duration.wholeMilliseconds))
    }

    /// Writes a duration as milliseconds in a `u32`, rounded up (so a positive duration never
    /// becomes 0, and a deadline derived from it is never earlier), saturating.
    mutating func writeMillisecondsRoundingUp(_ duration: Duration) {
        var milliseconds = duration.wholeMilliseconds
        if duration > .milliseconds(milliseconds) { milliseconds += 1 }
        self.writeInteger(UInt32(clamping: milliseconds))
    }

    /// Reads a `u32` of milliseconds.
    mutating func readMilliseconds(field: StaticString, in type: FrameType) throws(ProtocolError) -> Duration {
        guard let value = self.readInteger(as: UInt32.self) else {
            throw .malformed(type, "\(field) is truncated")
        }
        return .milliseconds(Int64(value))
    }

    /// Reads a fixed-size integer field.
    mutating func readField<T: FixedWidthInteger>(
        _: T.Type = T.self,
        field: StaticString,
        in type: FrameType
    ) throws(ProtocolError) -> T {
        guard let value = self.readInteger(as: T.self) else {
            throw .malformed(type, "\(field) is truncated")
        }
        return value
    }

    /// Writes one TLV field: `u16` tag, `u16` length, value.
    mutating func writeTLV(tag: UInt16, field: StaticString, _ value: ByteBuffer) throws(FrameEncodingError) {
        guard value.readableBytes <= Int(UInt16.max) else {
            throw FrameEncodingError(message: "\(field) is \(value.readableBytes) bytes; the limit is 65535")
        }
        self.writeInteger(tag)
        self.writeInteger(UInt16(value.readableBytes))
        self.writeImmutableBuffer(value)
    }

    /// Writes one TLV field holding a UTF-8 string.
    mutating func writeTLV(tag: UInt16, field: StaticString, _ value: String) throws(FrameEncodingError) {
        try self.writeTLV(tag: tag, field: field, ByteBuffer(string: value))
    }

    /// Reads the TLV fields that fill the rest of a buffer; each tag may occur at most once.
    mutating func readTLVs(in type: FrameType) throws(ProtocolError) -> [UInt16: ByteBuffer] {
        var fields: [UInt16: ByteBuffer] = [:]
        while self.readableBytes > 0 {
            guard let tag = self.readInteger(as: UInt16.self), let length = self.readInteger(as: UInt16.self) else {
                throw .malformed(type, "field header is truncated")
            }
            guard let value = self.readSlice(length: Int(length)) else {
                throw .malformed(type, "field 0x\(String(tag, radix: 16)) is truncated")
            }
            guard fields.updateValue(value, forKey: tag) == nil else {
                throw .malformed(type, "field 0x\(String(tag, radix: 16)) occurs twice")
            }
        }
        return fields
    }
}

extension Dictionary where Key == UInt16, Value == ByteBuffer {
    /// The UTF-8 string value of a TLV field, if present.
    func string(_ tag: UInt16, field: StaticString, in type: FrameType) throws(ProtocolError) -> String? {
        guard var value = self[tag] else { return nil }
        guard let string = value.readValidatedString(length: value.readableBytes) else {
            throw .malformed(type, "\(field) is not valid UTF-8")
        }
        return string
    }
}

/// A frame that cannot be encoded, for example because a string field exceeds 65,535 bytes.
public struct FrameEncodingError: Error, Hashable, Sendable, CustomStringConvertible {
    /// What is wrong with the frame.
    public var message: String
    public init(message: String) { self.message = message }
    public var description: String { "cannot encode frame: \(self.message)" }
}
