/// One decoded Tether frame: the header fields that apply to every type, and a typed payload.
///
/// The header's `type`, `id`, `length` and `checksum` fields are derived from ``payload`` and
/// ``flags`` by ``FrameEncoder``; ``FrameDecoder`` fills them back in.
///
/// ```swift
/// let frame = Frame(.request(.init(id: 7, method: "echo", body: ByteBuffer(string: "hi"))))
/// ```
public struct Frame: Sendable, Hashable {
    /// The logical channel the frame belongs to; 0 is the default channel and the only one
    /// version 1 uses. Reserved for per-conversation ordering.
    public var stream: UInt32
    /// Header flags. On decoded frames ``FrameFlags/checksum`` tells whether the frame carried a
    /// (verified) checksum; on frames to encode it asks the encoder to compute one.
    public var flags: FrameFlags
    /// The frame's type and content.
    public var payload: Payload

    /// Creates a frame.
    /// - Parameters:
    ///   - payload: The frame's type and content.
    ///   - stream: The logical channel, 0 by default.
    ///   - flags: Header flags; pass ``FrameFlags/checksum`` to have a checksum computed.
    public init(_ payload: Payload, stream: UInt32 = 0, flags: FrameFlags = []) {
        self.payload = payload
        self.stream = stream
        self.flags = flags
    }

    /// The type byte this frame is encoded with.
    public var type: FrameType { self.payload.type }

    /// The content of a frame, one case per frame type.
    public enum Payload: Sendable, Hashable {
        /// HELLO (client → gateway): opens the handshake.
        case hello(Hello)
        /// WELCOME (gateway → client): accepts the handshake with the negotiated parameters.
        case welcome(Welcome)
        /// REQUEST (client → gateway): calls a method.
        case request(Request)
        /// RESPONSE (gateway → client): the outcome of a request.
        case response(Response)
        /// PUSH (gateway → client): a message on a topic, not solicited by a request.
        case push(Push)
        /// PING (either way): asks the peer for a PONG.
        case ping(Ping)
        /// PONG (either way): answers a PING, echoing its id and data.
        case pong(Ping)
        /// CANCEL (client → gateway): the client no longer wants the response to a request.
        case cancel(Cancel)
        /// GOAWAY (gateway → client): the gateway is closing this connection.
        case goAway(GoAway)
        /// ERROR (either way): a connection-level error; the sender closes after sending it.
        case error(ErrorReport)
        /// MESSAGE (client → gateway): a reliable message, answered by MESSAGE_ACK.
        case message(Message)
        /// MESSAGE_ACK (gateway → client): the outcome of reliable messages.
        case messageAck(MessageAck)
        /// DELIVERY (gateway → client): a reliable push, numbered per recipient.
        case delivery(Delivery)
        /// DELIVERY_ACK (client → gateway): every delivery up to a sequence number was received.
        case deliveryAck(DeliveryAck)
        /// SUBSCRIBE (client → gateway): subscribes to a channel, recovering from a position.
        case subscribe(Subscribe)
        /// SUBSCRIBED (gateway → client): the answer to a SUBSCRIBE, with where its
        /// publications start.
        case subscribed(Subscribed)
        /// PUBLICATION (gateway → client): a channel's publication, at its position.
        case publication(Publication)
        /// UNSUBSCRIBE (either way): the client leaves a channel, or the gateway removed it.
        case unsubscribe(Unsubscribe)
        /// PRESENCE (gateway → client): a client joined or left a channel, for a subscriber
        /// that asked for its presence events.
        case presence(Presence)
        /// An extension frame (type `0x80`–`0xFF`) this implementation does not interpret.
        case `extension`(Extension)

        /// The type byte of this payload.
        public var type: FrameType {
            switch self {
            case .hello: .hello
            case .welcome: .welcome
            case .request: .request
            case .response: .response
            case .push: .push
            case .ping: .ping
            case .pong: .pong
            case .cancel: .cancel
            case .goAway: .goAway
            case .error: .error
            case .message: .message
            case .messageAck: .messageAck
            case .delivery: .delivery
            case .deliveryAck: .deliveryAck
            case .subscribe: .subscribe
            case .subscribed: .subscribed
            case .publication: .publication
            case .unsubscribe: .unsubscribe
            case .presence: .presence
            case .extension(let ext): ext.type
            }
        }
    }
}

extension Frame: CustomStringConvertible {
    public var description: String {
        switch self.payload {
        case .hello(let hello): "HELLO(client: \(hello.clientID), versions: \(hello.versions))"
        case .welcome(let welcome): "WELCOME(version: \(welcome.version), connection: \(welcome.connectionID))"
        case .request(let request): "REQUEST(id: \(request.id), method: \(request.method), \(request.body.readableBytes) bytes)"
        case .response(let response):
            "RESPONSE(id: \(response.id), status: \(response.status), \(response.body.readableBytes) bytes)"
        case .push(let push): "PUSH(topic: \(push.topic), \(push.body.readableBytes) bytes)"
        case .ping(let ping): "PING(id: \(ping.id))"
        case .pong(let ping): "PONG(id: \(ping.id))"
        case .cancel(let cancel): "CANCEL(request: \(cancel.requestID))"
        case .goAway(let goAway): "GOAWAY(reason: \(goAway.reason), retry after: \(goAway.retryAfter))"
        case .error(let error): "ERROR(code: \(error.code), message: \(error.message))"
        case .message(let message):
            "MESSAGE(id: \(message.id), topic: \(message.topic), conversation: \(message.conversation), sequence: \(message.sequence))"
        case .messageAck(let ack): "MESSAGE_ACK(\(ack.entries.count) messages)"
        case .delivery(let delivery): "DELIVERY(sequence: \(delivery.sequence), topic: \(delivery.topic))"
        case .deliveryAck(let ack): "DELIVERY_ACK(up to: \(ack.sequence))"
        case .subscribe(let subscribe):
            "SUBSCRIBE(id: \(subscribe.id), channel: \(subscribe.channel), from: \(subscribe.recoverFrom.map { "\($0)" } ?? "the top"))"
        case .subscribed(let subscribed):
            "SUBSCRIBED(id: \(subscribed.id), status: \(subscribed.status), after: \(subscribed.startingAfter), gap: \(subscribed.gap))"
        case .publication(let publication):
            "PUBLICATION(channel: \(publication.channel), at: \(publication.position), \(publication.body.readableBytes) bytes)"
        case .unsubscribe(let unsubscribe): "UNSUBSCRIBE(channel: \(unsubscribe.channel), status: \(unsubscribe.status))"
        case .presence(let presence): "PRESENCE(channel: \(presence.channel), \(presence.kind) \(presence.clientID))"
        case .extension(let ext): "EXTENSION(type: \(ext.type), \(ext.body.readableBytes) bytes)"
        }
    }
}
