import NIOCore
import TetherCore

/// One frame of every type, as used by the codec tests and by PROTOCOL.md's test vectors.
enum SampleFrames {
    static let all: [(name: String, frame: Frame)] = [
        (
            "hello",
            Frame(
                .hello(
                    .init(
                        versions: 1...1,
                        features: .checksum,
                        maxBodySize: 1_048_576,
                        clientID: "alice",
                        authToken: ByteBuffer(string: "secret"),
                        userAgent: "tether/1"
                    )
                ),
                flags: .checksum
            )
        ),
        (
            "welcome",
            Frame(
                .welcome(
                    .init(
                        version: 1,
                        features: .checksum,
                        connectionID: 42,
                        heartbeatInterval: .seconds(10),
                        idleTimeout: .seconds(30),
                        maxBodySize: 1_048_576,
                        maxConcurrentRequests: 512,
                        serverName: "gw1"
                    )
                ),
                flags: .checksum
            )
        ),
        (
            "request",
            Frame(.request(.init(id: 7, method: "echo", timeout: .milliseconds(5000), body: ByteBuffer(string: "hi"))), flags: .checksum)
        ),
        ("response", Frame(.response(.init(id: 7, status: .ok, message: "", body: ByteBuffer(string: "hi"))), flags: .checksum)),
        (
            "response-error",
            Frame(.response(.init(id: 8, status: .unknownMethod, message: "no handler for 'nope'")))
        ),
        ("push", Frame(.push(.init(topic: "room.lobby", body: ByteBuffer(string: "hello all"))), flags: .checksum)),
        ("ping", Frame(.ping(.init(id: 1)))),
        ("pong", Frame(.pong(.init(id: 1)))),
        ("cancel", Frame(.cancel(.init(requestID: 7)), flags: .checksum)),
        (
            "goaway",
            Frame(
                .goAway(.init(reason: .shutdown, retryAfter: .seconds(1), alternateEndpoint: "gw2:7700", message: "restarting")),
                flags: .checksum
            )
        ),
        ("error", Frame(.error(.init(code: .frameTooLarge, message: "too big", relatedID: 0)), flags: .checksum)),
        (
            "hello-resume",
            Frame(
                .hello(
                    .init(
                        versions: 1...1,
                        features: [.checksum, .reliableDelivery],
                        maxBodySize: 65536,
                        clientID: "bob",
                        resume: .init(epoch: 0x0102_0304_0506_0708, lastSequence: 41),
                        outboxEpoch: 0x1112_1314_1516_1718
                    )
                ),
                flags: .checksum
            )
        ),
        (
            "welcome-reliable",
            Frame(
                .welcome(
                    .init(
                        version: 1,
                        features: [.checksum, .reliableDelivery],
                        connectionID: 43,
                        heartbeatInterval: .seconds(10),
                        idleTimeout: .seconds(30),
                        maxBodySize: 1_048_576,
                        maxConcurrentRequests: 512,
                        deliveryEpoch: 0x0102_0304_0506_0708
                    )
                ),
                flags: .checksum
            )
        ),
        (
            "message",
            Frame(
                .message(
                    .init(
                        id: 42,
                        topic: "chat.send",
                        conversation: "room-1",
                        sequence: 3,
                        ttl: .seconds(60),
                        body: ByteBuffer(string: "hi")
                    )
                ),
                flags: .checksum
            )
        ),
        (
            "message-ack",
            Frame(.messageAck(.init(entries: [.init(id: 42), .init(id: 43, status: .invalidRequest)])), flags: .checksum)
        ),
        ("delivery", Frame(.delivery(.init(sequence: 7, topic: "chat.message", body: ByteBuffer(string: "hello"))), flags: .checksum)),
        ("delivery-ack", Frame(.deliveryAck(.init(sequence: 7)), flags: .checksum)),
    ]

    /// Frames that need a negotiated feature: compression, trace context, channels.
    static let negotiated: [(name: String, frame: Frame)] = [
        // With channels negotiated: a subscription recovering after offset 41, its answer
        // (nothing lost), the next publication, a removal, and a presence event.
        (
            "subscribe",
            Frame(
                .subscribe(.init(id: 11, channel: "room.lobby", recoverFrom: ChannelPosition(epoch: 0x0102_0304_0506_0708, offset: 41))),
                flags: .checksum
            )
        ),
        ("subscribed", Frame(.subscribed(.init(id: 11, epoch: 0x0102_0304_0506_0708, startingAfter: 41)), flags: .checksum)),
        (
            "publication",
            Frame(
                .publication(
                    .init(
                        channel: "room.lobby",
                        position: ChannelPosition(epoch: 0x0102_0304_0506_0708, offset: 42),
                        publisher: "alice",
                        body: ByteBuffer(string: "hi")
                    )
                ),
                flags: .checksum
            )
        ),
        (
            "unsubscribe",
            Frame(.unsubscribe(.init(channel: "room.lobby", status: .permissionDenied, message: "not a member")), flags: .checksum)
        ),
        ("presence", Frame(.presence(.init(channel: "room.lobby", kind: .joined, clientID: "bob", info: "Bob")), flags: .checksum)),
        // With compression negotiated: the payload "hello" six times, as raw DEFLATE (zlib level 6).
        (
            "request-compressed",
            Frame(
                .request(
                    .init(
                        id: 9,
                        method: "echo",
                        body: ByteBuffer(bytes: [0xcb, 0x48, 0xcd, 0xc9, 0xc9, 0x57, 0xc8, 0xc0, 0x47, 0x02, 0x00])
                    )
                ),
                flags: [.checksum, .compressed]
            )
        ),
        // With trace context negotiated: a W3C traceparent.
        (
            "request-traced",
            Frame(
                .request(
                    .init(
                        id: 10,
                        method: "echo",
                        body: ByteBuffer(string: "hi"),
                        traceContext: TraceContext(["traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"])
                    )
                ),
                flags: .checksum
            )
        ),
    ]

    /// What the samples decode to, where it is not the sample itself: a COMPRESSED payload is
    /// inflated.
    static let decoded: [String: Frame] = [
        "request-compressed": Frame(
            .request(.init(id: 9, method: "echo", body: ByteBuffer(string: "hello hello hello hello hello hello"))),
            flags: .checksum
        )
    ]

    static func encode(_ frame: Frame) throws -> ByteBuffer {
        var buffer = ByteBuffer()
        try FrameEncoder().encode(frame, into: &buffer)
        return buffer
    }
}

extension ByteBuffer {
    var hexDump: String {
        self.readableBytesView.map { byte in
            let hex = String(byte, radix: 16)
            return byte < 16 ? "0" + hex : hex
        }.joined()
    }

    init(hex: String) {
        let digits = hex.filter { $0.isHexDigit }
        var bytes: [UInt8] = []
        var index = digits.startIndex
        while index < digits.endIndex {
            let next = digits.index(index, offsetBy: 2)
            bytes.append(UInt8(digits[index..<next], radix: 16)!)
            index = next
        }
        self.init(bytes: bytes)
    }
}
