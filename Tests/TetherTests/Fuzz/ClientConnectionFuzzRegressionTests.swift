import Testing
import TetherTestSupport

/// Replays the committed programs of the FuzzClientConnection target (its seeds, and any input
/// that once failed) through the same checks: no crash, every request settled after the close.
@Suite("Client connection fuzz corpus")
struct ClientConnectionFuzzRegressionTests {
    @Test("every committed program runs clean, and the seeds are the ones committed")
    func replay() throws {
        let program = ClientConnectionProgram()
        try replayFuzzCorpus(of: "ClientConnection", seeds: try ClientConnectionProgram.seeds()) { program.run($0) }
    }
}
