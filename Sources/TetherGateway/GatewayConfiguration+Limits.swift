public import TetherCore

extension GatewayConfiguration {
    /// Size and concurrency limits.
    public struct Limits: Sendable, Hashable {
        /// The largest frame body accepted from a client (after the handshake).
        public var maxBodySize: Int
        /// Handlers run at once per connection; further requests wait (the gateway stops
        /// reading from that connection until a handler finishes).
        public var maxConcurrentRequestsPerConnection: Int

        /// When a push finds more than this many bytes already waiting to be sent to a
        /// connection, the client is not reading fast enough (a "slow consumer"): the gateway
        /// closes that connection rather than buffer without bound. The count is checked once
        /// the connection stops being writable (its buffer passed the 64 KiB high-water mark),
        /// so a limit below 64 KiB acts as 64 KiB.
        public var maxBufferedOutboundBytes: Int
        /// How many reliable deliveries a connection may have sent and not yet acknowledged.
        public var deliveryWindow: Int
        /// What a connection may hold in the gateway's memory of what it sent: the frame being
        /// read (up to ``maxBodySize``) plus the bodies of its reliable messages waiting to be
        /// processed. At the limit the gateway stops reading the connection until processing
        /// makes room (TCP then slows the client); nothing is refused. At least twice
        /// ``maxBodySize``.
        public var maxBufferedInboundBytes: Int
        /// The longest client id accepted in HELLO, in UTF-8 bytes; a longer one is refused with
        /// ERROR `invalid request`.
        public var maxClientIDLength: Int
        /// Connections held at once. The gateway also stays below its process's descriptor
        /// limit (keeping 64 in reserve), whichever is lower. A connection over a limit gets
        /// ERROR `resource exhausted` saying which, and is closed.
        public var maxConnections: Int
        /// Connections held at once from one source address. Mobile carriers put many users
        /// behind one address: keep it generous.
        public var maxConnectionsPerAddress: Int
        /// Connections held at once whose handshake (authentication included) has not completed.
        public var maxUnauthenticatedConnections: Int
        /// New connections accepted per second (each runs a handshake), in a burst up to as many.
        public var handshakesPerSecond: Int
        /// New connections accepted per second from one source address.
        public var handshakesPerSecondPerAddress: Int
        /// Requests one connection may make per second (in a burst up to as many). Beyond, the
        /// connection is paced: requests wait, in order, until the rate allows them (their
        /// deadlines running), and past 16 waiting the gateway stops reading it; none is
        /// refused. `Int.max`: no limit.
        public var requestsPerSecondPerConnection: Int
        /// Reliable messages one connection may send per second (in a burst up to as many).
        /// Beyond, the connection is paced: messages wait, in order, until the rate allows them,
        /// and past 4,096 waiting (or ``maxBufferedInboundBytes``) the gateway stops reading it;
        /// none is refused or needs sending again. `Int.max`: no limit.
        public var messagesPerSecondPerConnection: Int
        /// Payload bytes one connection's compression may inflate and deflate per second (in a
        /// burst up to as many): what a compressed request and its compressed reply cost in
        /// zlib. Beyond, the connection is paced: the gateway stops reading it until the rate
        /// allows; nothing is refused. `Int.max`: no limit.
        public var compressionBytesPerSecondPerConnection: Int
        /// Rooms one connection may be in; a join beyond fails (``RequestContext/join(_:)``
        /// returns `false`).
        public var maxRoomsPerConnection: Int
        /// Connections one room may hold; a join beyond fails.
        public var maxMembersPerRoom: Int
        /// Reliable deliveries a recipient may have waiting in the store (not yet
        /// acknowledged). A message whose handler delivers beyond it is refused for good with
        /// `resource exhausted` (its MESSAGE_ACK says so; its deliveries are not stored), and
        /// ``Gateway/deliver(to:topic:body:)`` throws.
        public var maxDeliveriesPerRecipient: Int
        /// The body bytes of the deliveries a recipient may have waiting in the store (as stored:
        /// compressed where the payload was worth it).
        public var maxDeliveryBytesPerRecipient: Int
        /// Deliveries the whole store may have waiting, every recipient together. A message
        /// whose handler delivers beyond it is refused for good with `resource exhausted`, as
        /// over a recipient's quota. The store's count is read about once a second
        /// (``MessageStore/totalUsage()``); a store that cannot tell is not held to it.
        public var maxStoredDeliveries: Int
        /// The body bytes (as stored) the whole store may have waiting.
        public var maxStoredDeliveryBytes: Int
        /// Deliveries one sender's messages may store per minute (refilled continuously; all
        /// its outboxes together). Beyond, its message is refused for good with `resource
        /// exhausted`: a client cannot fill the store by writing to many recipients.
        public var maxDeliveriesPerSenderPerMinute: Int
        /// The body bytes one sender's messages may store per minute.
        public var maxDeliveryBytesPerSenderPerMinute: Int
        /// The bytes all connections together may make the gateway hold: frames and WebSocket
        /// messages read in part, POST bodies arriving, reliable messages waiting to be
        /// processed, what a client does not read. At the limit, a connection holding bytes
        /// stops reading (TCP then slows its client), new connections are refused (ERROR
        /// `resource exhausted`, HTTP `503`), and `/ready` answers `503`; a body paused for
        /// longer than ``GatewayConfiguration/Timeouts-swift.struct/body`` is refused. At least
        /// twice ``maxBufferedInboundBytes``.
        public var memoryBudget: Int

