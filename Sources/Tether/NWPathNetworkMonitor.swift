#if canImport(Network)
    import Dispatch
    import Network
    public import TetherCore

    /// A ``NetworkPathMonitor`` backed by Network.framework's `NWPathMonitor`, for Apple
    /// platforms: the system tells it at once when the path goes down, comes back, or moves
    /// to another interface.
    ///
    /// A path is available when its status is `.satisfied`. Its identity names the interface
    /// in use first (`wifi:en0`, `cellular:pdp_ip0`), then the gateways the system reports
    /// (iOS 13, macOS 10.15 and later), so that two Wi-Fi networks are told apart: NAT-timeout
    /// probing remembers what it learns per identity.
    ///
    /// ```swift
    /// configuration.pathMonitor = NWPathNetworkMonitor()
    /// ```
    ///
    /// Note: this file is compiled only where Network.framework exists. The project's CI runs
    /// on Linux; there it was type-checked (Swift 6 mode) against a stand-in module declaring
    /// the documented `NWPathMonitor`, `NWPath` and `NWInterface` API, in both its
    /// `@preconcurrency` and `@Sendable` forms, but never built against the real SDK.
    @available(macOS 10.14, iOS 12.0, tvOS 12.0, watchOS 5.0, *)
    public struct NWPathNetworkMonitor: NetworkPathMonitor {
        public init() {}

        public func paths() -> AsyncStream<NetworkPath> {
            let (stream, continuation) = AsyncStream.makeStream(of: NetworkPath.self, bufferingPolicy: .bufferingNewest(1))
            let monitor = MonitorBox(NWPathMonitor())
            monitor.value.pathUpdateHandler = { path in
                continuation.yield(Self.networkPath(path))
            }
            // The monitor lives exactly as long as someone consumes the stream.
            continuation.onTermination = { _ in monitor.value.cancel() }
            monitor.value.start(queue: DispatchQueue(label: "tether.network-path"))
            return stream
        }

        /// Tether's view of a Network.framework path.
        static func networkPath(_ path: NWPath) -> NetworkPath {
            guard path.status == .satisfied else { return .unavailable }
            // The first available interface is the one the system prefers, and uses.
            var parts = path.availableInterfaces.prefix(1).map { "\(Self.describe($0.type)):\($0.name)" }
            if #available(macOS 10.15, iOS 13.0, tvOS 13.0, watchOS 6.0, *) {
                parts += path.gateways.map { "gw=\($0)" }
            }
            return NetworkPath(isAvailable: true, identity: parts.joined(separator: ","))
        }

        private static func describe(_ type: NWInterface.InterfaceType) -> String {
            switch type {
            case .wifi: "wifi"
            case .cellular: "cellular"
            case .wiredEthernet: "ethernet"
            case .loopback: "loopback"
            case .other: "other"
            @unknown default: "unknown"
            }
        }
    }

    /// Carries the monitor into the stream's termination handler. `NWPathMonitor` is
    /// thread-safe (its handler runs on the queue given to `start`, and `cancel` may be called
    /// from anywhere), but not annotated `Sendable` in every SDK.
    private final class MonitorBox: @unchecked Sendable {
        let value: NWPathMonitor
        init(_ value: NWPathMonitor) { self.value = value }
    }
#endif
