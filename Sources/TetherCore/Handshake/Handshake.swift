/// Version and feature negotiation (PROTOCOL.md, "Handshake").
///
/// The client offers a version range and features in HELLO; the gateway answers with the
/// highest common version and the common features in WELCOME, or with ERROR
/// ``StatusCode/unsupportedVersion`` and a close.
public enum Handshake {
    /// The protocol versions this implementation speaks.
    public static let supportedVersions: ClosedRange<UInt8> = 1...1

    /// What a gateway offers and requires.
    public struct GatewayPolicy: Sendable, Hashable {
        public var versions: ClosedRange<UInt8>
        /// Features the gateway accepts if the client offers them.
        public var features: Features
        /// Features without which the gateway refuses the client.
        public var requiredFeatures: Features
        public var heartbeatInterval: Duration
        public var idleTimeout: Duration
        public var maxBodySize: UInt32
        public var maxConcurrentRequests: UInt32
        public var serverName: String?
        /// The delivery epoch announced when reliable delivery is negotiated; required then.
        public var deliveryEpoch: UInt64?
        /// The longest client id accepted, in UTF-8 bytes.
        public var maxClientIDLength: Int

        public init(
            versions: ClosedRange<UInt8> = Handshake.supportedVersions,
            features: Features,
            requiredFeatures: Features = [],
            heartbeatInterval: Duration,
            idleTimeout: Duration,
            maxBodySize: UInt32,
            maxConcurrentRequests: UInt32,
            serverName: String? = nil,
            deliveryEpoch: UInt64? = nil,
            maxClientIDLength: Int = Int(UInt16.max)
        ) {
            self.versions = versions
            self.features = features
            self.requiredFeatures = requiredFeatures
            self.heartbeatInterval = heartbeatInterval
            self.idleTimeout = idleTimeout
            self.maxBodySize = maxBodySize
            self.maxConcurrentRequests = maxConcurrentRequests
            self.serverName = serverName
            self.deliveryEpoch = deliveryEpoch
            self.maxClientIDLength = maxClientIDLength
        }
    }

    /// The parameters both sides use after a successful handshake.
    public struct Negotiated: Sendable, Hashable {
        public var version: UInt8
        public var features: Features
        public var connectionID: UInt64
        /// The largest body the *peer* accepts: the limit for frames this side sends.
        public var peerMaxBodySize: Int
        public var heartbeatInterval: Duration
        public var idleTimeout: Duration
        public var maxConcurrentRequests: UInt32
        /// With reliable delivery: the gateway's delivery epoch.
        public var deliveryEpoch: UInt64? = nil

        /// Whether every frame must carry a checksum from now on.
        @inlinable
        public var checksums: Bool { self.features.contains(.checksum) }
    }

