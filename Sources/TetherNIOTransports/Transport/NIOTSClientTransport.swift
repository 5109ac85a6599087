#if canImport(Network)
    import Dispatch
    import Foundation
    import NIOConcurrencyHelpers
    public import NIOCore
    import NIOSSL
    import NIOTransportServices
    import Network
    import Security
    public import TetherCore
    public import TetherNIO

    /// The Network.framework transport (swift-nio-transport-services): every endpoint kind over
    /// an `NWConnection`, with TLS by `NWProtocolTLS` (the system's TLS, its trust store and
    /// its networking: Wi-Fi assist, VPNs, path changes, proxies) instead of swift-nio-ssl.
    ///
    /// Use it with a `NIOTSEventLoopGroup`:
    ///
    /// ```swift
    /// let client = try TetherClient(
    ///     configuration: configuration,
    ///     transport: try NIOTSClientTransport(),
    ///     eventLoopGroup: NIOTSEventLoopGroup.singleton
    /// )
    /// ```
    ///
    /// ``ClientTLSConfiguration`` applies as on ``TCPClientTransport``: ALPN `tether/1` (or
    /// `http/1.1` for `wss://`), TLS 1.2 or later, the server name, extra or only trust roots
    /// and pins (checked in the verify block after the system's evaluation), except client
    /// certificates, which this transport does not present yet.
    ///
    /// - Important: Type-checked on Linux against stand-ins of Network.framework, Security and
    ///   NIOTransportServices (`.ci/check-apple-sources`); not built or run on an Apple
    ///   platform by Tether's CI.
    public struct NIOTSClientTransport: ClientTransport {
        /// How `tethers://` and `wss://` connections are secured.
        public let tls: ClientTLSConfiguration
        /// The DER of the extra trust roots (Security's certificates are made per handshake:
        /// they are not `Sendable`).
        private let anchors: [[UInt8]]

        /// - Parameter tls: Trust roots, pins and server name for `tethers://` and `wss://`.
        /// - Throws: ``ConfigurationError`` if a certificate cannot be read, or `tls` asks for a
        ///   client certificate.
        public init(tls: ClientTLSConfiguration = .defaults) throws(ConfigurationError) {
            guard tls.clientCertificate == nil else {
                throw ConfigurationError(
                    "NIOTSClientTransport does not present client certificates yet: use TCPClientTransport for mutual TLS"
                )
            }
            var sources = tls.additionalTrustRoots
            if case .only(let roots) = tls.trustRoots { sources.append(roots) }
            var anchors: [[UInt8]] = []
            for source in sources {
                for certificate in try source.certificates(what: "tls trust roots") {
                    guard let der = try? certificate.toDERBytes(), Self.secCertificate(der) != nil else {
                        throw ConfigurationError("tls trust roots: a certificate of \(source) cannot be read by the Security framework")
                    }
                    anchors.append(der)
                }
            }
            self.tls = tls
            self.anchors = anchors
        }

        public func connect(
            to endpoint: Endpoint,
            timeout: Duration,
            eventLoop: any EventLoop,
            initializer: @escaping @Sendable (any Channel, Framing) throws -> Void
        ) async throws -> any Channel {
            try await HTTPStreamConnector.connect(to: endpoint, timeout: timeout, eventLoop: eventLoop, initializer: initializer) {
                deadline,
                install in
                try await self.open(endpoint, deadline: deadline, eventLoop: eventLoop, install: install)
            }
        }

        /// Opens a connection to `endpoint` (TLS below the pipeline, the WebSocket upgrade in
        /// it); then `install` adds the handlers that use it.
        private func open(
            _ endpoint: Endpoint,
            deadline: NIODeadline,
            eventLoop: any EventLoop,
            install: @escaping @Sendable (any Channel, String?) throws -> Void
        ) async throws -> any Channel {
            guard var bootstrap = NIOTSConnectionBootstrap(validatingGroup: eventLoop) else {
                throw ConfigurationError("NIOTSClientTransport needs a NIOTSEventLoopGroup: pass one as the client's eventLoopGroup")
            }
            let ready = eventLoop.makePromise(of: Void.self)
            bootstrap = bootstrap.connectTimeout(max(deadline - .now(), .milliseconds(1)))
                .channelOption(ChannelOptions.socketOption(.tcp_nodelay), value: 1)
                .channelInitializer { channel in
                    channel.eventLoop.makeCompletedFuture {
                        try TCPClientTransport.configure(
                            channel,
                            endpoint: endpoint,
                            ssl: nil,
                            deadline: deadline,
                            ready: ready,
                            install: install
                        )
                    }
                }
            // The verify block's verdict on the pins, to report a mismatch as such.
            let pinFailure = TetherLock<TransportError?>(nil)
            if endpoint.transport.isSecure {
                bootstrap = bootstrap.tlsOptions(self.tlsOptions(for: endpoint, pinFailure: pinFailure))
            }
            let channel: any Channel
            do {
                channel = try await bootstrap.connect(host: endpoint.host, port: endpoint.port).get()
            } catch {
                ready.fail(error)
                if var mismatch = pinFailure.withLockedValue({ $0 }) {
                    mismatch.cause = "\(error)"
                    throw mismatch
                }
                if case .tls? = error as? NWError {
                    throw TransportError(
                        code: .tlsHandshakeFailed,
                        message: "TLS handshake with \(endpoint) failed: \(error)",
                        cause: error
                    )
                }
                throw error
            }
            return try await TCPClientTransport.whenReady(channel, ready)
        }

        /// Network.framework's TLS options for `endpoint`: ALPN, TLS 1.2+, the server name, and
        /// a verify block for extra roots and pins.
        private func tlsOptions(for endpoint: Endpoint, pinFailure: TetherLock<TransportError?>) -> NWProtocolTLS.Options {
            let options = NWProtocolTLS.Options()
            let security = options.securityProtocolOptions
            sec_protocol_options_add_tls_application_protocol(security, TLSApplicationProtocols.offered(over: endpoint.transport))
            sec_protocol_options_set_min_tls_protocol_version(security, self.tls.minimumVersion == .tlsv13 ? .TLSv13 : .TLSv12)
            if let serverName = self.tls.serverName {
                sec_protocol_options_set_tls_server_name(security, serverName)
            }
            guard !self.anchors.isEmpty || !self.tls.pins.isEmpty else { return options }
            let anchors = self.anchors
            let onlyAnchors: Bool
            if case .only = self.tls.trustRoots { onlyAnchors = true } else { onlyAnchors = false }
            let pins = self.tls.pins
            let queue = DispatchQueue(label: "tether.tls-verify")
            sec_protocol_options_set_verify_block(
                security,
                { _, trustReference, complete in
                    let trust = sec_trust_copy_ref(trustReference).takeRetainedValue()
                    if !anchors.isEmpty {
                        let certificates = anchors.compactMap { Self.secCertificate($0) }
                        _ = SecTrustSetAnchorCertificates(trust, NSArray(array: certificates) as CFArray)
                        _ = SecTrustSetAnchorCertificatesOnly(trust, onlyAnchors)
                    }
                    var error: CFError?
                    guard SecTrustEvaluateWithError(trust, &error) else {
                        complete(false)
                        return
                    }
                    guard !pins.isEmpty else {
                        complete(true)
                        return
                    }
                    let (matches, key) = Self.leaf(of: trust, matches: pins)
                    if !matches {
                        pinFailure.withLockedValue { $0 = .pinMismatch(at: endpoint, presented: key, pins: pins) }
                    }
                    complete(matches)
                },
                queue
            )
            return options
        }

        /// The Security framework's certificate of `der`.
        private static func secCertificate(_ der: [UInt8]) -> SecCertificate? {
            SecCertificateCreateWithData(nil, NSData(bytes: der, length: der.count) as CFData)
        }

        /// Whether the public key of `trust`'s leaf certificate matches one of `pins`, and its pin.
        private static func leaf(of trust: SecTrust, matches pins: [CertificatePin]) -> (Bool, CertificatePin?) {
            guard let leaf = SecTrustGetCertificateAtIndex(trust, 0) else { return (false, nil) }
            let der = Data(referencing: SecCertificateCopyData(leaf) as NSData)
            guard let certificate = try? NIOSSLCertificate(bytes: Array(der), format: .der),
                let pin = try? CertificatePin(of: certificate)
            else { return (false, nil) }
            return (pins.contains(pin), pin)
        }
    }
#endif
