public import NIOCore

extension Frame {
    /// HELLO: the first frame a client sends, offering versions and features.
    public struct Hello: Sendable, Hashable {
        /// The protocol versions the client speaks.
        public var versions: ClosedRange<UInt8>
        /// The optional features the client supports.
        public var features: Features
        /// The largest frame body the client accepts.
        public var maxBodySize: UInt32
        /// The client's stable identity (a user or device id); the gateway can push to it.
        public var clientID: String
        /// An opaque credential for the gateway's authenticator, if any.
        public var authToken: ByteBuffer?
        /// A free-form description of the client software, for logs.
        public var userAgent: String?
        /// With reliable delivery: the deliveries the client already has.
        public var resume: Resume?
        /// With reliable delivery: the identity of the client's outbox. It changes only when the
        /// outbox is created anew (the app was reinstalled, its data cleared); then the gateway
        /// forgets the client's conversation sequences, so that the new messages, numbered from 1
        /// again, are not mistaken for duplicates.
        public var outboxEpoch: UInt64?

        public init(
            versions: ClosedRange<UInt8>,
            features: Features,
            maxBodySize: UInt32,
            clientID: String,
            authToken: ByteBuffer? = nil,
            userAgent: String? = nil,
            resume: Resume? = nil,
            outboxEpoch: UInt64? = nil
        ) {
            self.versions = versions
            self.features = features
            self.maxBodySize = maxBodySize
            self.clientID = clientID
            self.authToken = authToken
            self.userAgent = userAgent
            self.resume = resume
            self.outboxEpoch = outboxEpoch
        }

        /// Where a reconnecting client's stream of deliveries stands.
        public struct Resume: Sendable, Hashable {
            /// The delivery epoch the client's sequence numbers belong to (from an earlier WELCOME).
            public var epoch: UInt64
            /// Every delivery up to this sequence number was received and processed.
            public var lastSequence: UInt64

            public init(epoch: UInt64, lastSequence: UInt64) {
                self.epoch = epoch
                self.lastSequence = lastSequence
            }
        }
    }

    /// WELCOME: the gateway's acceptance of a HELLO, with the negotiated parameters.
    public struct Welcome: Sendable, Hashable {
        /// The version both peers use from now on.
        public var version: UInt8
        /// The features both peers use from now on (a subset of the client's offer).
        public var features: Features
        /// The gateway's identifier for this connection.
        public var connectionID: UInt64
        /// How often the gateway expects the client to show it is alive.
        public var heartbeatInterval: Duration
        /// The gateway closes a connection from which it received nothing for this long.
        public var idleTimeout: Duration
        /// The largest frame body the gateway accepts.
        public var maxBodySize: UInt32
        /// How many requests the gateway runs at once on this connection; more are queued.
        public var maxConcurrentRequests: UInt32
        /// A free-form name of the gateway, for logs.
        public var serverName: String?
        /// With reliable delivery: the epoch of the gateway's delivery sequence numbers. It changes
        /// only if the gateway's message store was replaced; then the client starts from zero.
        public var deliveryEpoch: UInt64?

        public init(
            version: UInt8,
            features: Features,
            connectionID: UInt64,
            heartbeatInterval: Duration,
            idleTimeout: Duration,
            maxBodySize: UInt32,
            maxConcurrentRequests: UInt32,
            serverName: String? = nil,
            deliveryEpoch: UInt64? = nil
        ) {
            self.version = version
            self.features = features
            self.connectionID = connectionID
            self.heartbeatInterval = heartbeatInterval
            self.idleTimeout = idleTimeout
            self.maxBodySize = maxBodySize
            self.maxConcurrentRequests = maxConcurrentRequests
            self.serverName = serverName
            self.deliveryEpoch = deliveryEpoch
        }
    }