        public init(
            maxBodySize: Int = 1 << 20,
            maxConcurrentRequestsPerConnection: Int = 512,
            maxBufferedOutboundBytes: Int = 4 << 20,
            deliveryWindow: Int = 256,
            maxBufferedInboundBytes: Int = 4 << 20,
            maxClientIDLength: Int = 256,
            maxConnections: Int = 100_000,
            maxConnectionsPerAddress: Int = 2_000,
            maxUnauthenticatedConnections: Int = 10_000,
            handshakesPerSecond: Int = 10_000,
            handshakesPerSecondPerAddress: Int = 500,
            requestsPerSecondPerConnection: Int = 20_000,
            messagesPerSecondPerConnection: Int = 5_000,
            compressionBytesPerSecondPerConnection: Int = 8 << 20,
            maxRoomsPerConnection: Int = 1_000,
            maxMembersPerRoom: Int = 100_000,
            maxDeliveriesPerRecipient: Int = 10_000,
            maxDeliveryBytesPerRecipient: Int = 64 << 20,
            maxStoredDeliveries: Int = 10_000_000,
            maxStoredDeliveryBytes: Int = 8 << 30,
            maxDeliveriesPerSenderPerMinute: Int = 100_000,
            maxDeliveryBytesPerSenderPerMinute: Int = 256 << 20,
            memoryBudget: Int = 512 << 20
        ) {
            self.maxBodySize = maxBodySize
            self.maxConcurrentRequestsPerConnection = maxConcurrentRequestsPerConnection
            self.maxBufferedOutboundBytes = maxBufferedOutboundBytes
            self.deliveryWindow = deliveryWindow
            self.maxBufferedInboundBytes = maxBufferedInboundBytes
            self.maxClientIDLength = maxClientIDLength
            self.maxConnections = maxConnections
            self.maxConnectionsPerAddress = maxConnectionsPerAddress
            self.maxUnauthenticatedConnections = maxUnauthenticatedConnections
            self.handshakesPerSecond = handshakesPerSecond
            self.handshakesPerSecondPerAddress = handshakesPerSecondPerAddress
            self.requestsPerSecondPerConnection = requestsPerSecondPerConnection
            self.messagesPerSecondPerConnection = messagesPerSecondPerConnection
            self.compressionBytesPerSecondPerConnection = compressionBytesPerSecondPerConnection
            self.maxRoomsPerConnection = maxRoomsPerConnection
            self.maxMembersPerRoom = maxMembersPerRoom
            self.maxDeliveriesPerRecipient = maxDeliveriesPerRecipient
            self.maxDeliveryBytesPerRecipient = maxDeliveryBytesPerRecipient
            self.maxStoredDeliveries = maxStoredDeliveries
            self.maxStoredDeliveryBytes = maxStoredDeliveryBytes
            self.maxDeliveriesPerSenderPerMinute = maxDeliveriesPerSenderPerMinute
            self.maxDeliveryBytesPerSenderPerMinute = maxDeliveryBytesPerSenderPerMinute
            self.memoryBudget = memoryBudget
        }

        public static var defaults: Limits { Limits() }

        public func validate() throws(ConfigurationError) {
            guard (Handshake.minimumBodyLimit...FrameHeader.absoluteMaximumBodySize).contains(self.maxBodySize) else {
                throw ConfigurationError(
                    "limits.maxBodySize must be from \(Handshake.minimumBodyLimit) to \(FrameHeader.absoluteMaximumBodySize)"
                )
            }
            guard self.maxConcurrentRequestsPerConnection >= 1 else {
                throw ConfigurationError("limits.maxConcurrentRequestsPerConnection must be at least 1")
            }
            guard self.maxBufferedOutboundBytes >= self.maxBodySize else {
                throw ConfigurationError("limits.maxBufferedOutboundBytes must be at least limits.maxBodySize")
            }
            guard self.deliveryWindow >= 1 else { throw ConfigurationError("limits.deliveryWindow must be at least 1") }
            guard self.maxBufferedInboundBytes >= 2 * self.maxBodySize else {
                throw ConfigurationError("limits.maxBufferedInboundBytes must be at least twice limits.maxBodySize")
            }
            guard self.memoryBudget >= 2 * self.maxBufferedInboundBytes else {
                throw ConfigurationError("limits.memoryBudget must be at least twice limits.maxBufferedInboundBytes")
            }
            guard (1...Int(UInt16.max)).contains(self.maxClientIDLength) else {
                throw ConfigurationError("limits.maxClientIDLength must be from 1 to 65535")
            }
            for (name, value) in [
                ("maxConnections", self.maxConnections), ("maxConnectionsPerAddress", self.maxConnectionsPerAddress),
                ("maxUnauthenticatedConnections", self.maxUnauthenticatedConnections),
                ("handshakesPerSecond", self.handshakesPerSecond), ("handshakesPerSecondPerAddress", self.handshakesPerSecondPerAddress),
                ("requestsPerSecondPerConnection", self.requestsPerSecondPerConnection),
                ("messagesPerSecondPerConnection", self.messagesPerSecondPerConnection),
                ("compressionBytesPerSecondPerConnection", self.compressionBytesPerSecondPerConnection),
                ("maxRoomsPerConnection", self.maxRoomsPerConnection), ("maxMembersPerRoom", self.maxMembersPerRoom),
                ("maxDeliveriesPerRecipient", self.maxDeliveriesPerRecipient),
                ("maxDeliveryBytesPerRecipient", self.maxDeliveryBytesPerRecipient),
                ("maxStoredDeliveries", self.maxStoredDeliveries), ("maxStoredDeliveryBytes", self.maxStoredDeliveryBytes),
                ("maxDeliveriesPerSenderPerMinute", self.maxDeliveriesPerSenderPerMinute),
                ("maxDeliveryBytesPerSenderPerMinute", self.maxDeliveryBytesPerSenderPerMinute),
            ] where value < 1 {
                throw ConfigurationError("limits.\(name) must be at least 1")
            }
        }
    }
}
