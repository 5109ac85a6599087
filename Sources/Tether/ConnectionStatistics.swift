public import TetherCore

/// What the client saw of its connections since it started (seed 002's statistics): a snapshot
/// an app can show in a diagnostics screen or log with a support request, to tell why one
/// user's connection flaps.
///
/// ```swift
/// let stats = client.statistics
/// logger.info("tether", metadata: ["rtt": "\(stats.smoothedRoundTrip?.shortDescription ?? "-")",
///                                  "reconnects": "\(stats.reconnects)", "loss": "\(stats.estimatedLoss)"])
/// ```
///
/// The same figures go to swift-metrics (``TetherClient/init(configuration:transport:eventLoopGroup:clock:tracer:metrics:logger:)``),
/// as `tether_client_*` counters, gauges and histograms.
public struct ConnectionStatistics: Sendable, Hashable {
    /// Connection attempts started (a race of several connections counts once).
    public var connectAttempts = 0
    /// Attempts that ended with a handshake.
    public var connects = 0
    /// Attempts that failed before a handshake.
    public var connectFailures = 0
    /// Connects after the first one.
    public var reconnects: Int { max(0, self.connects - 1) }
    /// Established connections that closed.
    public var disconnects = 0
    /// The transport of the connection up now, if any.
    public var currentTransport: Endpoint.Transport?
    /// Time spent connected, by transport, the current connection included.
    public var timeConnected: [Endpoint.Transport: Duration] = [:]

    /// PINGs sent.
    public var heartbeatsSent = 0
    /// Connections the heartbeat declared dead (no answer within the PONG timeout).
    public var heartbeatsLost = 0
    /// The last measured PING round trip.
    public var roundTrip: Duration?
    /// The smoothed round trip (as TCP's SRTT) the heartbeat's timeout follows.
    public var smoothedRoundTrip: Duration?
    /// The heartbeat's current interval.
    public var heartbeatInterval: Duration?

    /// Bytes written to and read from the transports (Tether frames, before TLS or WebSocket framing).
    public var bytesSent = 0
    public var bytesReceived = 0
    /// Frames from the gateway that broke the protocol (parse errors).
    public var protocolErrors = 0

    /// Requests made with ``TetherClient/request(_:body:timeout:)``.
    public var requests = 0
    /// Of those, the ones that failed (any error), and the ones that timed out.
    public var requestsFailed = 0
    public var requestsTimedOut = 0

    /// Reliable messages sent for the first time on a connection, and sent again (a lost
    /// MESSAGE or MESSAGE_ACK, or a new connection).
    public var messagesSent = 0
    public var messagesRetransmitted = 0
    /// Reliable messages acknowledged by the gateway, and those that expired first.
    public var messagesAcknowledged = 0
    public var messagesExpired = 0
    /// Messages in the outbox without an outcome yet.
    public var outboxDepth = 0

    /// Alerts raised (``ConnectionEvent/alert(_:)``).
    public var alerts = 0

    public init() {}

    /// Retransmissions over transmissions: an estimate of how much the link loses (or delays
    /// past the retransmission timeout), from the reliable messages; 0 before any was sent.
    public var estimatedLoss: Double {
        let transmissions = self.messagesSent + self.messagesRetransmitted
        return transmissions == 0 ? 0 : Double(self.messagesRetransmitted) / Double(transmissions)
    }
}