    /// REQUEST: a call of `method` with an opaque body, answered by a RESPONSE with the same id.
    public struct Request: Sendable, Hashable {
        /// The request id, unique among the sender's requests in flight on the connection.
        public var id: UInt64
        /// The method (route) to call, at most 65,535 bytes of UTF-8.
        public var method: String
        /// How long the client waits for the response; `nil` if it set no limit.
        public var timeout: Duration?
        /// The request's content.
        public var body: ByteBuffer
        /// The caller's trace (W3C Trace Context: `traceparent`, `tracestate`), with the
        /// negotiated ``Features/traceContext``; `nil` for none.
        public var traceContext: TraceContext?

        public init(
            id: UInt64,
            method: String,
            timeout: Duration? = nil,
            body: ByteBuffer = ByteBuffer(),
            traceContext: TraceContext? = nil
        ) {
            self.id = id
            self.method = method
            self.timeout = timeout
            self.body = body
            self.traceContext = traceContext
        }

        /// The size of the frame body this request encodes to, which the peer's maximum body
        /// size limits: the timeout, the method with its length, the trace context and the body.
        @inlinable
        public var bodySize: Int { 6 + self.method.utf8.count + self.body.readableBytes + (self.traceContext?.encodedSize ?? 0) }
    }

    /// RESPONSE: the outcome of the request with the same id.
    public struct Response: Sendable, Hashable {
        /// The id of the request this answers.
        public var id: UInt64
        /// ``StatusCode/ok`` or why the request failed.
        public var status: StatusCode
        /// A human-readable explanation; empty on success.
        public var message: String
        /// The reply's content.
        public var body: ByteBuffer

        public init(id: UInt64, status: StatusCode = .ok, message: String = "", body: ByteBuffer = ByteBuffer()) {
            self.id = id
            self.status = status
            self.message = message
            self.body = body
        }

        /// The size of the frame body this response encodes to, which the peer's maximum body
        /// size limits: the status, the message with its length, and the body.
        @inlinable
        public var bodySize: Int { 4 + self.message.utf8.count + self.body.readableBytes }
    }

    /// PUSH: a message the gateway sends on a topic without being asked.
    public struct Push: Sendable, Hashable {
        /// The topic subscribers select pushes by, at most 65,535 bytes of UTF-8.
        public var topic: String
        /// The push's content.
        public var body: ByteBuffer

        public init(topic: String, body: ByteBuffer = ByteBuffer()) {
            self.topic = topic
            self.body = body
        }

        /// The size of the frame body this push encodes to, which the peer's maximum body size
        /// limits: the topic with its length, and the body.
        @inlinable
        public var bodySize: Int { 2 + self.topic.utf8.count + self.body.readableBytes }
    }

    /// PING and PONG: a liveness probe and its answer, which echoes `id` and `data`.
    public struct Ping: Sendable, Hashable {
        /// An identifier chosen by the pinging side.
        public var id: UInt64
        /// Opaque bytes chosen by the pinging side (for example a timestamp), echoed in the PONG.
        public var data: ByteBuffer

        public init(id: UInt64, data: ByteBuffer = ByteBuffer()) {
            self.id = id
            self.data = data
        }
    }

    /// CANCEL: the client abandons the request with this id.
    public struct Cancel: Sendable, Hashable {
        public var requestID: UInt64
        public init(requestID: UInt64) { self.requestID = requestID }
    }

    /// GOAWAY: the gateway is closing the connection once requests in flight are answered.
    public struct GoAway: Sendable, Hashable {
        /// Why the gateway is going away.
        public var reason: Reason
        /// How long the client should wait before it connects again.
        public var retryAfter: Duration
        /// Where the client should connect instead (`host:port`), if anywhere in particular.
        public var alternateEndpoint: String?
        /// A human-readable explanation.
        public var message: String

        public init(reason: Reason, retryAfter: Duration = .zero, alternateEndpoint: String? = nil, message: String = "") {
            self.reason = reason
            self.retryAfter = retryAfter
            self.alternateEndpoint = alternateEndpoint
            self.message = message
        }

