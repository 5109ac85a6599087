import AsyncHTTPClient
import Foundation
public import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
public import NIOSSL
public import TetherGateway
import TetherNIO
import TetherNIOTransports

/// Sends HTTP-stream POSTs to the node of a cluster that holds their session, over one pool of
/// kept-alive HTTP/1.1 connections per node (async-http-client).
///
/// A cluster finds the holding node's stream URL; this posts the client's body there with the
/// session's token and proof, and the node that forwards it (`Tether-Forwarded`, so that it is
/// never forwarded again), and returns that node's status and reason to the client.
///
/// ```swift
/// let forwarder = HTTPStreamForwarder()
/// var configuration = try PostgresCluster.Configuration(url: url, name: "node-a")
/// configuration.streamForwarder = forwarder
/// // … run the gateways of this process …
/// try await forwarder.shutdown()
/// ```
public final class HTTPStreamForwarder: ClusterStreamForwarder {
    private let client: HTTPClient
    private let logger: Logger

    /// - Parameters:
    ///   - tls: How to check another node's certificate when its stream URL is `https`; `nil`:
    ///     the system's trusted roots and the URL's host name.
    ///   - logger: Where a node that does not answer is logged.
    public init(tls: TLSConfiguration? = nil, logger: Logger = Logger(label: "tether.cluster.streams")) {
        var configuration = HTTPClient.Configuration(
            tlsConfiguration: tls,
            redirectConfiguration: .disallow,
            timeout: .init(connect: .seconds(5))
        )
        configuration.httpVersion = .http1Only
        self.client = HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton, configuration: configuration)
        self.logger = logger
    }

    public func forward(_ post: ClusterStreamPost, to url: String, timeout: Duration) async -> ClusterStreamAnswer {
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: HTTPStreamBinding.sessionHeader, value: post.token)
        request.headers.add(name: HTTPStreamBinding.proofHeader, value: post.proof)
        request.headers.add(name: HTTPStreamBinding.forwardedHeader, value: String(post.forwardedBy, radix: 16))
        request.headers.add(name: "Content-Type", value: HTTPStreamBinding.contentType)
        request.headers.add(name: "Content-Length", value: "\(post.body.readableBytes)")
        request.body = .bytes(post.body)
        do {
            let response = try await self.client.execute(request, deadline: .now() + TimeAmount(timeout), logger: self.logger)
            var body = try await response.body.collect(upTo: 4096)
            let message = body.readString(length: body.readableBytes)?.trimmingCharacters(in: .whitespacesAndNewlines) ?? ""
            return ClusterStreamAnswer(status: Int(response.status.code), message: message)
        } catch {
            self.logger.warning(
                "the node that holds an HTTP stream did not answer a forwarded POST",
                metadata: ["url": "\(url)", "error": "\(error)"]
            )
            return ClusterStreamAnswer(status: 502, message: "the node that holds this session did not answer")
        }
    }

    /// Closes the connections; call it once the gateways that use this forwarder stopped.
    public func shutdown() async throws {
        try await self.client.shutdown()
    }
}
