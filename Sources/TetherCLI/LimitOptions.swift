import ArgumentParser
import TetherGateway

/// `tether serve`'s options for the gateway's limits on what clients may claim. Each one left
/// out keeps the default of ``GatewayConfiguration/Limits``, which its help shows.
struct LimitOptions: ParsableArguments {
    private static let defaults = GatewayConfiguration.Limits.defaults

    @Option(help: "Connections held at once; the descriptor limit may lower it (default \(Self.defaults.maxConnections)).")
    var maxConnections: Int?

    @Option(help: "Connections held at once from one source address (default \(Self.defaults.maxConnectionsPerAddress)).")
    var maxConnectionsPerAddress: Int?

    @Option(
        name: .customLong("max-unauthenticated"),
        help: "Connections held whose handshake has not completed (default \(Self.defaults.maxUnauthenticatedConnections))."
    )
    var maxUnauthenticatedConnections: Int?

    @Option(help: "New connections accepted per second, in total (default \(Self.defaults.handshakesPerSecond)).")
    var handshakesPerSecond: Int?

    @Option(help: "New connections accepted per second from one source address (default \(Self.defaults.handshakesPerSecondPerAddress)).")
    var handshakesPerSecondPerAddress: Int?

    @Option(
        name: .customLong("requests-per-second"),
        help: "Requests one connection may make per second (default \(Self.defaults.requestsPerSecondPerConnection))."
    )
    var requestsPerSecondPerConnection: Int?

    @Option(
        name: .customLong("messages-per-second"),
        help: "Reliable messages one connection may send per second (default \(Self.defaults.messagesPerSecondPerConnection))."
    )
    var messagesPerSecondPerConnection: Int?

    @Option(help: "The largest frame body accepted from a client, in bytes (default \(Self.defaults.maxBodySize)).")
    var maxBodySize: Int?

    @Option(
        name: .customLong("max-buffered-bytes"),
        help: """
            Bytes of what it sent that one connection may hold in memory: the frame being read and its reliable \
            messages waiting to be processed; at least twice --max-body-size (default \(Self.defaults.maxBufferedInboundBytes)).
            """
    )
    var maxBufferedInboundBytes: Int?

    @Option(help: "Reliable deliveries a recipient may have waiting in the store (default \(Self.defaults.maxDeliveriesPerRecipient)).")
    var maxDeliveriesPerRecipient: Int?

    @Option(help: "Bytes of deliveries a recipient may have waiting in the store (default \(Self.defaults.maxDeliveryBytesPerRecipient)).")
    var maxDeliveryBytesPerRecipient: Int?

    @Option(help: "Deliveries the whole store may have waiting, every recipient together (default \(Self.defaults.maxStoredDeliveries)).")
    var maxStoredDeliveries: Int?

    @Option(help: "Bytes of deliveries the whole store may have waiting (default \(Self.defaults.maxStoredDeliveryBytes)).")
    var maxStoredDeliveryBytes: Int?

    @Option(
        help: "Deliveries one sender's messages may store per minute (default \(Self.defaults.maxDeliveriesPerSenderPerMinute))."
    )
    var maxDeliveriesPerSenderPerMinute: Int?

    @Option(
        help:
            "Bytes of deliveries one sender's messages may store per minute (default \(Self.defaults.maxDeliveryBytesPerSenderPerMinute))."
    )
    var maxDeliveryBytesPerSenderPerMinute: Int?

    @Option(
        name: .customLong("compression-bytes-per-second"),
        help: """
            Payload bytes one connection's compression may inflate and deflate per second before the gateway paces it \
            (default \(Self.defaults.compressionBytesPerSecondPerConnection)).
            """
    )
    var compressionBytesPerSecondPerConnection: Int?

    @Option(
        help: """
            Bytes all connections together may make the gateway hold (frames and messages read in part, POST bodies, \
            reliable messages waiting, what clients do not read); at three quarters connections holding bytes pause and new \
            ones are refused (default \(Self.defaults.memoryBudget)).
            """
    )
    var memoryBudget: Int?

    /// Sets the limits given on the command line.
    /// - Throws: `ValidationError` naming the limit if the result is not a valid configuration.
    func apply(to limits: inout GatewayConfiguration.Limits) throws {
        let options: [(WritableKeyPath<GatewayConfiguration.Limits, Int>, Int?)] = [
            (\.maxConnections, self.maxConnections),
            (\.maxConnectionsPerAddress, self.maxConnectionsPerAddress),
            (\.maxUnauthenticatedConnections, self.maxUnauthenticatedConnections),
            (\.handshakesPerSecond, self.handshakesPerSecond),
            (\.handshakesPerSecondPerAddress, self.handshakesPerSecondPerAddress),
            (\.requestsPerSecondPerConnection, self.requestsPerSecondPerConnection),
            (\.messagesPerSecondPerConnection, self.messagesPerSecondPerConnection),
            (\.maxBodySize, self.maxBodySize),
            (\.maxBufferedInboundBytes, self.maxBufferedInboundBytes),
            (\.maxDeliveriesPerRecipient, self.maxDeliveriesPerRecipient),
            (\.maxDeliveryBytesPerRecipient, self.maxDeliveryBytesPerRecipient),
            (\.memoryBudget, self.memoryBudget),
            (\.maxStoredDeliveries, self.maxStoredDeliveries),
            (\.maxStoredDeliveryBytes, self.maxStoredDeliveryBytes),
            (\.maxDeliveriesPerSenderPerMinute, self.maxDeliveriesPerSenderPerMinute),
            (\.maxDeliveryBytesPerSenderPerMinute, self.maxDeliveryBytesPerSenderPerMinute),
            (\.compressionBytesPerSecondPerConnection, self.compressionBytesPerSecondPerConnection),
        ]
        for case (let limit, let value?) in options { limits[keyPath: limit] = value }
        do {
            try limits.validate()
        } catch {
            throw ValidationError("\(error.message)")
        }
    }
}
