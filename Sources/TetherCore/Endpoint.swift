/// A place a client can connect to: a host name or IP address and a port.
///
/// ```swift
/// let primary = Endpoint(host: "gw1.example.com", port: 7700)
/// let backup = try Endpoint(parsing: "[2001:db8::1]:7700")
/// ```
public struct Endpoint: Hashable, Sendable, CustomStringConvertible {
    /// The host name or IP address.
    public var host: String
    /// The TCP port.
    public var port: Int

    /// Creates an endpoint.
    /// - Parameters:
    ///   - host: A host name or an IP address (IPv6 without brackets).
    ///   - port: A TCP port, 0–65535.
    public init(host: String, port: Int) {
        self.host = host
        self.port = port
    }

    /// Parses `host:port`, `[ipv6]:port`, or the same as a URL: `tether://host:port`.
    ///
    /// ```swift
    /// let endpoint = try Endpoint(parsing: "tether://gw.example.com:7700")
    /// ```
    /// - Throws: ``EndpointParseError`` if the text is not of that form, the port is out of
    ///   range, or the URL's scheme is not `tether`.
    public init(parsing text: String) throws(EndpointParseError) {
        var authority = Substring(text)
        if let schemeEnd = text.firstRange(of: "://") {
            let scheme = text[..<schemeEnd.lowerBound].lowercased()
            guard scheme == "tether" else {
                throw EndpointParseError(
                    text: text,
                    reason: "the scheme '\(scheme)' is not one this version speaks: use tether://host:port (plain TCP)"
                )
            }
            authority = text[schemeEnd.upperBound...]
            if authority.hasSuffix("/") { authority = authority.dropLast() }
            guard !authority.contains("/") else {
                throw EndpointParseError(text: text, reason: "a tether:// endpoint has no path")
            }
        }
        try self.init(authority: authority, text: text)
    }

    private init(authority text: Substring, text original: String) throws(EndpointParseError) {
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
        self.init(host: String(host), port: port)
    }

    /// Whether the host and port can be connected to at all (non-empty host, port 1–65535).
    public var isValid: Bool { !self.host.isEmpty && (1...65535).contains(self.port) }

    public var description: String {
        self.host.contains(":") ? "[\(self.host)]:\(self.port)" : "\(self.host):\(self.port)"
    }
}

/// Text that is not a valid `host:port` endpoint.
public struct EndpointParseError: Error, Hashable, Sendable, CustomStringConvertible {
    /// The text that failed to parse.
    public var text: String
    /// Why it failed.
    public var reason: String

    public var description: String { "invalid endpoint '\(self.text)': \(self.reason)" }
}

extension Duration {
    /// The duration in seconds, with its fraction: `.milliseconds(1500).totalSeconds == 1.5`.
    public var totalSeconds: Double {
        let (seconds, attoseconds) = self.components
        return Double(seconds) + Double(attoseconds) / 1e18
    }

    /// A short human-readable form: `850 µs`, `12.3 ms`, `2.50 s`, `3 min 20 s`.
    public var shortDescription: String {
        let total = self.totalSeconds
        let magnitude = abs(total)
        func rounded(_ value: Double, _ digits: Int) -> String {
            var factor = 1.0
            for _ in 0..<digits { factor *= 10 }
            let scaled = (value * factor).rounded() / factor
            var text = "\(scaled)"
            if digits == 0, text.hasSuffix(".0") { text.removeLast(2) }
            return text
        }
        if magnitude < 0.001 { return "\(rounded(total * 1e6, 0)) µs" }
        if magnitude < 1 { return "\(rounded(total * 1e3, 1)) ms" }
        if magnitude < 120 { return "\(rounded(total, 2)) s" }
        return "\(Int(total) / 60) min \(Int(total) % 60) s"
    }
}
