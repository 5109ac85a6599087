import Foundation
import NIOCore
import Testing

@testable import TetherCore

/// Replays the fuzzer's committed corpus (FuzzTesting/Corpus/FrameDecoder) through the same
/// checks as the fuzz target: no crash, and every accepted frame survives a round trip.
@Suite("Fuzz corpus regressions")
struct FuzzRegressionTests {
    static var corpus: [URL] {
        let directory = URL(fileURLWithPath: #filePath)
            .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            .appendingPathComponent("FuzzTesting/Corpus/FrameDecoder")
        let files = (try? FileManager.default.contentsOfDirectory(at: directory, includingPropertiesForKeys: nil)) ?? []
        return files.sorted { $0.lastPathComponent < $1.lastPathComponent }
    }

    @Test("the corpus is there")
    func corpusExists() {
        #expect(Self.corpus.count >= 11)
    }

    @Test("every corpus input decodes safely, and accepted frames round-trip", arguments: Self.corpus)
    func replay(_ file: URL) throws {
        var buffer = ByteBuffer(bytes: try Data(contentsOf: file))
        var decoder = FrameDecoder(maxBodySize: 1 << 16)
        while let frame = try? decoder.decodeFrame(from: &buffer) {
            var encoded = ByteBuffer()
            try FrameEncoder().encode(frame, into: &encoded)
            var again = FrameDecoder(maxBodySize: 1 << 16)
            #expect(try again.decodeFrame(from: &encoded) == frame, "\(file.lastPathComponent)")
        }
    }
}
