extension TetherClient {
    /// The heartbeat mode: how often an idle connection is pinged.
    public var heartbeatMode: HeartbeatMode {
        self.state.withLockedValue { $0.heartbeatMode }
    }

    /// Switches the heartbeat mode, on the current connection at once and on later ones.
    ///
    /// Call it as the app moves between the foreground and the background; the intervals are in
    /// ``ClientConfiguration/Heartbeat``. After a suspension, the client does not trust stale
    /// timers: it probes the link quickly before declaring it dead.
    ///
    /// ```swift
    /// // UIKit: in sceneDidEnterBackground / sceneWillEnterForeground
    /// client.setHeartbeatMode(.background)
    /// client.setHeartbeatMode(.foreground)
    /// ```
    public func setHeartbeatMode(_ mode: HeartbeatMode) {
        let connection = self.state.withLockedValue { state -> ClientConnection? in
            guard state.heartbeatMode != mode else { return nil }
            state.heartbeatMode = mode
            return state.current
        }
        connection?.refreshHeartbeatMode()
    }
}
