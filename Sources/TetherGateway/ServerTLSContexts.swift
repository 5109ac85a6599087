import NIOSSL
import TetherCore

/// The gateway's NIOSSL contexts: one offering ALPN `tether/1` (TCP), one `http/1.1`
/// (WebSocket), one `h2` and `http/1.1` (WebSocket and the HTTP stream).
final class ServerTLSContexts: Sendable {
    let tether: NIOSSLContext
    let http: NIOSSLContext
    let httpAndH2: NIOSSLContext

    init(_ tls: GatewayConfiguration.TLS) throws(ConfigurationError) {
        do {
            self.tether = try NIOSSLContext(configuration: try tls.nioSSLConfiguration(alpn: ["tether/1"]))
            self.http = try NIOSSLContext(configuration: try tls.nioSSLConfiguration(alpn: ["http/1.1"]))
            self.httpAndH2 = try NIOSSLContext(configuration: try tls.nioSSLConfiguration(alpn: ["h2", "http/1.1"]))
        } catch let error as ConfigurationError {
            throw error
        } catch {
            throw ConfigurationError("tls: cannot set up TLS with this certificate and key: \(error)")
        }
    }
}
