public import TetherCore

#if canImport(Darwin)
    import Darwin
#elseif canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#endif

/// A ``NetworkPathMonitor`` that polls the network interfaces (`getifaddrs`): available while
/// some interface other than loopback is up and running with an address; its identity is the
/// list of those interfaces and addresses.
///
/// Portable and dependency-free; on Linux a change is seen within one poll interval. (Apple
/// apps should prefer `NWPathNetworkMonitor`, which the system notifies at once.)
public struct PollingNetworkPathMonitor: NetworkPathMonitor {
    /// How often the interfaces are read.
    public var interval: Duration
    /// Whether loopback counts as a network (for tests and labs that run on loopback only).
    public var includeLoopback: Bool

    public init(interval: Duration = .seconds(1), includeLoopback: Bool = false) {
        precondition(interval > .zero, "the polling interval must be positive")
        self.interval = interval
        self.includeLoopback = includeLoopback
    }

    public func paths() -> AsyncStream<NetworkPath> {
        let (stream, continuation) = AsyncStream.makeStream(of: NetworkPath.self, bufferingPolicy: .bufferingNewest(1))
        let interval = self.interval
        let includeLoopback = self.includeLoopback
        // The stream's own poller: it lives exactly as long as someone consumes the stream.
        let poller = Task {
            var last: NetworkPath?
            while !Task.isCancelled {
                let path = Self.currentPath(includeLoopback: includeLoopback)
                if path != last {
                    continuation.yield(path)
                    last = path
                }
                try? await Task.sleep(for: interval)
            }
            continuation.finish()
        }
        continuation.onTermination = { _ in poller.cancel() }
        return stream
    }

    /// The path now, read from the interfaces.
    public static func currentPath(includeLoopback: Bool = false) -> NetworkPath {
        var list: UnsafeMutablePointer<ifaddrs>?
        guard getifaddrs(&list) == 0, let first = list else { return .unavailable }
        defer { freeifaddrs(list) }
        var entries: [String] = []
        var cursor: UnsafeMutablePointer<ifaddrs>? = first
        while let entry = cursor {
            defer { cursor = entry.pointee.ifa_next }
            let flags = Int32(entry.pointee.ifa_flags)
            guard flags & Int32(IFF_UP) != 0, flags & Int32(IFF_RUNNING) != 0 else { continue }
            guard includeLoopback || flags & Int32(IFF_LOOPBACK) == 0 else { continue }
            guard let address = entry.pointee.ifa_addr else { continue }
            let family = Int32(address.pointee.sa_family)
            guard family == AF_INET || family == AF_INET6 else { continue }
            var host = [CChar](repeating: 0, count: Int(NI_MAXHOST))
            let length = socklen_t(family == AF_INET ? MemoryLayout<sockaddr_in>.size : MemoryLayout<sockaddr_in6>.size)
            guard getnameinfo(address, length, &host, socklen_t(host.count), nil, 0, NI_NUMERICHOST) == 0 else { continue }
            let name = String(cString: entry.pointee.ifa_name)
            let numeric = host.withUnsafeBufferPointer { String(cString: $0.baseAddress!) }
            entries.append("\(name)=\(numeric)")
        }
        entries.sort()
        return NetworkPath(isAvailable: !entries.isEmpty, identity: entries.joined(separator: ","))
    }
}
