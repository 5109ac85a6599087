import CLibFuzzer
import NIOCore
import TetherCompression
import TetherCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Inflates COMPRESSED payloads for the inputs of odd length (negotiated compression).
nonisolated(unsafe) let inflater = try! PayloadInflater()

/// Feeds arbitrary bytes to ``FrameDecoder``, as if compression were negotiated for inputs of
/// odd length. It must never crash or allocate according to an unvalidated length (nor inflate
/// past the body limit), and every frame it accepts must survive an encode/decode round trip.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzFrameDecoder(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start else { return 0 }
    var buffer = ByteBuffer(bytes: UnsafeRawBufferPointer(start: start, count: count))
    var decoder = FrameDecoder(maxBodySize: 1 << 16)
    let inflating = count % 2 == 1 ? inflater : nil
    while true {
        let frame: Frame?
        do {
            frame = try decoder.decodeFrame(from: &buffer, inflater: inflating)
        } catch {
            return 0  // rejected: fine, as long as it did not crash
        }
        guard let frame else { return 0 }
        var encoded = ByteBuffer()
        do {
            try FrameEncoder().encode(frame, into: &encoded)
        } catch {
            fatalError("a decoded frame cannot be encoded: \(frame): \(error)")
        }
        var roundTrip = FrameDecoder(maxBodySize: 1 << 16)
        guard let again = try? roundTrip.decodeFrame(from: &encoded), again == frame else {
            fatalError("round trip changed the frame: \(frame)")
        }
    }
}

// SwiftPM links this file's top-level code as the program's entry point; hand over to libFuzzer.
var argc = CommandLine.argc
var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
exit(LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzFrameDecoder(data, size) })
