public import NIOCore
public import TetherCore

/// How a client reaches a gateway: TCP today; TLS, WebSocket or Network.framework plug in here.
///
/// A transport opens a connection and returns a channel whose pipeline reads and writes bytes:
/// a byte stream (TCP, TLS) or one Tether frame per message (WebSocket), as it tells the
/// initializer. The client installs its one connection handler on top through `initializer`,
/// so the client's logic never depends on the transport.
///
/// Implementations must:
/// - create the channel on `eventLoop`;
/// - call `initializer` on that event loop, after the transport's own handlers, before the
///   channel becomes active or reads anything, with the ``Framing`` the pipeline delivers;
/// - fail with an error if the connection cannot be opened within `timeout`.
public protocol ClientTransport: Sendable {
    /// Opens a connection to `endpoint`.
    /// - Parameters:
    ///   - endpoint: Where to connect.
    ///   - timeout: The longest the connection may take to open.
    ///   - eventLoop: The event loop the channel must use.
    ///   - initializer: Adds the client's handler, given the channel and how its pipeline frames
    ///     Tether's frames; runs on `eventLoop`.
    /// - Returns: The connected channel.
    func connect(
        to endpoint: Endpoint,
        timeout: Duration,
        eventLoop: any EventLoop,
        initializer: @escaping @Sendable (any Channel, Framing) throws -> Void
    ) async throws -> any Channel
}
