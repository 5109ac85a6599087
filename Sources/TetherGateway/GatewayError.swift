/// An error of the gateway's own API (not of a request).
public struct GatewayError: Error, Hashable, Sendable, CustomStringConvertible {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        enum Wrapped: Hashable, Sendable {
            case invalidConfiguration, bindFailed, notListening, notRunning, alreadyRunning, invalidArgument, storage, quotaExceeded,
                disabled
        }
        let wrapped: Wrapped

        /// The configuration is invalid.
        public static let invalidConfiguration = Code(wrapped: .invalidConfiguration)
        /// The listening socket could not be bound.
        public static let bindFailed = Code(wrapped: .bindFailed)
        /// The gateway is not listening on TCP (none configured, or not any more).
        public static let notListening = Code(wrapped: .notListening)
        /// The gateway is shut down.
        public static let notRunning = Code(wrapped: .notRunning)
        /// ``Gateway/run()`` was called twice.
        public static let alreadyRunning = Code(wrapped: .alreadyRunning)
        /// An argument was invalid, for example an empty push topic.
        public static let invalidArgument = Code(wrapped: .invalidArgument)
        /// The message store failed.
        public static let storage = Code(wrapped: .storage)
        /// A recipient has its quota of deliveries waiting (``GatewayConfiguration/Limits-swift.struct/maxDeliveriesPerRecipient``).
        public static let quotaExceeded = Code(wrapped: .quotaExceeded)
        /// What was asked for is turned off in the configuration (channels, when
        /// ``GatewayConfiguration/channels`` is `nil`).
        public static let disabled = Code(wrapped: .disabled)

        public var description: String { "\(self.wrapped)" }
    }

    public var code: Code
    public var message: String

    public init(code: Code, message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(self.code): \(self.message)" }
}
