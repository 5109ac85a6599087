public import TetherCore

extension ClientConfiguration {
    /// The thresholds of the client's alerts (seed 002), each counted over a sliding ``window``;
    /// `nil` turns one off. An alert is raised once when its count reaches the threshold, and
    /// again only after the count fell below it.
    ///
    /// ```swift
    /// configuration.alerts = try .init(window: .seconds(120), reconnects: 3, slowRoundTrip: .seconds(1))
    /// for await event in client.events { if case .alert(let alert) = event { report(alert) } }
    /// ```
    public struct Alerts: Sendable, Hashable {
        /// The window the counts are over.
        public var window: Duration
        /// Reconnections within the window that raise ``ClientAlert/reconnects(count:window:)``.
        public var reconnects: Int?
        /// Connections lost to the heartbeat within the window that raise
        /// ``ClientAlert/heartbeatLosses(count:window:)``.
        public var heartbeatLosses: Int?
        /// A heartbeat round trip over this raises ``ClientAlert/slowRoundTrip(_:)``.
        public var slowRoundTrip: Duration?

        public init(
            window: Duration = .seconds(60),
            reconnects: Int? = 5,
            heartbeatLosses: Int? = 3,
            slowRoundTrip: Duration? = nil
        ) throws(ConfigurationError) {
            self.window = window
            self.reconnects = reconnects
            self.heartbeatLosses = heartbeatLosses
            self.slowRoundTrip = slowRoundTrip
            try self.validate()
        }

        /// 5 reconnections or 3 heartbeat losses within a minute; no round-trip alert.
        public static var defaults: Alerts { try! Alerts() }

        public func validate() throws(ConfigurationError) {
            guard self.window > .zero else { throw ConfigurationError("alerts.window must be positive") }
            if let reconnects = self.reconnects, reconnects < 1 { throw ConfigurationError("alerts.reconnects must be at least 1") }
            if let losses = self.heartbeatLosses, losses < 1 { throw ConfigurationError("alerts.heartbeatLosses must be at least 1") }
            if let slow = self.slowRoundTrip, slow <= .zero { throw ConfigurationError("alerts.slowRoundTrip must be positive") }
        }

        var thresholds: AlertMonitor.Thresholds {
            .init(window: self.window, reconnects: self.reconnects, heartbeatLosses: self.heartbeatLosses, roundTrip: self.slowRoundTrip)
        }
    }
}
