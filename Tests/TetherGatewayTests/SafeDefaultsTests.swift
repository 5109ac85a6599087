import Testing
import TetherGateway

@Suite("Safe defaults: an open gateway stays on loopback unless told otherwise")
struct SafeDefaultsTests {
    static func configuration(tcp: String?, webSocket: String? = nil, insecureOpen: Bool = false) -> GatewayConfiguration {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = tcp.map { GatewayConfiguration.Listen(host: $0, port: 0) }
        configuration.webSocket = webSocket.map { GatewayConfiguration.WebSocket(host: $0, port: 0) }
        configuration.insecureOpen = insecureOpen
        return configuration
    }

    @Test(
        "no authenticator on 0.0.0.0, ::, a host's address or name (TCP or HTTP listener): refused, naming the host and the ways out",
        arguments: [("0.0.0.0", nil), ("::", nil), ("10.1.2.3", nil), ("gateway.example.com", nil), ("127.0.0.1", "0.0.0.0")]
            as [(String, String?)]
    )
    func refused(tcp: String, webSocket: String?) {
        let error = #expect(throws: GatewayError.self) { try Gateway(configuration: Self.configuration(tcp: tcp, webSocket: webSocket)) }
        #expect(error?.code == .invalidConfiguration)
        #expect(error?.message.contains(webSocket ?? tcp) == true, "\(error?.message ?? "")")
        #expect(error?.message.contains("insecureOpen") == true && error?.message.contains("authenticator") == true)
    }

    @Test(
        "loopback only, an authenticator, or insecureOpen: the gateway is made",
        arguments: ["127.0.0.1", "127.0.0.2", "::1", "[::1]", "localhost"]
    )
    func accepted(loopback: String) throws {
        _ = try Gateway(configuration: Self.configuration(tcp: loopback, webSocket: loopback))
        _ = try Gateway(configuration: Self.configuration(tcp: "0.0.0.0", insecureOpen: true))
        _ = try Gateway(configuration: Self.configuration(tcp: "0.0.0.0", webSocket: "::"), authenticate: { _ in })
    }

    @Test("only loopback hosts count as loopback")
    func nonLoopbackHosts() {
        #expect(Self.configuration(tcp: "127.0.0.1", webSocket: "localhost").nonLoopbackHosts.isEmpty)
        #expect(Self.configuration(tcp: "0.0.0.0", webSocket: "::").nonLoopbackHosts == ["0.0.0.0", "::"])
        #expect(Self.configuration(tcp: "127.0.0.256").nonLoopbackHosts == ["127.0.0.256"], "not an address")
        #expect(Self.configuration(tcp: "127.example.com").nonLoopbackHosts == ["127.example.com"])
    }
}
