import Foundation
import NIOCore
import NIOPosix
import Testing
import Tether
import TetherTestSupport

@testable import TetherGateway

extension IntegrationTests {
    /// The admin listener's own limits: a connection cap, a timeout on idle connections, and a
    /// token beyond loopback.
    @Suite("The admin listener's limits", .timeLimit(.minutes(2)))
    struct AdminLimitsTests {
        @Test("connections beyond the cap are answered 503 with Retry-After; the others are served")
        func connectionCap() async throws {
            try await withHarness { harness in
                let (gateway, _) = try await harness.gateway(configure: { $0.admin = .init(port: 0, maxConnections: 4) })
                let port = try await gateway.adminAddress.port!
                var held: [HTTPPeer] = []
                for _ in 0..<4 { held.append(try await HTTPPeer.connect(port: port)) }
                defer { for peer in held { peer.close() } }
                try await Task.sleep(for: .milliseconds(100))
                let refused = try await HTTPPeer.connect(port: port)
                let response = try await refused.send(.GET, "/health").wait()
                #expect(response.status == .serviceUnavailable)
                #expect(response.headers["Retry-After"] == ["1"])
                #expect(response.body.contains("maximum of 4 connections"))
                try await eventually("the refused connection is closed") { !refused.isActive }
                #expect(try await held[0].send(.GET, "/health").wait().status == .ok, "those within the cap are served")
                held[1].close()
                try await eventually("a freed place is taken") {
                    guard let peer = try? await HTTPPeer.connect(port: port) else { return false }
                    defer { peer.close() }
                    return (try? await peer.send(.GET, "/health").wait(timeout: .seconds(2)).status) == .ok
                }
            }
        }

        @Test(
            "the admin listener's refusals are counted apart: with the HTTP listener's refusal budget spent, a connection past the admin cap still gets its 503"
        )
        func refusalsApart() async throws {
            try await withHarness { harness in
                let (gateway, _) = try await harness.gateway(configure: { $0.admin = .init(port: 0, maxConnections: 1) })
                let port = try await gateway.adminAddress.port!
                // As while the HTTP listener answers a flood of refused connections.
                gateway.refusing.store(Gateway.maxRefusing, ordering: .relaxed)
                defer { gateway.refusing.store(0, ordering: .relaxed) }
                let held = try await HTTPPeer.connect(port: port)
                defer { held.close() }
                try await Task.sleep(for: .milliseconds(100))
                let refused = try await HTTPPeer.connect(port: port)
                let response = try await refused.send(.GET, "/health").wait(timeout: .seconds(5))
                #expect(response.status == .serviceUnavailable)
                #expect(response.body.contains("maximum of 1 connections"))
                #expect(try await held.send(.GET, "/health").wait().status == .ok)
            }
        }

        @Test("a connection with no complete request within the idle timeout is closed, idle or kept alive")
        func idleTimeout() async throws {
            try await withHarness { harness in
                let (gateway, _) = try await harness.gateway(configure: { $0.admin = .init(port: 0, idleTimeout: .milliseconds(300)) })
                let port = try await gateway.adminAddress.port!
                let idle = try await HTTPPeer.connect(port: port)
                try await eventually("the idle connection is closed", timeout: .seconds(3)) { !idle.isActive }
                let keptAlive = try await HTTPPeer.connect(port: port)
                #expect(try await keptAlive.send(.GET, "/health").wait().status == .ok)
                try await eventually("the kept-alive connection is closed after its request", timeout: .seconds(3)) { !keptAlive.isActive }
                let slow = try await HTTPPeer.connect(port: port)
                _ = try await slow.send(.GET, "/health", end: false)  // a head, and nothing more
                try await eventually("a request that does not end is cut off", timeout: .seconds(3)) { !slow.isActive }
            }
        }

        @Test("with a token: 401 without it or with another, the answer with it")
        func token() async throws {
            try await withHarness { harness in
                let token = "an-admin-token-of-the-tests-own"
                let (gateway, _) = try await harness.gateway(configure: { $0.admin = .init(port: 0, token: token) })
                let port = try await gateway.adminAddress.port!
                for authorization in [nil, "Bearer another-token-of-32-characters", "Basic \(token)"] {
                    let peer = try await HTTPPeer.connect(port: port)
                    defer { peer.close() }
                    let response = try await peer.send(.GET, "/ready", headers: authorization.map { [("Authorization", $0)] } ?? []).wait()
                    #expect(response.status == .unauthorized, "\(authorization ?? "no token")")
                    #expect(response.headers["WWW-Authenticate"] == ["Bearer"])
                    #expect(!response.body.contains("ready\""), "nothing of the gateway's state")
                }
                let peer = try await HTTPPeer.connect(port: port)
                defer { peer.close() }
                let response = try await peer.send(.GET, "/health", headers: [("Authorization", "Bearer \(token)")]).wait()
                #expect(response.status == .ok && response.body.contains("\"memoryBudget\""), "\(response.body)")
            }
        }

        @Test("beyond loopback the admin listener needs a token or insecureOpen: a clear error otherwise, at init and in tether serve")
        func beyondLoopback() async throws {
            var configuration = GatewayConfiguration.defaults
            configuration.listen = .init(port: 0)
            configuration.admin = .init(host: "0.0.0.0", port: 0)
            #expect {
                try Gateway(configuration: configuration)
            } throws: { error in
                (error as? GatewayError)?.code == .invalidConfiguration && "\(error)".contains("admin-token-file")
            }
            configuration.admin = .init(host: "0.0.0.0", port: 0, token: "short")
            #expect(throws: GatewayError.self) { try Gateway(configuration: configuration) }
            configuration.admin = .init(host: "0.0.0.0", port: 0, token: "long-enough-to-be-a-token")
            _ = try Gateway(configuration: configuration)
            configuration.admin = .init(host: "0.0.0.0", port: 0, insecureOpen: true)
            _ = try Gateway(configuration: configuration)

            try await withHarness(timeLimit: .seconds(60)) { harness in
                let refused = try ChildProcess(
                    ["serve", "--port", "0", "--admin-port", "0", "--admin-host", "0.0.0.0", "--store", ":memory:"],
                    in: harness
                )
                #expect(try await refused.exitStatus() != 0)
                let said = refused.lines.joined(separator: "\n")
                #expect(said.contains("--admin-token-file") && said.contains("--admin-insecure-open"), "\(said)")
            }
        }
    }
}
