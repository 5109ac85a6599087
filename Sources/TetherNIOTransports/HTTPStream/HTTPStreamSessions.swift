import NIOConcurrencyHelpers
package import NIOCore
package import NIOHTTP1
import TetherNIO

/// The HTTP streams a gateway serves, by session token, so that a POST arriving on any
/// connection reaches its stream's connection (on that connection's event loop).
///
/// Ended sessions are remembered (up to a bound) so that a late POST gets `410 Gone`, not `404`.
/// In a cluster, tokens name the node that holds their stream, and a POST for another node's
/// session is forwarded to it (``Forwarding``).
package final class HTTPStreamSessions: Sendable {
    /// How a gateway in a cluster reaches the streams of the other nodes.
    package struct Forwarding: Sendable {
        /// What the node holding a stream answered to a forwarded POST.
        package struct Answer: Sendable {
            package var status: HTTPResponseStatus
            /// Its one-line reason (empty for `204`).
            package var message: String

            package init(status: HTTPResponseStatus, message: String) {
                self.status = status
                self.message = message
            }
        }

        /// This node's key, the first 8 bytes of the tokens it makes.
        package var nodeKey: UInt64
        /// Hands a POST's body to the node that holds `token`'s stream (the node whose key the
        /// token starts with, `owner`) with its proof, and returns its answer; `nil` when no node
        /// of the cluster has that key.
        package var forward: @Sendable (_ token: String, _ owner: UInt64, _ body: ByteBuffer, _ proof: String) async -> Answer?

        package init(
            nodeKey: UInt64,
            forward: @escaping @Sendable (_ token: String, _ owner: UInt64, _ body: ByteBuffer, _ proof: String) async -> Answer?
        ) {
            self.nodeKey = nodeKey
            self.forward = forward
        }
    }

    /// What a token names.
    package enum Lookup {
        case live(HTTPStreamSession)
        case ended
        case unknown
    }

    private struct State {
        var live: [String: HTTPStreamSession] = [:]
        var ended: Set<String> = []
        /// `ended` in the order the sessions ended, a ring of `remembered` slots.
        var endedOrder: [String] = []
        var nextSlot = 0
    }

    private let state = TetherLock(State())
    private let remembered: Int
    private let forwarding: Forwarding?

    /// - Parameters:
    ///   - remembered: How many ended sessions to remember.
    ///   - forwarding: In a cluster, how POSTs reach the other nodes' streams.
    package init(remembered: Int, forwarding: Forwarding? = nil) {
        self.remembered = remembered
        self.forwarding = forwarding
    }

    /// A token for a new stream of this gateway.
    package func makeToken() -> String {
        HTTPStreamBinding.makeToken(nodeKey: self.forwarding?.nodeKey)
    }

    /// Where a POST for `token`, a session this gateway does not hold, may be forwarded:
    /// `nil` outside a cluster, and for a token of this node's own (an ended or unknown
    /// session of this node stays unknown).
    package func forwarder(for token: String) -> (@Sendable (ByteBuffer, String) async -> Forwarding.Answer?)? {
        guard let forwarding = self.forwarding, let key = HTTPStreamBinding.nodeKey(of: token), key != forwarding.nodeKey else {
            return nil
        }
        return { body, proof in await forwarding.forward(token, key, body, proof) }
    }

    /// Sessions open now.
    package var liveCount: Int { self.state.withLockedValue { $0.live.count } }

    package func register(_ session: HTTPStreamSession) {
        self.state.withLockedValue { $0.live[session.token] = session }
    }

    /// The stream of `token` ended: later POSTs for it get `410`.
    package func end(_ token: String) {
        let remembered = self.remembered
        self.state.withLockedValue { state in
            guard state.live.removeValue(forKey: token) != nil, remembered > 0 else { return }
            if state.endedOrder.count < remembered {
                state.endedOrder.append(token)
            } else {
                state.ended.remove(state.endedOrder[state.nextSlot])
                state.endedOrder[state.nextSlot] = token
                state.nextSlot = (state.nextSlot + 1) % remembered
            }
            state.ended.insert(token)
        }
    }

    package func lookup(_ token: String) -> Lookup {
        self.state.withLockedValue { state in
            if let session = state.live[token] { return .live(session) }
            return state.ended.contains(token) ? .ended : .unknown
        }
    }
}

/// One HTTP stream: where its POST bodies go.
package final class HTTPStreamSession: Sendable {
    /// What became of a POST body handed to a stream.
    package enum Delivery: Sendable {
        /// The connection read it.
        case accepted
        /// Another POST of the session is still being read.
        case busy
        /// The stream has ended.
        case ended
        /// Its proof does not match: it is not from the stream's reader (or it replays one);
        /// the stream expects its POST number `post`.
        case forbidden(post: UInt64)
    }

    package let token: String
    private let handler: NIOLoopBound<HTTPStreamServerHandler>

    init(token: String, handler: NIOLoopBound<HTTPStreamServerHandler>) {
        self.token = token
        self.handler = handler
    }

    /// Hands `body` to the stream's connection if `proof` shows it comes from the stream's
    /// reader; succeeds once it has been read (or refused).
    package func deliver(_ body: ByteBuffer, proof: String) -> EventLoopFuture<Delivery> {
        let handler = self.handler
        // Over HTTP/2 (and often over HTTP/1.1) the POST arrives on the stream's own event loop.
        if handler.eventLoop.inEventLoop { return handler.value.deliver(body, proof: proof, on: handler.eventLoop) }
        return handler.eventLoop.flatSubmit { handler.value.deliver(body, proof: proof, on: handler.eventLoop) }
    }
}
