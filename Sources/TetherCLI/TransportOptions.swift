import ArgumentParser
import TetherCore
import TetherGateway

/// How `tether serve` listens: TLS and WebSocket.
struct TransportOptions: ParsableArguments {
    @Option(
        name: .customLong("tls-cert"),
        help: ArgumentHelp(
            "A PEM certificate chain (the gateway's first): every listener speaks TLS (tethers://, wss://). Needs --tls-key.",
            valueName: "file"
        )
    )
    var certificateFile: String?

    @Option(name: .customLong("tls-key"), help: ArgumentHelp("The private key of --tls-cert (PEM).", valueName: "file"))
    var keyFile: String?

    @Option(
        name: .customLong("tls-client-ca"),
        help: ArgumentHelp("Require client certificates signed by these authorities (PEM): mutual TLS.", valueName: "file")
    )
    var clientCAFile: String?

    @Option(
        name: .customLong("ws-port"),
        help:
            "Also accept WebSocket connections on this port (ws://, or wss:// with --tls-cert), and the HTTP stream (http://, https://) on /tether/stream."
    )
    var webSocketPort: Int?

    @Option(name: .customLong("ws-host"), help: "The address of the WebSocket listener (default: --host).")
    var webSocketHost: String?

    @Option(name: .customLong("ws-path"), help: "The path WebSocket upgrades are accepted on.")
    var webSocketPath = Endpoint.defaultWebSocketPath

    @Option(
        name: .customLong("ws-origin"),
        help: ArgumentHelp(
            "An Origin allowed to open a WebSocket (browsers send one); repeat it. Without it any origin is accepted.",
            valueName: "origin"
        )
    )
    var webSocketOrigins: [String] = []

    @Flag(inversion: .prefixedNo, help: "Listen for Tether over TCP (or TLS) on --host and --port.")
    var tcp = true

    @Flag(inversion: .prefixedNo, help: "Serve the HTTP stream on the --ws-port listener.")
    var httpStream = true

    /// Sets the listeners of `configuration` (whose `listen` holds --host, --port).
    func apply(to configuration: inout GatewayConfiguration) throws {
        switch (self.certificateFile, self.keyFile) {
        case (let certificate?, let key?):
            configuration.tls = .init(certificateChain: .file(certificate), privateKey: .file(key))
            if let clientCAFile { configuration.tls?.clientCertificates = .required(trustRoots: .file(clientCAFile)) }
        case (nil, nil):
            if self.clientCAFile != nil { throw ValidationError("--tls-client-ca needs --tls-cert and --tls-key") }
        default:
            throw ValidationError("--tls-cert and --tls-key go together")
        }
        let secure = configuration.tls != nil
        configuration.listen?.tls = secure
        if !self.tcp { configuration.listen = nil }
        if let port = self.webSocketPort {
            configuration.webSocket = .init(
                host: self.webSocketHost ?? configuration.listen?.host ?? "127.0.0.1",
                port: port,
                path: self.webSocketPath,
                tls: secure,
                allowedOrigins: self.webSocketOrigins.isEmpty ? nil : Set(self.webSocketOrigins),
                stream: self.httpStream ? .defaults : nil
            )
        } else if self.webSocketHost != nil || !self.webSocketOrigins.isEmpty || self.webSocketPath != Endpoint.defaultWebSocketPath {
            throw ValidationError("--ws-host, --ws-path and --ws-origin need --ws-port")
        }
        if configuration.listen == nil && configuration.webSocket == nil {
            throw ValidationError("--no-tcp without --ws-port leaves nothing to listen on")
        }
    }
}
