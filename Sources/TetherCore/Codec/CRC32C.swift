import CTetherCRC32C

/// CRC-32C (Castagnoli), the checksum of Tether frames.
///
/// The polynomial is 0x1EDC6F41 (reflected: 0x82F63B78), initial value 0xFFFFFFFF and final
/// XOR 0xFFFFFFFF, as in iSCSI, SCTP and ext4. The check value of the ASCII string
/// `"123456789"` is `0xE3069283`.
///
/// On x86_64 processors with SSE 4.2 it uses the processor's CRC32 instruction (checked once,
/// at run time); elsewhere a table-driven implementation, eight bytes per step
/// ("slicing-by-8"). Both give the same values.
///
/// ```swift
/// var crc = CRC32C()
/// crc.update(headerBytes)
/// crc.update(bodyBytes)
/// let value = crc.value
/// ```
public struct CRC32C: Sendable, Hashable {
    private var state: UInt32 = 0xFFFF_FFFF

    /// Creates a checksum over no bytes.
    public init() {}

    /// The checksum of the bytes seen so far.
    public var value: UInt32 { self.state ^ 0xFFFF_FFFF }

    /// Whether this processor has the CRC-32C instruction Tether uses.
    static let hardwareAvailable = tether_crc32c_hardware_available() != 0

    /// Adds `bytes` to the checksum.
    public mutating func update(_ bytes: UnsafeRawBufferPointer) {
        guard let base = bytes.baseAddress else { return }
        if Self.hardwareAvailable {
            self.state = tether_crc32c_hardware_update(self.state, base, bytes.count)
        } else {
            self.updateWithTable(bytes)
        }
    }

    /// Adds `bytes` to the checksum with the tables, whatever the processor (also for tests
    /// that compare the two implementations).
    mutating func updateWithTable(_ bytes: UnsafeRawBufferPointer) {
        guard var pointer = bytes.baseAddress else { return }
        var remaining = bytes.count
        var crc = self.state
        let table = CRC32C.table

        // Byte-wise until the pointer is 8-byte aligned, then eight bytes per step.
        while remaining > 0 && Int(bitPattern: pointer) & 7 != 0 {
            crc = table[Int((crc ^ UInt32(pointer.load(as: UInt8.self))) & 0xFF)] ^ (crc >> 8)
            pointer += 1
            remaining -= 1
        }
        while remaining >= 8 {
            let word = UInt64(littleEndian: pointer.load(as: UInt64.self))
            let low = UInt32(truncatingIfNeeded: word) ^ crc
            let high = UInt32(truncatingIfNeeded: word >> 32)
            crc =
                table[7 * 256 + Int(low & 0xFF)]
                ^ table[6 * 256 + Int((low >> 8) & 0xFF)]
                ^ table[5 * 256 + Int((low >> 16) & 0xFF)]
                ^ table[4 * 256 + Int(low >> 24)]
                ^ table[3 * 256 + Int(high & 0xFF)]
                ^ table[2 * 256 + Int((high >> 8) & 0xFF)]
                ^ table[1 * 256 + Int((high >> 16) & 0xFF)]
                ^ table[Int(high >> 24)]
            pointer += 8
            remaining -= 8
        }
        while remaining > 0 {
            crc = table[Int((crc ^ UInt32(pointer.load(as: UInt8.self))) & 0xFF)] ^ (crc >> 8)
            pointer += 1
            remaining -= 1
        }
        self.state = crc
    }

    /// Adds the bytes of a collection to the checksum.
    public mutating func update<Bytes: Sequence>(_ bytes: Bytes) where Bytes.Element == UInt8 {
        let handled: Void? = bytes.withContiguousStorageIfAvailable { self.update(UnsafeRawBufferPointer($0)) }
        if handled == nil {
            Array(bytes).withUnsafeBytes { self.update($0) }
        }
    }

    /// The checksum of `bytes`.
    public static func checksum<Bytes: Sequence>(_ bytes: Bytes) -> UInt32 where Bytes.Element == UInt8 {
        var crc = CRC32C()
        crc.update(bytes)
        return crc.value
    }

    /// Eight 256-entry tables for slicing-by-8; table 0 is the classic byte-wise table.
    private static let table: [UInt32] = {
        let polynomial: UInt32 = 0x82F6_3B78
        var table = [UInt32](repeating: 0, count: 8 * 256)
        for byte in 0..<256 {
            var crc = UInt32(byte)
            for _ in 0..<8 {
                crc = (crc & 1) == 1 ? (crc >> 1) ^ polynomial : crc >> 1
            }
            table[byte] = crc
        }
        for slice in 1..<8 {
            for byte in 0..<256 {
                let previous = table[(slice - 1) * 256 + byte]
                table[slice * 256 + byte] = (previous >> 8) ^ table[Int(previous & 0xFF)]
            }
        }
        return table
    }()
}
