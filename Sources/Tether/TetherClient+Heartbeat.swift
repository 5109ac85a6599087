import TetherCore

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

extension TetherClient {
    /// What NAT-timeout probing learned so far, per network; `nil` when it is off
    /// (``ClientConfiguration/Heartbeat/natProbing``).
    ///
    /// An app can log it, or show it in a diagnostics screen.
    public var natTimeoutProber: NATTimeoutProber? {
        self.state.withLockedValue { $0.natProber }
    }

    /// An idle probe was answered, or not: teach the prober about the current network, and move
    /// the current connection to the new interval if it changed.
    func idleProbeSettled(_ probe: HeartbeatStateMachine.IdleProbe, answered: Bool) {
        let interval = probe.interval
        let (change, connection, network) = self.state.withLockedValue { state in
            let network = state.network
            guard state.natProber != nil else { return (NATTimeoutProber.Change.unchanged, ClientConnection?.none, network) }
            let change =
                answered
                ? state.natProber!.probeSucceeded(network: network, interval: interval)
                : state.natProber!.probeFailed(network: network, interval: interval)
            return (change, state.current, network)
        }
        switch change {
        case .unchanged:
            if !answered {
                self.logger.info("idle probe unanswered", metadata: ["network": "\(network)", "interval": "\(interval)"])
            }
        case .grew(let next):
            self.logger.debug("the network kept the connection through the idle interval; trying longer", metadata: ["interval": "\(next)"])
            connection?.refreshHeartbeatMode()
        case .backedOff(let next):
            self.logger.notice(
                "the network drops connections idle for \(interval.shortDescription); heartbeat every \(next.shortDescription) now",
                metadata: ["network": "\(network)"]
            )
            connection?.refreshHeartbeatMode()
        }
    }
}
