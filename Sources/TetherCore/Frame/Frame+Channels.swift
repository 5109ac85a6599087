public import NIOCore

extension Frame {
    /// The longest channel name, in bytes of UTF-8.
    public static let maxChannelLength = 255

    /// Whether `name` can name a channel: 1 to ``maxChannelLength`` bytes of UTF-8.
    package static func isValidChannelName(_ name: some StringProtocol) -> Bool {
        !name.isEmpty && name.utf8.count <= Self.maxChannelLength
    }

    /// SUBSCRIBE: the client subscribes to a channel, from the top or recovering what it missed
    /// after a position (PROTOCOL.md, section 12). Answered by a SUBSCRIBED with the same id.
    public struct Subscribe: Sendable, Hashable {
        /// The subscription request's id, echoed by its SUBSCRIBED.
        public var id: UInt64
        /// The channel, 1 to ``Frame/maxChannelLength`` bytes of UTF-8.
        public var channel: String
        /// The subscriber's last position, to recover what followed it; `nil` to start at the top.
        public var recoverFrom: ChannelPosition?
        /// Whether the subscriber wants the channel's join and leave events.
        public var presenceEvents: Bool

        public init(id: UInt64, channel: String, recoverFrom: ChannelPosition? = nil, presenceEvents: Bool = false) {
            self.id = id
            self.channel = channel
            self.recoverFrom = recoverFrom
            self.presenceEvents = presenceEvents
        }

        /// The bits of SUBSCRIBE's `flags` field.
        package enum Flag {
            package static let recover: UInt8 = 1 << 0
            package static let presenceEvents: UInt8 = 1 << 1
            package static let known: UInt8 = recover | presenceEvents
        }
    }

    /// SUBSCRIBED: the gateway's answer to the SUBSCRIBE with the same id. On success the
    /// publications that follow ``startingAfter`` come next, oldest first, then the live ones.
    public struct Subscribed: Sendable, Hashable {
        /// The id of the SUBSCRIBE answered.
        public var id: UInt64
        /// ``StatusCode/ok``, or why the subscription was refused.
        public var status: StatusCode
        /// A human-readable explanation; empty on success.
        public var message: String
        /// The stream's epoch; 0 for a channel without history.
        public var epoch: UInt64
        /// The offset the publications sent next start after.
        public var startingAfter: UInt64
        /// Whether publications between the subscriber's position and ``startingAfter`` are lost.
        public var gap: Bool

        public init(
            id: UInt64,
            status: StatusCode = .ok,
            message: String = "",
            epoch: UInt64 = 0,
            startingAfter: UInt64 = 0,
            gap: Bool = false
        ) {
            self.id = id
            self.status = status
            self.message = message
            self.epoch = epoch
            self.startingAfter = startingAfter
            self.gap = gap
        }
    }

    /// PUBLICATION: one publication of a channel, at its position in the channel's stream.
    public struct Publication: Sendable, Hashable {
        /// The channel.
        public var channel: String
        /// Its position: epoch and offset, both 0 for a channel without history.
        public var position: ChannelPosition
        /// The client id that published it; empty when the gateway or the backend did.
        public var publisher: String
        /// The publication's content.
        public var body: ByteBuffer

        public init(
            channel: String,
            position: ChannelPosition = ChannelPosition(epoch: 0, offset: 0),
            publisher: String = "",
            body: ByteBuffer = ByteBuffer()
        ) {
            self.channel = channel
            self.position = position
            self.publisher = publisher
            self.body = body
        }

        /// The size of the frame body this publication encodes to, which the peer's maximum
        /// body size limits.
        @inlinable
        public var bodySize: Int { 20 + self.channel.utf8.count + self.publisher.utf8.count + self.body.readableBytes }
    }

    /// UNSUBSCRIBE: the client leaves a channel (status ``StatusCode/ok``), or the gateway
    /// removed the client from it, saying why.
    public struct Unsubscribe: Sendable, Hashable {
        /// The channel.
        public var channel: String
        /// ``StatusCode/ok``, or why the gateway removed the subscription
        /// (``StatusCode/permissionDenied``: it must not subscribe again).
        public var status: StatusCode
        /// A human-readable explanation.
        public var message: String

        public init(channel: String, status: StatusCode = .ok, message: String = "") {
            self.channel = channel
            self.status = status
            self.message = message
        }
    }

    /// PRESENCE: a client joined or left a channel (PROTOCOL.md, section 12.4), sent to the
    /// subscribers that asked for the channel's presence events.
    ///
    /// After a SUBSCRIBED that accepted them, the channel's members come first, each as
    /// ``Kind-swift.enum/joined``, then the changes: what a subscriber folds from them, by
    /// client id, is who is in the channel.
    public struct Presence: Sendable, Hashable {
        /// What happened.
        public enum Kind: UInt8, Sendable, Hashable, CustomStringConvertible {
            /// The client is in the channel (its first connection subscribed), with ``Presence/info``.
            case joined = 1
            /// The client left the channel (its last connection there went).
            case left = 2

            public var description: String {
                switch self {
                case .joined: "joined"
                case .left: "left"
                }
            }
        }

        /// The channel.
        public var channel: String
        public var kind: Kind
        /// The client's id, not empty.
        public var clientID: String
        /// What the client shows others (``Kind-swift.enum/joined`` only; empty otherwise).
        public var info: String

        public init(channel: String, kind: Kind, clientID: String, info: String = "") {
            self.channel = channel
            self.kind = kind
            self.clientID = clientID
            self.info = info
        }

        /// The size of the frame body this event encodes to, which the peer's maximum body
        /// size limits.
        public var bodySize: Int { 9 + self.channel.utf8.count + self.clientID.utf8.count + self.info.utf8.count }
    }
}