        /// The reason code of a GOAWAY frame.
        public struct Reason: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
            public var rawValue: UInt16
            public init(rawValue: UInt16) { self.rawValue = rawValue }

            /// The gateway is shutting down.
            public static let shutdown = Reason(rawValue: 0)
            /// The client sent nothing for longer than the idle timeout.
            public static let idleTimeout = Reason(rawValue: 1)
            /// The operator moves clients elsewhere (rebalancing, maintenance).
            public static let maintenance = Reason(rawValue: 2)
            /// The gateway is overloaded.
            public static let overloaded = Reason(rawValue: 3)
            /// The client's credentials expired (and were not refreshed): connect again with
            /// fresh ones.
            public static let credentialsExpired = Reason(rawValue: 4)
            /// The server disconnected the client for good (a banned user, credentials
            /// revoked): it must not connect again with the same credentials.
            public static let revoked = Reason(rawValue: 5)

            public var description: String {
                switch self {
                case .shutdown: "shutdown"
                case .idleTimeout: "idle timeout"
                case .maintenance: "maintenance"
                case .overloaded: "overloaded"
                case .credentialsExpired: "credentials expired"
                case .revoked: "revoked"
                default: "reason \(self.rawValue)"
                }
            }
        }
    }

    /// ERROR: a connection-level error. Its sender closes the connection after sending it.
    public struct ErrorReport: Sendable, Hashable {
        /// The id of the frame that caused the error, or 0.
        public var relatedID: UInt64
        /// What went wrong.
        public var code: StatusCode
        /// A human-readable explanation.
        public var message: String

        public init(code: StatusCode, message: String, relatedID: UInt64 = 0) {
            self.code = code
            self.message = message
            self.relatedID = relatedID
        }
    }

    /// MESSAGE: a reliable message from a client, processed at most once and acknowledged.
    public struct Message: Sendable, Hashable {
        /// The client's id of the message, unique among all its messages, never reused.
        public var id: UInt64
        /// What the message is about; the gateway routes it to the handler of this topic.
        public var topic: String
        /// The ordering key: the gateway processes a client's messages of one conversation in
        /// ``sequence`` order, each once.
        public var conversation: String
        /// The message's position in its conversation, from 1, without gaps.
        public var sequence: UInt64
        /// How much longer the message is worth processing; `nil` if it does not expire.
        public var ttl: Duration?
        /// The client gave up on the message (its time to live ran out): the gateway records it
        /// as refused with ``StatusCode/deadlineExceeded`` without running a handler, so that the
        /// conversation's later messages can be processed. Sent with an empty body.
        public var expired: Bool
        /// The message's content.
        public var body: ByteBuffer
        /// The sender's trace (W3C Trace Context), with the negotiated ``Features/traceContext``;
        /// `nil` for none.
        public var traceContext: TraceContext?

        public init(
            id: UInt64,
            topic: String,
            conversation: String,
            sequence: UInt64,
            ttl: Duration? = nil,
            expired: Bool = false,
            body: ByteBuffer = ByteBuffer(),
            traceContext: TraceContext? = nil
        ) {
            self.id = id
            self.topic = topic
            self.conversation = conversation
            self.sequence = sequence
            self.ttl = ttl
            self.expired = expired
            self.body = body
            self.traceContext = traceContext
        }
    }

    /// MESSAGE_ACK: the outcome of one or more MESSAGEs.
    public struct MessageAck: Sendable, Hashable {
        /// One acknowledged message.
        public struct Entry: Sendable, Hashable {
            /// The message's id.
            public var id: UInt64
            /// ``StatusCode/ok`` if it was processed (now or before), otherwise why it was refused
            /// for good. Either way the client must not send it again.
            public var status: StatusCode

            public init(id: UInt64, status: StatusCode = .ok) {
                self.id = id
                self.status = status
            }
        }

        /// At least one entry.
        public var entries: [Entry]

        public init(entries: [Entry]) {
            self.entries = entries
        }
    }

    /// DELIVERY: a reliable push, numbered per recipient, kept by the gateway until acknowledged.
    public struct Delivery: Sendable, Hashable {
        /// The delivery's number in the recipient's stream, from 1, without gaps.
        public var sequence: UInt64
        /// What the delivery is about.
        public var topic: String
        /// The delivery's content.
        public var body: ByteBuffer
        /// Whether the deliveries between the last one sent on this connection and this one
        /// were acknowledged on another connection of the client id (the ACKED_ELSEWHERE flag,
        /// with ``Features/sharedDeliveries``): then this one is the next, not a gap.
        public var afterAcknowledged: Bool

        public init(sequence: UInt64, topic: String, body: ByteBuffer = ByteBuffer(), afterAcknowledged: Bool = false) {
            self.sequence = sequence
            self.topic = topic
            self.body = body
            self.afterAcknowledged = afterAcknowledged
        }
    }

    /// DELIVERY_ACK: every delivery up to ``sequence`` was received and processed.
    public struct DeliveryAck: Sendable, Hashable {
        public var sequence: UInt64
        public init(sequence: UInt64) { self.sequence = sequence }
    }

    /// A frame of an extension type (`0x80`–`0xFF`), carried through uninterpreted.
    public struct Extension: Sendable, Hashable {
        public var type: FrameType
        public var id: UInt64
        public var body: ByteBuffer

        public init(type: FrameType, id: UInt64 = 0, body: ByteBuffer = ByteBuffer()) {
            precondition(type.isIgnorableExtension, "extension frame types are 0x80-0xFF")
            self.type = type
            self.id = id
            self.body = body
        }
    }
}

