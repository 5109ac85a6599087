public import TetherCore

/// Reports the device's network path, so that the client reconnects at once when a network
/// comes back or changes, and does not hammer the gateway while there is none.
///
/// Tether ships ``PollingNetworkPathMonitor`` (Linux and other POSIX systems: polls the
/// interfaces) and, on Apple platforms, `NWPathNetworkMonitor` (Network.framework). Tests use
/// ``ManualNetworkPathMonitor``, whose path changes when told to.
///
/// ```swift
/// configuration.pathMonitor = PollingNetworkPathMonitor()
/// ```
public protocol NetworkPathMonitor: Sendable {
    /// The current path, then each change, until the consuming task is cancelled.
    func paths() -> AsyncStream<NetworkPath>
}
