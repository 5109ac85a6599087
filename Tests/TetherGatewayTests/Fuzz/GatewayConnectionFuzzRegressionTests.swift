import Foundation
import Testing

/// Replays the committed programs of the FuzzGatewayConnection target (its seeds, and any input
/// that once failed) through the same checks: no crash, nothing counted after the close.
@Suite("Gateway connection fuzz corpus")
struct GatewayConnectionFuzzRegressionTests {
    static let directory = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("FuzzTesting/Corpus/GatewayConnection")

    @Test("every committed program runs clean, and the seeds are the ones committed")
    func replay() throws {
        let seeds = try GatewayConnectionProgram.seeds()
        if ProcessInfo.processInfo.environment["TETHER_WRITE_FUZZ_SEEDS"] != nil {
            // After a change to seeds(): TETHER_WRITE_FUZZ_SEEDS=1 swift test --filter FuzzRegression
            for (name, bytes) in seeds { try Data(bytes).write(to: Self.directory.appendingPathComponent("seed-\(name)")) }
        }
        let files = try FileManager.default.contentsOfDirectory(at: Self.directory, includingPropertiesForKeys: nil)
        for (name, bytes) in seeds {
            let committed = files.first { $0.lastPathComponent == "seed-\(name)" }
            #expect(try committed.map { try Data(contentsOf: $0) } == Data(bytes), "seed-\(name) is committed as seeds() makes it")
        }
        let program = GatewayConnectionProgram()
        for file in files.sorted(by: { $0.lastPathComponent < $1.lastPathComponent }) {
            if let failure = program.run(try Data(contentsOf: file)) { Issue.record("\(file.lastPathComponent): \(failure)") }
        }
    }
}
