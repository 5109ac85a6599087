import Logging
import NIOCore
import TetherCore

/// What a connection's handshake established.
struct EstablishedSession: Sendable {
    var info: ConnectionInfo
    var welcome: Frame.Welcome
    /// The parameters both sides use from now on, as ``Handshake/accept(_:policy:connectionID:)``
    /// computed them.
    var negotiated: Handshake.Negotiated
    /// With reliable delivery: the last delivery the client already has.
    var resume: UInt64?
}

/// How a handshake ended.
enum HandshakeOutcome: Sendable {
    /// Send WELCOME: the connection is established.
    case accepted(EstablishedSession)
    /// Send this frame (ERROR or GOAWAY), then close.
    case refused(Frame.Payload)
    /// The connection closed meanwhile.
    case gone
}

extension GatewayServices {
    /// Negotiates, authenticates and registers the client; the connection's handler sends the
    /// WELCOME or the refusal.
    func handshake(_ hello: Frame.Hello, connectionID: UInt64, remoteAddress: String?, logger: Logger) async -> HandshakeOutcome {
        let welcome: Frame.Welcome
        let negotiated: Handshake.Negotiated
        switch Handshake.accept(hello, policy: self.handshakePolicy, connectionID: connectionID) {
        case .failure(let error):
            logger.info("handshake refused", metadata: ["error": "\(error)"])
            return .refused(.error(.init(code: error.code, message: error.message)))
        case .success(let accepted):
            (welcome, negotiated) = accepted
        }
        if let authenticator = self.authenticator {
            do {
                try await authenticator(
                    HandshakeInfo(
                        clientID: hello.clientID,
                        authToken: hello.authToken,
                        userAgent: hello.userAgent,
                        remoteAddress: remoteAddress
                    )
                )
            } catch {
                let message = (error as? RequestError)?.message ?? "authentication failed"
                logger.info("client refused by the authenticator", metadata: ["client": "\(hello.clientID)", "error": "\(error)"])
                return .refused(.error(.init(code: .unauthenticated, message: message)))
            }
        }
        var resume: UInt64?
        if welcome.features.contains(.reliableDelivery), let store = self.messageStore {
            do {
                let reset = try await self.clientLanes.exclusively(hello.clientID) { lane in
                    let reset = try await store.registerOutbox(client: hello.clientID, epoch: hello.outboxEpoch ?? 0)
                    if reset { lane.lastProcessed = [:] }
                    return reset
                }
                if reset {
                    logger.info("the client has a new outbox; its conversations start again", metadata: ["client": "\(hello.clientID)"])
                }
            } catch {
                logger.error("the message store is unavailable; refusing the connection", metadata: ["error": "\(error)"])
                return .refused(.goAway(.init(reason: .overloaded, retryAfter: .seconds(1), message: "the message store is unavailable")))
            }
            resume = hello.resume.flatMap { $0.epoch == store.epoch ? $0.lastSequence : nil } ?? 0
        }
        guard let info = self.registry.established(connectionID, clientID: hello.clientID, userAgent: hello.userAgent) else {
            return .gone
        }
        return .accepted(EstablishedSession(info: info, welcome: welcome, negotiated: negotiated, resume: resume))
    }
}
