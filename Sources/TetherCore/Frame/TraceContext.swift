import NIOCore

/// A distributed trace's context as a REQUEST or MESSAGE carries it (PROTOCOL.md, section
/// 4.14): the fields a tracer injects, named as W3C Trace Context's HTTP headers
/// (`traceparent`, `tracestate`) or by the tracer's own propagation (`baggage`, say).
///
/// Bounded: at most ``maxFields`` fields of at most ``maxFieldSize`` bytes each (names and
/// values), so that a peer cannot make a trace context cost more than a few KiB.
public struct TraceContext: Sendable, Hashable {
    /// The most fields a trace context may have.
    public static let maxFields = 8
    /// The longest a field's name or value may be, in bytes of UTF-8 (W3C's `tracestate` is at
    /// most 512 characters).
    public static let maxFieldSize = 1024

    /// The fields, by lowercase name.
    public var fields: [String: String]

    public init(_ fields: [String: String] = [:]) {
        self.fields = fields
    }

    /// The bytes the field takes in a frame body.
    public var encodedSize: Int {
        1 + self.fields.reduce(0) { $0 + 4 + $1.key.utf8.count + $1.value.utf8.count }
    }
}

extension ByteBuffer {
    /// Writes a trace context field: `u8` count, then each pair of `string`s.
    mutating func writeTraceContext(_ context: TraceContext) throws(FrameEncodingError) {
        guard context.fields.count <= TraceContext.maxFields else {
            throw FrameEncodingError(message: "a trace context has at most \(TraceContext.maxFields) fields, not \(context.fields.count)")
        }
        self.writeInteger(UInt8(context.fields.count))
        for (name, value) in context.fields.sorted(by: { $0.key < $1.key }) {
            guard name.utf8.count <= TraceContext.maxFieldSize, value.utf8.count <= TraceContext.maxFieldSize else {
                throw FrameEncodingError(message: "a trace context field is at most \(TraceContext.maxFieldSize) bytes")
            }
            try self.writeShortString(name, field: "trace context name")
            try self.writeShortString(value, field: "trace context value")
        }
    }

    /// Reads a trace context field.
    mutating func readTraceContext(in type: FrameType) throws(ProtocolError) -> TraceContext {
        let count = try self.readField(UInt8.self, field: "trace context count", in: type)
        guard count <= TraceContext.maxFields else {
            throw .malformed(type, "a trace context has at most \(TraceContext.maxFields) fields, not \(count)")
        }
        var fields: [String: String] = [:]
        for _ in 0..<count {
            let name = try self.readShortString(field: "trace context name", in: type)
            let value = try self.readShortString(field: "trace context value", in: type)
            guard !name.isEmpty, name.utf8.count <= TraceContext.maxFieldSize, value.utf8.count <= TraceContext.maxFieldSize else {
                throw .malformed(type, "a trace context field's name is 1 to \(TraceContext.maxFieldSize) bytes, its value at most that")
            }
            guard fields.updateValue(value, forKey: name) == nil else {
                throw .malformed(type, "the trace context names '\(name)' twice")
            }
        }
        return TraceContext(fields)
    }
}
