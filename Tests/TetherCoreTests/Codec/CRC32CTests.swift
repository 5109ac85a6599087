import Testing

@testable import TetherCore

@Suite("CRC-32C")
struct CRC32CTests {
    @Test("check value of \"123456789\" is 0xE3069283")
    func checkValue() {
        #expect(CRC32C.checksum(Array("123456789".utf8)) == 0xE306_9283)
        #expect(CRC32C.checksum([UInt8]()) == 0)
        // RFC 3720, B.4: 32 bytes of zeros.
        #expect(CRC32C.checksum([UInt8](repeating: 0, count: 32)) == 0x8A91_36AA)
        #expect(CRC32C.checksum([UInt8](repeating: 0xFF, count: 32)) == 0x62A8_AB43)
    }

    @Test("the processor's instruction, where used, gives the table's values at every length and alignment")
    func hardwareMatchesTable() {
        var generator = SplitMix64(seed: 11)
        let bytes = (0..<30000).map { _ in UInt8.random(in: 0...255, using: &generator) }
        bytes.withUnsafeBytes { all in
            for offset in 0..<9 {
                // Around the three-block lengths of the hardware path (3 x 256, 3 x 2048) too.
                let counts =
                    [0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 100, 767, 768, 769, 775, 776, 1000, 1536, 4096]
                    + [6143, 6144, 6145, 6151, 6912, 12288, 20000, 29991 - offset]
                for count in counts {
                    let slice = UnsafeRawBufferPointer(rebasing: all[offset..<(offset + count)])
                    var used = CRC32C()
                    used.update(slice)
                    var table = CRC32C()
                    table.updateWithTable(slice)
                    #expect(used.value == table.value, "offset \(offset), \(count) bytes")
                }
            }
        }
        // The table alone still gives the known check values.
        var check = CRC32C()
        Array("123456789".utf8).withUnsafeBytes { check.updateWithTable($0) }
        #expect(check.value == 0xE306_9283)
    }

    @Test("incremental updates at any split and alignment equal one pass")
    func incremental() {
        var generator = SplitMix64(seed: 7)
        let bytes = (0..<1000).map { _ in UInt8.random(in: 0...255, using: &generator) }
        let whole = CRC32C.checksum(bytes)
        for split in [0, 1, 3, 7, 8, 9, 500, 999, 1000] {
            var crc = CRC32C()
            crc.update(bytes[..<split])
            crc.update(bytes[split...])
            #expect(crc.value == whole, "split at \(split)")
        }
        for offset in 1..<8 {
            var reference = CRC32C()
            for byte in bytes[offset...] { reference.update([byte]) }
            #expect(CRC32C.checksum(bytes[offset...]) == reference.value, "offset \(offset)")
        }
    }
}
