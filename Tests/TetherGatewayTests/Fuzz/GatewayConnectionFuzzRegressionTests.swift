import Testing
import TetherTestSupport

/// Replays the committed programs of the FuzzGatewayConnection target (its seeds, and any input
/// that once failed) through the same checks: no crash, nothing counted after the close.
@Suite("Gateway connection fuzz corpus")
struct GatewayConnectionFuzzRegressionTests {
    @Test("every committed program runs clean, and the seeds are the ones committed")
    func replay() throws {
        let program = GatewayConnectionProgram()
        try replayFuzzCorpus(of: "GatewayConnection", seeds: try GatewayConnectionProgram.seeds()) { program.run($0) }
    }
}
