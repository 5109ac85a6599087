// A stand-in for swift-nio-transport-services on Linux, where its real module is empty (its
// sources are behind `#if canImport(Network)`): only the bootstrap API that
// Sources/TetherNIOTransports/Transport/NIOTSClientTransport.swift uses, with the signatures of its
// NIOTSConnectionBootstrap.swift (1.28.0). Type-checking against it catches Swift mistakes.
import Network
import NIOCore

public final class NIOTSConnectionBootstrap {
    public init?(validatingGroup group: any EventLoopGroup) { nil }
    public func channelInitializer(_ handler: @escaping @Sendable (any Channel) -> EventLoopFuture<Void>) -> Self { self }
    public func channelOption<Option: ChannelOption>(_ option: Option, value: Option.Value) -> Self { self }
    public func connectTimeout(_ timeout: TimeAmount) -> Self { self }
    public func tlsOptions(_ options: NWProtocolTLS.Options) -> Self { self }
    public func connect(host: String, port: Int) -> EventLoopFuture<any Channel> { fatalError("a stand-in") }
}
