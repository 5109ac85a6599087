import Foundation
public import TetherCore
import TetherNIO

/// An HTTP proxy that a client's connections go through with `CONNECT` (RFC 9110, 9.3.6), as
/// in networks that let nothing out but through a proxy: every transport (`tether://`,
/// `tethers://`, `ws://`, `wss://`) is tunnelled, and TLS runs end to end through the tunnel.
///
/// ```swift
/// let proxy = try HTTPProxy(url: "http://alice:secret@proxy.corp:3128")
/// let transport = try TCPClientTransport(proxy: .always(proxy))
/// // Or as curl does, from https_proxy / all_proxy / no_proxy:
/// let fromEnvironment = try TCPClientTransport(proxy: .environment)
/// ```
public struct HTTPProxy: Sendable, Hashable, CustomStringConvertible {
    /// The proxy's host name or IP address.
    public var host: String
    /// The proxy's port.
    public var port: Int
    /// Sent as `Proxy-Authorization: Basic …` with the `CONNECT`; `nil` sends none.
    public var credentials: Credentials?

    /// A user name and password for the proxy (Basic authentication).
    public struct Credentials: Sendable, Hashable {
        public var username: String
        public var password: String

        public init(username: String, password: String) {
            self.username = username
            self.password = password
        }
    }

    /// - Throws: ``ConfigurationError`` if `host` is empty or `port` is not 1–65535.
    public init(host: String, port: Int, credentials: Credentials? = nil) throws(ConfigurationError) {
        guard !host.isEmpty else { throw ConfigurationError("the proxy's host is empty") }
        guard (1...65_535).contains(port) else { throw ConfigurationError("the proxy's port must be 1–65535, got \(port)") }
        self.host = host
        self.port = port
        self.credentials = credentials
    }

    /// A proxy written as a URL, as in `https_proxy`: `http://[user:password@]host[:port]`
    /// (port 80 if none; a bare `host:port` is taken as `http://host:port`).
    /// - Throws: ``ConfigurationError`` for another scheme (an `https://` proxy, spoken to over
    ///   TLS, is not supported), a missing host or a bad port.
    public init(url: String) throws(ConfigurationError) {
        let text = url.contains("://") ? url : "http://" + url
        guard let components = URLComponents(string: text), let scheme = components.scheme?.lowercased() else {
            throw ConfigurationError("the proxy '\(url)' is not a URL")
        }
        guard scheme == "http" else {
            throw ConfigurationError("the proxy '\(url)' must be an http:// URL (the CONNECT tunnel carries TLS itself)")
        }
        guard let host = components.host.map(withoutBrackets), !host.isEmpty else {
            throw ConfigurationError("the proxy '\(url)' has no host")
        }
        var credentials: Credentials?
        if let user = components.user {
            credentials = Credentials(
                username: user.removingPercentEncoding ?? user,
                password: components.password?.removingPercentEncoding ?? ""
            )
        }
        try self.init(host: host, port: components.port ?? 80, credentials: credentials)
    }

    /// `host:port`, without the credentials.
    public var description: String { "\(self.host):\(self.port)" }

    /// The `Proxy-Authorization` header's value, if there are credentials.
    var authorization: String? {
        guard let credentials else { return nil }
        return "Basic " + Data("\(credentials.username):\(credentials.password)".utf8).base64EncodedString()
    }
}

/// Which proxy, if any, a client transport's connections go through.
public enum ProxySetting: Sendable, Hashable {
    /// Straight to the gateway.
    case none
    /// Through this proxy, whatever the endpoint.
    case always(HTTPProxy)
    /// As curl and most command-line tools do, from the environment at each connection:
    /// `https_proxy` (or `HTTPS_PROXY`) for `tethers://` and `wss://`, `http_proxy` for
    /// `tether://` and `ws://`, and `all_proxy` (or `ALL_PROXY`) for both when those are unset;
    /// no proxy for a host that `no_proxy` (or `NO_PROXY`) names. (`HTTP_PROXY` in capitals is
    /// ignored, as curl does: a CGI program's environment can be set by a request's headers.)
    case environment

    /// The proxy for a connection to `endpoint`, or `nil` to connect directly.
    /// - Parameter environment: The environment variables; the process's if `nil`.
    /// - Throws: ``ConfigurationError`` if the variable that applies is not a proxy URL.
    public func proxy(for endpoint: Endpoint, environment: [String: String]? = nil) throws(ConfigurationError) -> HTTPProxy? {
        switch self {
        case .none:
            return nil
        case .always(let proxy):
            return proxy
        case .environment:
            let environment = environment ?? ProcessInfo.processInfo.environment
            let names =
                endpoint.transport.isSecure
                ? ["https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"] : ["http_proxy", "all_proxy", "ALL_PROXY"]
            guard
                let (name, value) = names.lazy.compactMap({ name in environment[name].map { (name, $0) } }).first(where: { !$0.1.isEmpty })
            else { return nil }
            let exclusions = environment["no_proxy"] ?? environment["NO_PROXY"] ?? ""
            if Self.excludes(exclusions, host: endpoint.host, port: endpoint.port) { return nil }
            do {
                return try HTTPProxy(url: value)
            } catch {
                throw ConfigurationError("\(name): \(error.message)")
            }
        }
    }

    /// Whether a `no_proxy` list (comma- or space-separated: `*`, host names that match
    /// themselves and their subdomains, with or without a leading dot, IP addresses, each
    /// optionally with `:port`) names `host`.
    static func excludes(_ list: String, host: String, port: Int) -> Bool {
        let host = withoutBrackets(host.lowercased())
        for rawEntry in list.split(whereSeparator: { $0 == "," || $0 == " " }) {
            var entry = rawEntry.trimmingCharacters(in: .whitespaces).lowercased()
            if entry == "*" { return true }
            if let colon = entry.lastIndex(of: ":"), !entry.hasSuffix("]"), entry.filter({ $0 == ":" }).count == 1 {
                guard Int(entry[entry.index(after: colon)...]) == port else { continue }
                entry = String(entry[..<colon])
            }
            entry = withoutBrackets(entry)
            if entry.hasPrefix(".") { entry.removeFirst() }
            guard !entry.isEmpty else { continue }
            if host == entry || host.hasSuffix("." + entry) { return true }
        }
        return false
    }
}

/// A host without the brackets of an IPv6 literal (`[::1]` → `::1`).
private func withoutBrackets(_ host: String) -> String {
    host.hasPrefix("[") && host.hasSuffix("]") ? String(host.dropFirst().dropLast()) : host
}
