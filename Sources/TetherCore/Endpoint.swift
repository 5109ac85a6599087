/// A place a client can connect to: a transport, a host name or IP address, a port and, for
/// WebSocket and the HTTP stream, a path.
///
/// Written as a URL: `tether://host:port` (TCP), `tethers://host:port` (TLS),
/// `ws://host:port/path` and `wss://host:port/path` (WebSocket, without and with TLS),
/// `http://host:port/path` and `https://host:port/path` (the HTTP stream, for networks that
/// pass nothing but HTTP requests). A bare `host:port` is TCP. An endpoint list may mix
/// transports, best first.
///
/// ```swift
/// let primary = try Endpoint(parsing: "wss://gw1.example.com/tether")
/// let fallback = try Endpoint(parsing: "https://gw1.example.com/tether/stream")
/// let backup = try Endpoint(parsing: "tethers://[2001:db8::1]:7700")
/// let plain = Endpoint(host: "127.0.0.1", port: 7700)
/// ```
public struct Endpoint: Hashable, Sendable, CustomStringConvertible {
    /// How a client reaches an endpoint: PROTOCOL.md, section "Transport bindings".
    public enum Transport: String, Hashable, Sendable, CaseIterable, CustomStringConvertible {
        /// Tether frames on a TCP connection: `tether://`.
        case tcp = "tether"
        /// Tether frames on TLS over TCP, ALPN `tether/1`: `tethers://`.
        case tls = "tethers"
        /// One Tether frame per binary WebSocket message, subprotocol `tether.v1`: `ws://`.
        case webSocket = "ws"
        /// WebSocket over TLS: `wss://`.
        case secureWebSocket = "wss"
        /// Tether frames down one long streaming HTTP response and up in POST bodies: `http://`.
        case httpStream = "http"
        /// The HTTP stream over TLS: `https://`.
        case secureHTTPStream = "https"

        /// The URL scheme: `tether`, `tethers`, `ws`, `wss`, `http` or `https`.
        public var scheme: String { self.rawValue }
        /// Whether the connection is encrypted and the server authenticated (TLS).
        public var isSecure: Bool { self == .tls || self == .secureWebSocket || self == .secureHTTPStream }
        /// Whether the connection is a WebSocket.
        public var isWebSocket: Bool { self == .webSocket || self == .secureWebSocket }
        /// Whether the connection is the HTTP stream (PROTOCOL.md, section 11.5).
        public var isHTTPStream: Bool { self == .httpStream || self == .secureHTTPStream }
        /// Whether the transport speaks HTTP first, on the gateway's HTTP listener (WebSocket
        /// and the HTTP stream), rather than Tether frames from the first byte.
        public var isHTTP: Bool { self.isWebSocket || self.isHTTPStream }
        /// The path used when an endpoint URL gives none: `/tether` for WebSocket,
        /// `/tether/stream` for the HTTP stream; `nil` for TCP and TLS.
        public var defaultPath: String? {
            switch self {
            case .tcp, .tls: nil
            case .webSocket, .secureWebSocket: Endpoint.defaultWebSocketPath
            case .httpStream, .secureHTTPStream: Endpoint.defaultHTTPStreamPath
            }
        }
        /// How the transport delivers frames: one per message over WebSocket, a byte stream otherwise.
        public var framing: Framing { self.isWebSocket ? .messages : .byteStream }
        public var description: String { self.rawValue }
    }

    /// The path a gateway accepts WebSocket upgrades on unless configured otherwise.
    public static let defaultWebSocketPath = "/tether"
    /// The path a gateway serves the HTTP stream on unless configured otherwise.
    public static let defaultHTTPStreamPath = "/tether/stream"

    /// The host name or IP address.
    public var host: String
    /// The TCP port.
    public var port: Int
    /// The transport: TCP, TLS, WebSocket or the HTTP stream, the last two with or without TLS.
    public var transport: Transport
    /// The HTTP path of a WebSocket endpoint (`/tether` by default) or an HTTP stream
    /// (`/tether/stream`); `nil` for TCP and TLS.
    public var path: String?

    /// Creates an endpoint.
    /// - Parameters:
    ///   - host: A host name or an IP address (IPv6 without brackets).
    ///   - port: A TCP port, 0–65535.
    ///   - transport: How to reach it; TCP by default.
    ///   - path: For WebSocket and the HTTP stream, the HTTP path (``Transport/defaultPath``
    ///     if `nil`); ignored for TCP and TLS.
    public init(host: String, port: Int, transport: Transport = .tcp, path: String? = nil) {
        self.host = host
        self.port = port
        self.transport = transport
        self.path = transport.isHTTP ? (path ?? transport.defaultPath) : nil
    }