/// Optional protocol features, negotiated in HELLO and WELCOME.
///
/// Bits other than those defined here are reserved: a client may offer them, a gateway must
/// never accept a bit it does not know.
public struct Features: OptionSet, Hashable, Sendable {
    public var rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }

    /// Every frame after the handshake carries a CRC-32C checksum.
    public static let checksum = Features(rawValue: 1 << 0)
    /// MESSAGE, MESSAGE_ACK, DELIVERY and DELIVERY_ACK may be used, and HELLO may resume.
    public static let reliableDelivery = Features(rawValue: 1 << 1)
    /// With reliable delivery: the gateway answers a MESSAGE it does not take now (a gap before
    /// it, a full inbox, a rate over the limit) with a MESSAGE_ACK entry `unavailable`, which
    /// is not final: the client sends the message again (PROTOCOL.md, section 9.1).
    public static let messageAnswers = Features(rawValue: 1 << 2)
    /// Payloads may be compressed with DEFLATE, each on its own (the COMPRESSED flag,
    /// PROTOCOL.md, section 2.5).
    public static let compression = Features(rawValue: 1 << 3)
    /// REQUEST and MESSAGE may carry the sender's trace context (the TRACE_CONTEXT flag,
    /// PROTOCOL.md, section 4.14).
    public static let traceContext = Features(rawValue: 1 << 4)
    /// SUBSCRIBE, SUBSCRIBED, PUBLICATION and UNSUBSCRIBE may be used: channels with history
    /// and recovery (PROTOCOL.md, section 12).
    public static let channels = Features(rawValue: 1 << 5)
    /// With reliable delivery: a DELIVERY that follows deliveries another connection of the
    /// same client id acknowledged says so (the ACKED_ELSEWHERE flag), and the client takes it
    /// as the next rather than as a gap (PROTOCOL.md, section 9.2).
    public static let sharedDeliveries = Features(rawValue: 1 << 6)

    /// The features this implementation knows.
    public static let known: Features = [
        .checksum, .reliableDelivery, .messageAnswers, .compression, .traceContext, .channels, .sharedDeliveries,
    ]
}
