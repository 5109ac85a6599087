import Testing
import TetherCore
import TetherNIO
import TetherNIOTransports

@Suite("HTTP proxy settings")
struct HTTPProxyTests {
    @Test("proxy URLs: credentials, the default port, a bare host:port; other schemes, no host and bad ports are refused")
    func urls() throws {
        let full = try HTTPProxy(url: "http://alice:s%40cret@proxy.corp:3128")
        #expect(full.host == "proxy.corp" && full.port == 3128)
        #expect(full.credentials == .init(username: "alice", password: "s@cret"))
        #expect(full.description == "proxy.corp:3128", "no credentials in descriptions")
        #expect(try HTTPProxy(url: "http://proxy.corp").port == 80)
        #expect(try HTTPProxy(url: "10.0.0.1:8080") == HTTPProxy(host: "10.0.0.1", port: 8080))
        #expect(try HTTPProxy(url: "http://[::1]:3128").host == "::1")
        for bad in ["https://proxy.corp:443", "socks5://proxy:1080", "http://:3128", "http://proxy:0", "http://proxy:70000"] {
            #expect(throws: ConfigurationError.self, "\(bad)") { try HTTPProxy(url: bad) }
        }
        #expect(throws: ConfigurationError.self) { try HTTPProxy(host: "", port: 3128) }
    }

    @Test(
        "from the environment: https_proxy for secure transports, http_proxy for plain ones, all_proxy for both; HTTP_PROXY in capitals is ignored"
    )
    func environment() throws {
        let secure = Endpoint(host: "gw.example", port: 443, transport: .secureWebSocket, path: "/tether")
        let plain = Endpoint(host: "gw.example", port: 7700, transport: .tcp)
        let environment = ["https_proxy": "http://secure-proxy:3128", "http_proxy": "http://plain-proxy:3128"]
        #expect(try ProxySetting.environment.proxy(for: secure, environment: environment)?.host == "secure-proxy")
        #expect(try ProxySetting.environment.proxy(for: plain, environment: environment)?.host == "plain-proxy")
        #expect(try ProxySetting.environment.proxy(for: secure, environment: ["HTTPS_PROXY": "http://capital:1"])?.host == "capital")
        #expect(try ProxySetting.environment.proxy(for: plain, environment: ["HTTP_PROXY": "http://ignored:1"]) == nil)
        #expect(try ProxySetting.environment.proxy(for: plain, environment: ["ALL_PROXY": "http://all:1"])?.host == "all")
        #expect(try ProxySetting.environment.proxy(for: plain, environment: ["http_proxy": ""]) == nil, "empty means unset")
        #expect(try ProxySetting.environment.proxy(for: plain, environment: [:]) == nil)
        #expect(try ProxySetting.none.proxy(for: plain, environment: environment) == nil)
        let error = #expect(throws: ConfigurationError.self) {
            try ProxySetting.environment.proxy(for: secure, environment: ["https_proxy": "https://tls-proxy:443"])
        }
        #expect(error?.message.hasPrefix("https_proxy:") == true, "the message names the variable")
    }

    @Test("no_proxy: *, a host and its subdomains (with or without a leading dot), IP addresses, host:port")
    func exclusions() throws {
        func proxied(_ host: String, port: Int = 7700, noProxy: String) throws -> Bool {
            let endpoint = Endpoint(host: host, port: port, transport: .tcp)
            return try ProxySetting.environment.proxy(for: endpoint, environment: ["http_proxy": "proxy:3128", "no_proxy": noProxy]) != nil
        }
        #expect(try !proxied("gw.example", noProxy: "*"))
        #expect(try !proxied("gw.example", noProxy: "localhost, example"))
        #expect(try !proxied("gw.example", noProxy: ".example"))
        #expect(try !proxied("GW.Example", noProxy: "gw.example"))
        #expect(try proxied("gw.example.org", noProxy: "example"))
        #expect(try proxied("notexample", noProxy: "example"), "a suffix counts only at a dot")
        #expect(try !proxied("127.0.0.1", noProxy: "localhost,127.0.0.1"))
        #expect(try !proxied("::1", noProxy: "[::1]"))
        #expect(try !proxied("gw.example", port: 7700, noProxy: "gw.example:7700"))
        #expect(try proxied("gw.example", port: 443, noProxy: "gw.example:7700"))
        #expect(try proxied("gw.example", noProxy: "other"))
    }
}