    /// Parses an endpoint URL, `tether://host:port`, `tethers://host:port`,
    /// `ws[s]://host[:port][/path]` or `http[s]://host[:port][/path]`, or a bare `host:port` (TCP).
    ///
    /// IPv6 addresses are written in brackets: `tethers://[::1]:7700`. A WebSocket or HTTP
    /// stream URL without a port uses 80 (`ws`, `http`) or 443 (`wss`, `https`), and without a
    /// path ``defaultWebSocketPath`` or ``defaultHTTPStreamPath``.
    ///
    /// ```swift
    /// let endpoint = try Endpoint(parsing: "wss://gw.example.com:7443/tether")
    /// ```
    /// - Throws: ``EndpointParseError`` if the text is not of that form, the port is out of
    ///   range, or the scheme is not one of the six.
    public init(parsing text: String) throws(EndpointParseError) {
        guard let schemeEnd = text.firstRange(of: "://") else {
            try self.init(authority: Substring(text), transport: .tcp, path: nil, text: text)
            return
        }
        let scheme = text[..<schemeEnd.lowerBound].lowercased()
        guard let transport = Transport(rawValue: scheme) else {
            throw EndpointParseError(
                text: text,
                reason:
                    "the scheme '\(scheme)' is not one Tether speaks: use tether:// (TCP), tethers:// (TLS), ws:// or wss:// (WebSocket), http:// or https:// (HTTP stream)"
            )
        }
        let rest = text[schemeEnd.upperBound...]
        guard !rest.contains("?"), !rest.contains("#") else {
            throw EndpointParseError(text: text, reason: "an endpoint URL has no query or fragment")
        }
        let slash = rest.firstIndex(of: "/")
        let authority = rest[..<(slash ?? rest.endIndex)]
        var path = slash.map { String(rest[$0...]) }
        if transport.isHTTP {
            if path == nil || path == "/" { path = nil }
        } else if let given = path, given != "/" {
            throw EndpointParseError(text: text, reason: "a \(scheme):// endpoint has no path (got '\(given)')")
        }
        var defaultPort: Int?
        switch transport {
        case .webSocket, .httpStream: defaultPort = 80
        case .secureWebSocket, .secureHTTPStream: defaultPort = 443
        case .tcp, .tls: defaultPort = nil
        }
        if let defaultPort, !authority.hasSuffix("]"), !authority.contains(":") {
            try self.init(authority: Substring("\(authority):\(defaultPort)"), transport: transport, path: path, text: text)
        } else if let defaultPort, authority.hasPrefix("["), authority.hasSuffix("]") {
            try self.init(authority: Substring("\(authority):\(defaultPort)"), transport: transport, path: path, text: text)
        } else {
            try self.init(authority: authority, transport: transport, path: path, text: text)
        }
    }

    private init(authority text: Substring, transport: Transport, path: String?, text original: String) throws(EndpointParseError) {
        let host: Substring
        let portText: Substring
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]"), text[text.index(after: close)...].hasPrefix(":") else {
                throw EndpointParseError(text: original, reason: "expected [address]:port")
            }
            host = text[text.index(after: text.startIndex)..<close]
            portText = text[text.index(close, offsetBy: 2)...]
        } else {
            guard let colon = text.lastIndex(of: ":"), !text[..<colon].contains(":") else {
                throw EndpointParseError(text: original, reason: "expected host:port (write IPv6 addresses as [address]:port)")
            }
            host = text[..<colon]
            portText = text[text.index(after: colon)...]
        }
        guard !host.isEmpty else {
            throw EndpointParseError(text: original, reason: "the host is empty")
        }
        guard let port = Int(portText), (0...65535).contains(port) else {
            throw EndpointParseError(text: original, reason: "the port must be a number from 0 to 65535")
        }
        self.init(host: String(host), port: port, transport: transport, path: path)
    }

    /// Whether the host and port can be connected to at all (non-empty host, port 1–65535, a
    /// WebSocket or HTTP stream path that starts with `/`).
    public var isValid: Bool {
        !self.host.isEmpty && (1...65535).contains(self.port) && (self.path.map { $0.hasPrefix("/") } ?? !self.transport.isHTTP)
    }

    /// The host as a URL writes it: an IPv6 address in brackets (`[::1]`), anything else as is.
    package var uriHost: String { self.host.contains(":") ? "[\(self.host)]" : self.host }

    /// `host:port`, the host as ``uriHost`` writes it: a URL's authority and HTTP's `Host`.
    package var authority: String { "\(self.uriHost):\(self.port)" }

    /// `host:port` for TCP (`[address]:port` for IPv6), the URL for the other transports:
    /// `tethers://host:port`, `wss://host:port/path`. ``init(parsing:)`` reads it back.
    public var description: String {
        let authority = self.authority
        switch self.transport {
        case .tcp: return authority
        case .tls: return "tethers://\(authority)"
        case .webSocket, .secureWebSocket, .httpStream, .secureHTTPStream:
            return "\(self.transport.scheme)://\(authority)\(self.path ?? self.transport.defaultPath ?? "")"
        }
    }
}

/// Text that is not a valid endpoint (`host:port` or an endpoint URL).
public struct EndpointParseError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The text that failed to parse.
    public var text: String
    /// Why it failed.
    public var reason: String

    public var description: String { "invalid endpoint '\(self.text)': \(self.reason)" }
}
