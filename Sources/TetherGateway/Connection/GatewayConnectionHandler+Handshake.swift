import Foundation
import NIOCore
import NIOSSL
import TetherCompression
import TetherCore
import X509

extension GatewayConnectionHandler {
    /// HELLO arrived: a task negotiates and authenticates; the handler then sends the WELCOME
    /// or the refusal.
    func startHandshake(_ hello: Frame.Hello) {
        guard let context = self.context else { return }
        let services = self.services
        let id = self.id
        let logger = self.logger
        let handle = self.handle
        let remoteAddress = context.channel.remoteAddress?.description
        let clientCertificate = Self.clientCertificate(of: context.channel)
        self.machine.taskStarted()
        self.spawn {
            let outcome = await services.handshake(
                hello,
                connectionID: id,
                remoteAddress: remoteAddress,
                clientCertificate: clientCertificate,
                logger: logger
            )
            handle.execute { $0.handshakeFinished(outcome) }
        }
    }

    /// The certificate the client presented in its TLS handshake, if the connection is TLS.
    private static func clientCertificate(of channel: any Channel) -> Certificate? {
        guard let tls = try? channel.pipeline.syncOperations.handler(type: NIOSSLServerHandler.self),
            let certificate = tls.peerCertificate,
            let der = try? certificate.toDERBytes()
        else { return nil }
        return try? Certificate(derEncoded: der)
    }

    private func handshakeFinished(_ outcome: HandshakeOutcome) {
        defer { self.taskEnded() }
        let now = self.services.clock.now
        switch outcome {
        case .accepted(let session):
            self.services.metrics.handshake("ok")
            self.established(session, now: now)
        case .refused(let payload):
            self.services.metrics.handshake(payload.closeCode)
            if self.machine.handshakeRefused(payload, now: now) { self.writeAndClose(payload, settle: []) }
        }
    }

    /// The handshake succeeded: WELCOME, then the connection takes pushes, requests and, if
    /// negotiated, reliable messages.
    private func established(_ session: EstablishedSession, now: TetherInstant) {
        let established = GatewayConnectionStateMachine.Established(
            negotiated: session.negotiated,
            credentialsDeadline: self.credentialsDeadline(of: session.info.identity, now: now),
            resume: session.resume
        )
        guard self.context != nil, case .some(let pumpStart) = self.machine.handshakeSucceeded(established, now: now) else {
            return  // the connection closed meanwhile
        }
        if var ticket = self.admitted {
            self.services.admission.authenticated(&ticket)
            self.admitted = ticket
        }
        self.pushes?.drain()
        self.write(.welcome(session.welcome), flags: .checksum)  // the WELCOME carries one, whatever was negotiated
        self.io.maxInboundBodySize = self.services.configuration.limits.maxBodySize
        self.io.acceptsTraceContext = session.negotiated.features.contains(.traceContext)
        if session.negotiated.features.contains(.compression), let compression = self.services.configuration.compression {
            do {
                self.io.compression = try compression.makeCodecs()
            } catch {
                self.logger.error("cannot set up compression; closing the connection", metadata: ["error": "\(error)"])
                self.closeNow()
                return
            }
        }
        self.scope = self.scope(of: session.info)
        self.services.registry.established(session.info)  // pushes reach it from now on, after the WELCOME
        self.flushNow()
        if let outbox = session.outbox, let reliable = self.services.reliable {
            self.lane = (outbox, reliable.lanes.checkOut(outbox))
        }
        if let pumpStart { self.pump(pumpStart) }
        self.armTimer(now: now)
        self.logger.debug(
            "client connected",
            metadata: ["client": "\(session.info.clientID)", "remote": "\(session.info.remoteAddress ?? "-")"]
        )
    }

    /// What the requests of `connection` share, with whether its accesses must be checked.
    func scope(of connection: ConnectionInfo) -> ConnectionScope {
        ConnectionScope(
            connection: connection,
            logger: self.baseLogger,
            services: self.services,
            checksAccess: self.services.router.checksAccess(of: connection)
        )
    }

    /// When the connection must end for `identity`'s credentials: their expiry plus the grace
    /// period. The expiry is on the wall clock; the connection's deadlines on the gateway's clock.
    func credentialsDeadline(of identity: ClientIdentity?, now: TetherInstant) -> TetherInstant? {
        identity?.expiresAt.map { expiresAt in
            let remaining = Int64(expiresAt.timeIntervalSince1970 * 1000) - self.services.clock.wallClockMilliseconds
            return now + .milliseconds(max(0, remaining)) + self.services.configuration.timeouts.credentialGrace
        }
    }

    /// The client refreshed its credentials on the connection (`$auth`).
    func credentialsReplaced(_ identity: ClientIdentity) {
        guard let scope = self.scope else { return }
        var connection = scope.connection
        connection.identity = identity
        self.scope = self.scope(of: connection)
        self.services.registry.replaceIdentity(of: connection.id, with: identity)
        let now = self.services.clock.now
        self.machine.credentialsReplaced(deadline: self.credentialsDeadline(of: identity, now: now))
        self.armTimer(now: now)
    }

    /// The application set when the connection's credentials expire
    /// (``Gateway/refreshCredentials(client:expiresAt:)``): its identity, with that expiry.
    func credentialsExpire(at expiresAt: Date) {
        guard let connection = self.scope?.connection else { return }
        var identity = connection.identity ?? ClientIdentity(clientID: connection.clientID)
        identity.expiresAt = expiresAt
        self.credentialsReplaced(identity)
    }

    // MARK: Tasks

    /// Starts one of the connection's tasks on its executor.
    /// - Parameter immediately: Run it on this thread until it first suspends (`Task.immediate`);
    ///   only when the executor is this loop's.
    @discardableResult
    func spawn(immediately: Bool = false, _ body: @escaping @Sendable () async -> Void) -> Task<Void, Never> {
        #if compiler(>=6.2)
            if immediately, #available(macOS 26.0, iOS 26.0, tvOS 26.0, watchOS 26.0, *) {
                return Task.immediate(executorPreference: self.executor, operation: body)
            }
        #endif
        return Task(executorPreference: self.executor, operation: body)
    }
}
