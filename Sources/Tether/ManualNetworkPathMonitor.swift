public import TetherCore
import TetherNIO

/// A ``NetworkPathMonitor`` driven by hand: it reports whatever path it is told, for an app
/// with its own source of reachability (or none on its platform), a test, or the lab.
///
/// ```swift
/// let paths = ManualNetworkPathMonitor()
/// configuration.pathMonitor = paths
/// paths.set(.unavailable)                                              // airplane mode
/// paths.set(NetworkPath(isAvailable: true, identity: "cellular"))     // back, on another network
/// ```
public final class ManualNetworkPathMonitor: NetworkPathMonitor {
    private struct State {
        var current: NetworkPath
        var subscribers: [Int: AsyncStream<NetworkPath>.Continuation] = [:]
        var nextID = 0
    }

    private let state: TetherLock<State>

    /// Starts with `initial` (by default an available network called "wifi").
    public init(initial: NetworkPath = NetworkPath(isAvailable: true, identity: "wifi")) {
        self.state = TetherLock(State(current: initial))
    }

    /// The path reported now.
    public var current: NetworkPath { self.state.withLockedValue { $0.current } }

    /// Reports `path` to every subscriber.
    public func set(_ path: NetworkPath) {
        let subscribers = self.state.withLockedValue { state in
            state.current = path
            return Array(state.subscribers.values)
        }
        for subscriber in subscribers { subscriber.yield(path) }
    }

    public func paths() -> AsyncStream<NetworkPath> {
        let (stream, continuation) = AsyncStream.makeStream(of: NetworkPath.self, bufferingPolicy: .unbounded)
        let id = self.state.withLockedValue { state in
            defer { state.nextID += 1 }
            state.subscribers[state.nextID] = continuation
            continuation.yield(state.current)
            return state.nextID
        }
        continuation.onTermination = { _ in
            _ = self.state.withLockedValue { $0.subscribers.removeValue(forKey: id) }
        }
        return stream
    }
}
