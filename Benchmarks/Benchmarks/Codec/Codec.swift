import Benchmark
import NIOCore
import TetherCore

// The wire codec on its own: encoding and decoding REQUEST frames as the client and the
// gateway do for every request. Times are per frame (scalingFactor .kilo: one iteration is
// 1,000 frames). Neither direction allocates: the decoded body is a slice of the read buffer.
// The malloc threshold holds that at zero: after `swift package benchmark baseline update`,
// a change that adds an allocation fails `swift package benchmark baseline check`.

let request32 = Frame(
    .request(.init(id: 42, method: "echo", timeout: .seconds(30), body: ByteBuffer(repeating: 0x78, count: 32))),
    flags: .checksum
)
let request4k = Frame(
    .request(.init(id: 42, method: "echo", timeout: .seconds(30), body: ByteBuffer(repeating: 0x78, count: 4096))),
    flags: .checksum
)

func encoded(_ frame: Frame, times: Int) -> ByteBuffer {
    var buffer = ByteBuffer()
    for _ in 0..<times { try! FrameEncoder().encode(frame, into: &buffer) }
    return buffer
}

let benchmarks: @Sendable () -> Void = {
    let configuration = Benchmark.Configuration(
        metrics: [.wallClock, .throughput, .mallocCountTotal],
        scalingFactor: .kilo,
        maxDuration: .seconds(3),
        thresholds: [.mallocCountTotal: .init(absolute: [.p90: 0])]
    )

    for (name, frame) in [("32 B", request32), ("4 KiB", request4k)] {
        Benchmark("Encode REQUEST \(name) with CRC-32C", configuration: configuration) { benchmark in
            var buffer = ByteBuffer()
            buffer.reserveCapacity(8192)
            for _ in benchmark.scaledIterations {
                buffer.clear()
                try FrameEncoder().encode(frame, into: &buffer)
                blackHole(buffer.readableBytes)
            }
        }

        // Frames as one socket read delivers them: many at once, decoded one after another.
        let stream = encoded(frame, times: 1000)
        Benchmark("Decode REQUEST \(name) with CRC-32C, 1,000 per read", configuration: configuration) { benchmark in
            for _ in benchmark.scaledIterations.striding(by: 1000) {
                var input = stream
                var decoder = FrameDecoder(maxBodySize: 1 << 20)
                while let frame = try decoder.decodeFrame(from: &input) { blackHole(frame) }
            }
        }
    }
}

extension Range where Bound == Int {
    /// Steps through the range `step` at a time (the decode benchmark handles 1,000 frames per step).
    func striding(by step: Int) -> StrideTo<Int> { Swift.stride(from: self.lowerBound, to: self.upperBound, by: step) }
}
