/// What a network-path monitor reports: whether the device has a usable network, and which.
public struct NetworkPath: Sendable, Hashable, CustomStringConvertible {
    /// Whether a route to the network exists (some interface is up with an address).
    public var isAvailable: Bool
    /// Identifies the network: the interfaces and addresses in use. When it changes while
    /// available (Wi-Fi to cellular, a new address), connections over the old one are suspect.
    public var identity: String

    public init(isAvailable: Bool, identity: String) {
        self.isAvailable = isAvailable
        self.identity = identity
    }

    /// No network at all.
    public static let unavailable = NetworkPath(isAvailable: false, identity: "")

    public var description: String { self.isAvailable ? "available (\(self.identity))" : "unavailable" }
}
