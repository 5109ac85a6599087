// A stand-in for Network.framework on Linux: only the API that
// Sources/Tether/NWPathNetworkMonitor.swift and Sources/TetherNIOTransports/Transport/NIOTSClientTransport.swift
// use, declared as Apple documents it (https://developer.apple.com/documentation/network/nwpathmonitor,
// .../nwprotocoltls, .../nwerror). CI type-checks those files against it (see
// check-apple-sources), so that a Swift mistake there is caught before an Apple build meets
// it. It proves nothing about the real SDK beyond these declarations.
import Dispatch

#if WITH_SECURITY
    import Security

    public final class NWProtocolTLS {
        public final class Options {
            public init() {}
            public var securityProtocolOptions: sec_protocol_options_t { sec_protocol_options_t() }
        }
    }

    public enum NWError: Error {
        case posix(Int32)
        case dns(Int32)
        case tls(OSStatus)
    }
#endif

public struct NWInterface: Sendable {
    public enum InterfaceType: Sendable { case other, wifi, cellular, wiredEthernet, loopback }
    public let type: InterfaceType
    public let name: String
}

public enum NWEndpoint: Sendable, CustomStringConvertible {
    case hostPort(host: String, port: UInt16)
    public var description: String { "" }
}

public struct NWPath: Sendable {
    public enum Status: Sendable { case satisfied, unsatisfied, requiresConnection }
    public let status: Status
    public let availableInterfaces: [NWInterface]
    @available(macOS 10.15, iOS 13.0, tvOS 13.0, watchOS 6.0, *)
    public var gateways: [NWEndpoint] { [] }
}

public final class NWPathMonitor {
    public init() {}
    #if SENDABLE_HANDLER
        public var pathUpdateHandler: (@Sendable (NWPath) -> Void)?
    #else
        @preconcurrency public var pathUpdateHandler: ((NWPath) -> Void)?
    #endif
    public func start(queue: DispatchQueue) {}
    public func cancel() {}
}
