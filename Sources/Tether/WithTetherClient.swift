public import Foundation
public import Logging
public import NIOCore
public import TetherCore
public import TetherNIO
public import TetherNIOTransports

/// Runs a client for as long as `body` runs: connects (and reconnects) in the background, then
/// shuts the client down gracefully when `body` returns or throws, and returns once it has.
///
/// Requests made in `body` before the first connection wait for it, up to their deadline.
///
/// ```swift
/// let configuration = try ClientConfiguration(endpoints: ["gw.example.com:7700"], clientID: "alice")
/// let reply = try await withTetherClient(configuration) { client in
///     try await client.request("echo", body: ByteBuffer(string: "hi"))
/// }
/// ```
/// - Parameters:
///   - configuration: Endpoints, identity, timeouts, heartbeat and backoff.
///   - transport: How to reach the gateway; TCP by default.
///   - eventLoopGroup: Where the connection's I/O runs; NIO's shared group if `nil`.
///   - clock: The clock of the run loop (backoff, racing, endpoint penalties).
///   - logger: Where the client logs.
///   - body: What to do with the client.
/// - Returns: What `body` returned.
/// - Throws: What `body` threw; ``TetherError`` if the configuration is invalid, or if the
///   client gave up connecting (``TetherError/Code/notConnected``).
public func withTetherClient<Result: Sendable>(
    _ configuration: ClientConfiguration,
    transport: any ClientTransport = TCPClientTransport(),
    eventLoopGroup: (any EventLoopGroup)? = nil,
    clock: any TetherClock = SystemClock(),
    logger: Logger = Logger(label: "tether.client"),
    _ body: (TetherClient) async throws -> Result
) async throws -> Result {
    let client = try TetherClient(
        configuration: configuration,
        transport: transport,
        eventLoopGroup: eventLoopGroup,
        clock: clock,
        logger: logger
    )
    return try await withThrowingTaskGroup(of: Void.self, returning: Result.self) { group in
        group.addTask { try await client.run() }
        let result: Result
        do {
            result = try await body(client)
        } catch {
            client.shutdown()
            try? await group.waitForAll()
            throw error
        }
        client.shutdown()
        try await group.waitForAll()
        return result
    }
}

extension Endpoint {
    /// The endpoint a `tether://host:port` URL names.
    ///
    /// ```swift
    /// let endpoint = try Endpoint(url: URL(string: "tether://gw.example.com:7700")!)
    /// ```
    /// - Throws: ``EndpointParseError`` if the URL is not of that form.
    public init(url: URL) throws(EndpointParseError) {
        try self.init(parsing: url.absoluteString)
    }
}
