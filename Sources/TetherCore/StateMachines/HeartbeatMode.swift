/// How often the client pings an idle connection: the app sets it as it moves between the
/// foreground and the background (`TetherClient.setHeartbeatMode(_:)`).
///
/// Each mode's interval is in `ClientConfiguration.Heartbeat`. Whatever the mode, the client
/// pings at least twice per gateway idle timeout, or the gateway would close the connection.
public enum HeartbeatMode: Sendable, Hashable, CaseIterable, CustomStringConvertible {
    /// The app is in use: the configured interval, or the gateway's.
    case foreground
    /// The app is in the background: as rarely as the gateway allows, unless configured.
    case background
    /// The device saves power: as rarely as the gateway allows, unless configured.
    case lowPower

    public var description: String {
        switch self {
        case .foreground: "foreground"
        case .background: "background"
        case .lowPower: "low power"
        }
    }
}
