import Testing
import TetherTestSupport

/// Replays the committed programs of the FuzzHTTPListener target (its seeds, and any input that
/// once failed) through the same checks: no crash, nothing counted once every connection closed.
@Suite("HTTP listener fuzz corpus")
struct HTTPListenerFuzzRegressionTests {
    @Test("every committed program runs clean, and the seeds are the ones committed")
    func replay() throws {
        let program = HTTPListenerProgram()
        try replayFuzzCorpus(of: "HTTPListener", seeds: HTTPListenerProgram.seeds()) { program.run($0) }
    }
}
