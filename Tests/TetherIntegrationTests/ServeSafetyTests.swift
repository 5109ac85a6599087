import Testing
import TetherTestSupport

extension IntegrationTests {
    @Suite("tether serve's safe defaults", .timeLimit(.minutes(2)))
    struct ServeSafetyTests {
        @Test("tether serve --host 0.0.0.0 without --jwt-key exits with a clear error; with --insecure-open it starts, and warns")
        func openBeyondLoopback() async throws {
            try await withHarness(timeLimit: .seconds(60)) { harness in
                let refused = try ChildProcess(
                    ["serve", "--host", "0.0.0.0", "--port", "0", "--store", temporaryFile("refused-gateway", in: harness)],
                    in: harness
                )
                #expect(try await refused.exitStatus() != 0)
                let said = refused.lines.joined(separator: "\n")
                #expect(said.contains("0.0.0.0") && said.contains("--jwt-key") && said.contains("--insecure-open"), "\(said)")
                #expect(!said.contains("listening"), "it refused before listening")

                let open = try ChildProcess(
                    [
                        "serve", "--host", "0.0.0.0", "--port", "\(try await freePort())", "--insecure-open",
                        "--store", temporaryFile("open-gateway", in: harness),
                    ],
                    in: harness
                )
                try await eventually("the open gateway listens", timeout: .seconds(30)) { open.lines.contains { $0.contains("listening") } }
                #expect(open.lines.contains { $0.contains("insecure") }, "a warning at start: \(open.lines)")
            }
        }
    }
}