    /// The gateway's answer to a HELLO: a WELCOME, or the error to send before closing.
    public static func accept(
        _ hello: Frame.Hello,
        policy: GatewayPolicy,
        connectionID: UInt64
    ) -> Result<(Frame.Welcome, Negotiated), ProtocolError> {
        let lowest = max(hello.versions.lowerBound, policy.versions.lowerBound)
        let highest = min(hello.versions.upperBound, policy.versions.upperBound)
        guard lowest <= highest else {
            return .failure(
                ProtocolError(
                    code: .unsupportedVersion,
                    message: "client speaks versions \(hello.versions.lowerBound)-\(hello.versions.upperBound), "
                        + "gateway speaks \(policy.versions.lowerBound)-\(policy.versions.upperBound)"
                )
            )
        }
        var features = hello.features.intersection(policy.features).intersection(.known)
        if policy.deliveryEpoch == nil { features.remove(.reliableDelivery) }  // cannot offer it without an epoch
        if !features.contains(.reliableDelivery) { features.subtract([.messageAnswers, .sharedDeliveries]) }  // both need it
        guard features.isSuperset(of: policy.requiredFeatures) else {
            let missing = policy.requiredFeatures.subtracting(features)
            return .failure(
                ProtocolError(code: .protocolError, message: "gateway requires features 0x\(String(missing.rawValue, radix: 16))")
            )
        }
        guard !features.contains(.reliableDelivery) || hello.outboxEpoch != nil else {
            return .failure(
                ProtocolError(
                    code: .protocolError,
                    message: "a client with reliable delivery must send its outbox epoch (HELLO tag 0x0005)"
                )
            )
        }
        guard hello.clientID.utf8.count <= policy.maxClientIDLength else {
            return .failure(
                ProtocolError(
                    code: .invalidRequest,
                    message:
                        "the client id has \(hello.clientID.utf8.count) bytes; this gateway accepts at most \(policy.maxClientIDLength)"
                )
            )
        }
        guard !hello.clientID.hasPrefix("$") else {
            return .failure(
                ProtocolError(
                    code: .invalidRequest,
                    message: "client ids starting with $ are reserved for the gateway ('\(hello.clientID.prefix(64))')"
                )
            )
        }
        guard hello.maxBodySize >= UInt32(Self.minimumBodyLimit) else {
            return .failure(
                ProtocolError(
                    code: .protocolError,
                    message: "client's maximum body size \(hello.maxBodySize) is below the minimum \(Self.minimumBodyLimit)"
                )
            )
        }
        let welcome = Frame.Welcome(
            version: highest,
            features: features,
            connectionID: connectionID,
            heartbeatInterval: policy.heartbeatInterval,
            idleTimeout: policy.idleTimeout,
            maxBodySize: policy.maxBodySize,
            maxConcurrentRequests: policy.maxConcurrentRequests,
            serverName: policy.serverName,
            deliveryEpoch: features.contains(.reliableDelivery) ? policy.deliveryEpoch : nil
        )
        let negotiated = Self.gatewayParameters(welcome: welcome, hello: hello)
        return .success((welcome, negotiated))
    }

    /// The parameters the gateway uses after sending `welcome` in answer to `hello`: the same
    /// as the client's, except that the peer's body limit is the client's.
    public static func gatewayParameters(welcome: Frame.Welcome, hello: Frame.Hello) -> Negotiated {
        Negotiated(
            version: welcome.version,
            features: welcome.features,
            connectionID: welcome.connectionID,
            peerMaxBodySize: Int(min(hello.maxBodySize, UInt32(FrameHeader.absoluteMaximumBodySize))),
            heartbeatInterval: welcome.heartbeatInterval,
            idleTimeout: welcome.idleTimeout,
            maxConcurrentRequests: welcome.maxConcurrentRequests,
            deliveryEpoch: welcome.deliveryEpoch
        )
    }

    /// The client's check of a WELCOME against its HELLO.
    /// - Throws: ``ProtocolError`` if the gateway chose what the client did not offer.
    public static func validate(_ welcome: Frame.Welcome, offered hello: Frame.Hello) throws(ProtocolError) -> Negotiated {
        guard hello.versions.contains(welcome.version) else {
            throw ProtocolError(code: .unsupportedVersion, message: "gateway chose version \(welcome.version), which was not offered")
        }
        guard hello.features.isSuperset(of: welcome.features) else {
            throw ProtocolError(code: .protocolError, message: "gateway chose features that were not offered")
        }
        guard welcome.maxBodySize >= UInt32(Self.minimumBodyLimit) else {
            throw ProtocolError(
                code: .protocolError,
                message: "gateway's maximum body size \(welcome.maxBodySize) is below the minimum \(Self.minimumBodyLimit)"
            )
        }
        guard !welcome.features.contains(.reliableDelivery) || welcome.deliveryEpoch != nil else {
            throw ProtocolError(code: .protocolError, message: "gateway chose reliable delivery without a delivery epoch")
        }
        guard welcome.heartbeatInterval > .zero, welcome.idleTimeout > .zero else {
            throw ProtocolError(code: .protocolError, message: "gateway's heartbeat interval and idle timeout must be positive")
        }
        return Negotiated(
            version: welcome.version,
            features: welcome.features,
            connectionID: welcome.connectionID,
            peerMaxBodySize: Int(min(welcome.maxBodySize, UInt32(FrameHeader.absoluteMaximumBodySize))),
            heartbeatInterval: welcome.heartbeatInterval,
            idleTimeout: welcome.idleTimeout,
            maxConcurrentRequests: welcome.maxConcurrentRequests,
            deliveryEpoch: welcome.deliveryEpoch
        )
    }

    /// The smallest body limit a peer may announce (1 KiB).
    public static let minimumBodyLimit = 1024
}
