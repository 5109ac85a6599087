import Foundation
import PostgresNIO
public import TetherGateway

// HTTP-stream POSTs that reach a node which does not hold their stream: sent to the node that
// does, found by the stream key the session's token starts with, by the configuration's
// `streamForwarder`.
extension PostgresCluster {
    /// Forwards `post` to the node whose stream key its token names, and returns that node's
    /// answer; `nil` when no live node has that key.
    public func forwardStreamPost(_ post: ClusterStreamPost) async -> ClusterStreamAnswer? {
        guard let forwarder = self.configuration.streamForwarder else {
            return ClusterStreamAnswer(
                status: 502,
                message: "this node does not forward HTTP-stream POSTs to the node that holds the session (no stream forwarder)"
            )
        }
        var (joined, url) = self.state.withLockedValue { ($0.node != nil, $0.streamURLs[post.nodeKey]) }
        guard joined else {
            return ClusterStreamAnswer(status: 502, message: "this node is not in its cluster now: try again")
        }
        if url == nil {
            // A node that joined since the last heartbeat; or no node (a forged or stale token).
            url = try? await self.streamURL(ofKey: post.nodeKey)
        }
        guard let url else { return nil }
        return await forwarder.forward(post, to: url, timeout: self.configuration.streamForwardTimeout)
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
}
