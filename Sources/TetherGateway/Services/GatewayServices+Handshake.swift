import Foundation
import Logging
import NIOCore
import TetherCore
import X509

/// What a connection's handshake established.
struct EstablishedSession: Sendable {
    var info: ConnectionInfo
    var welcome: Frame.Welcome
    /// The parameters both sides use from now on, as ``Handshake/accept(_:policy:connectionID:)``
    /// computed them.
    var negotiated: Handshake.Negotiated
    /// With reliable delivery: the last delivery the client already has.
    var resume: UInt64?
    /// With reliable delivery: the client's outbox.
    var outbox: OutboxID?
}

/// How a handshake ended.
enum HandshakeOutcome: Sendable {
    /// Send WELCOME: the connection is established.
    case accepted(EstablishedSession)
    /// Send this frame (ERROR or GOAWAY), then close.
    case refused(Frame.Payload)
}

extension GatewayServices {
    /// Negotiates and authenticates the client; the connection's handler sends the WELCOME (and
    /// registers the connection as established) or the refusal.
    func handshake(
        _ hello: Frame.Hello,
        connectionID: UInt64,
        remoteAddress: String?,
        clientCertificate: Certificate?,
        logger: Logger
    ) async -> HandshakeOutcome {
        let welcome: Frame.Welcome
        let negotiated: Handshake.Negotiated
        switch Handshake.accept(hello, policy: self.handshakePolicy, connectionID: connectionID) {
        case .failure(let error):
            logger.info("handshake refused", metadata: ["error": "\(error)"])
            return .refused(.error(.init(code: error.code, message: error.message)))
        case .success(let accepted):
            (welcome, negotiated) = accepted
        }
        var identity: ClientIdentity?
        if let authenticator = self.authenticator {
            let info = HandshakeInfo(
                clientID: hello.clientID,
                authToken: hello.authToken,
                userAgent: hello.userAgent,
                remoteAddress: remoteAddress,
                clientCertificate: clientCertificate
            )
            switch await Self.authenticate(info, with: authenticator) {
            case .success(let proven):
                identity = proven
            case .failure(let refusal):
                logger.info("client refused by the authenticator", metadata: ["client": "\(hello.clientID)", "error": "\(refusal)"])
                return .refused(.error(.init(code: refusal.status, message: refusal.message)))
            }
        }
        var resume: UInt64?
        var outbox: OutboxID?
        if welcome.features.contains(.reliableDelivery), let store = self.reliable?.store {
            // Handshake.accept refuses a reliable HELLO without an outbox epoch.
            let id = OutboxID(client: hello.clientID, epoch: hello.outboxEpoch ?? 0)
            do {
                try await store.touchOutboxes([id], at: self.clock.wallClockDate)
            } catch {
                logger.error("the message store is unavailable; refusing the connection", metadata: ["error": "\(error)"])
                return .refused(.goAway(.init(reason: .overloaded, retryAfter: .seconds(1), message: "the message store is unavailable")))
            }
            outbox = id
            resume = hello.resume.flatMap { $0.epoch == store.epoch ? $0.lastSequence : nil } ?? 0
        }
        let info = ConnectionInfo(
            id: connectionID,
            clientID: hello.clientID,
            userAgent: hello.userAgent,
            remoteAddress: remoteAddress,
            identity: identity
        )
        return .accepted(EstablishedSession(info: info, welcome: welcome, negotiated: negotiated, resume: resume, outbox: outbox))
    }

    /// Runs the authenticator, and checks that the identity it proves is the one claimed.
    static func authenticate(
        _ info: HandshakeInfo,
        with authenticator: any ClientAuthenticator
    ) async -> Result<
        ClientIdentity, AuthenticationError
    > {
        let identity: ClientIdentity
        do {
            identity = try await authenticator.authenticate(info)
        } catch let error as AuthenticationError {
            return .failure(error)
        } catch {
            return .failure(AuthenticationError(.unauthenticated, "authentication failed"))
        }
        guard identity.clientID == info.clientID else {
            return .failure(
                AuthenticationError(
                    .permissionDenied,
                    "the credentials are those of client '\(identity.clientID)', not of '\(info.clientID)' that the HELLO claims"
                )
            )
        }
        return .success(identity)
    }
}
