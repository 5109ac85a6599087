import AsyncHTTPClient
import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import PostgresNIO
public import TetherGateway
import TetherNIO

// HTTP-stream POSTs that reach a node which does not hold their stream: forwarded to the node
// that does, found by the stream key the session's token starts with.
extension PostgresCluster {
    /// Forwards `post` to the node whose stream key its token names, and returns that node's
    /// answer; `nil` when no live node has that key.
    public func forwardStreamPost(_ post: ClusterStreamPost) async -> ClusterStreamAnswer? {
        let (forwarder, known) = self.state.withLockedValue { ($0.forwarder, $0.streamURLs[post.nodeKey]) }
        guard let forwarder else {
            return ClusterStreamAnswer(status: 502, message: "this node is not in its cluster now: try again")
        }
        var url = known
        if url == nil {
            // A node that joined since the last heartbeat; or no node (a forged or stale token).
            url = try? await self.streamURL(ofKey: post.nodeKey)
        }
        guard let url else { return nil }
        var request = HTTPClientRequest(url: url)
        request.method = .POST
        request.headers.add(name: HTTPStreamBinding.sessionHeader, value: post.token)
        request.headers.add(name: HTTPStreamBinding.proofHeader, value: post.proof)
        request.headers.add(name: HTTPStreamBinding.forwardedHeader, value: String(post.forwardedBy, radix: 16))
        request.headers.add(name: "Content-Type", value: HTTPStreamBinding.contentType)
        request.headers.add(name: "Content-Length", value: "\(post.body.readableBytes)")
        request.body = .bytes(post.body)
        do {
            let timeout = TimeAmount(self.configuration.streamForwardTimeout)
            let response = try await forwarder.execute(request, deadline: .now() + timeout, logger: self.logger)
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

    /// The stream URL of the live node with stream key `key`.
    func streamURL(ofKey key: UInt64) async throws -> String? {
        var url: String?
        for value in try await self.query(
            """
            SELECT stream_url FROM tether_nodes
            WHERE stream_key = \(Int64(bitPattern: key)) AND stream_url IS NOT NULL
                AND seen_at > now() - make_interval(secs => \(Self.seconds(self.configuration.nodeTimeout)))
            """
        ).map({ try $0.decode(String.self) }) {
            url = value
        }
        return url
    }

    /// The HTTP client of the forwarded POSTs: one pool of kept-alive connections per node.
    func makeForwarder() -> HTTPClient {
        var configuration = HTTPClient.Configuration(
            tlsConfiguration: self.configuration.streamForwardTLS,
            redirectConfiguration: .disallow,
            timeout: .init(connect: .seconds(5))
        )
        configuration.httpVersion = .http1Only
        return HTTPClient(eventLoopGroup: MultiThreadedEventLoopGroup.singleton, configuration: configuration)
    }
}
