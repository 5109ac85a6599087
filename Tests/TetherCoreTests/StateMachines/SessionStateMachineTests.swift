import NIOCore
import Testing

@testable import TetherCore

let sampleHello = Frame.Hello(versions: 1...1, features: .checksum, maxBodySize: 1 << 20, clientID: "alice")
let samplePolicy = Handshake.GatewayPolicy(
    features: .checksum,
    heartbeatInterval: .seconds(10),
    idleTimeout: .seconds(30),
    maxBodySize: 1 << 20,
    maxConcurrentRequests: 64
)

@Suite("Handshake")
struct HandshakeTests {
    @Test("the gateway picks the highest common version and the common features")
    func negotiation() throws {
        var hello = sampleHello
        hello.versions = 1...3
        var policy = samplePolicy
        policy.versions = 1...2
        let (welcome, negotiated) = try Handshake.accept(hello, policy: policy, connectionID: 5).get()
        #expect(welcome.version == 2)
        #expect(welcome.features == .checksum)
        #expect(negotiated.checksums)
        #expect(negotiated.connectionID == 5)
        hello.maxBodySize = 2048
        let (_, gatewayView) = try Handshake.accept(hello, policy: policy, connectionID: 5).get()
        #expect(gatewayView.peerMaxBodySize == 2048, "the gateway's peer is the client")
        #expect(try Handshake.validate(welcome, offered: hello).peerMaxBodySize == 1 << 20, "the client's peer is the gateway")
    }

    @Test("no common version is an unsupported-version error that names both ranges")
    func noCommonVersion() {
        var hello = sampleHello
        hello.versions = 2...3
        guard case .failure(let error) = Handshake.accept(hello, policy: samplePolicy, connectionID: 1) else {
            Issue.record("expected a failure")
            return
        }
        #expect(error.code == .unsupportedVersion)
        #expect(error.message.contains("2-3") && error.message.contains("1-1"))
    }

    @Test("a required feature the client lacks is refused; unknown offered bits are never accepted")
    func features() throws {
        var hello = sampleHello
        hello.features = Features(rawValue: 0x8000_0000)
        var policy = samplePolicy
        policy.features = Features(rawValue: 0xFFFF_FFFF)
        let (welcome, _) = try Handshake.accept(hello, policy: policy, connectionID: 1).get()
        #expect(welcome.features == [])
        policy.requiredFeatures = .checksum
        #expect(throws: ProtocolError.self) { try Handshake.accept(hello, policy: policy, connectionID: 1).get() }
    }

    @Test("a client id longer than the gateway's limit is refused as invalid; one at the limit is accepted")
    func clientIDLength() throws {
        var hello = sampleHello
        var policy = samplePolicy
        policy.maxClientIDLength = 8
        hello.clientID = "ü1234567"  // 9 bytes in UTF-8
        guard case .failure(let error) = Handshake.accept(hello, policy: policy, connectionID: 1) else {
            Issue.record("expected a refusal")
            return
        }
        #expect(error.code == .invalidRequest && error.message.contains("9 bytes") && error.message.contains("at most 8"))
        hello.clientID = "u1234567"
        #expect(throws: Never.self) { try Handshake.accept(hello, policy: policy, connectionID: 1).get() }
    }

    @Test("a client offering reliable delivery without an outbox epoch is refused, where the gateway offers it")
    func reliableNeedsOutboxEpoch() throws {
        var hello = sampleHello
        hello.features = [.checksum, .reliableDelivery]
        var policy = samplePolicy
        policy.features = [.checksum, .reliableDelivery]
        policy.deliveryEpoch = 7
        guard case .failure(let error) = Handshake.accept(hello, policy: policy, connectionID: 1) else {
            Issue.record("expected a refusal")
            return
        }
        #expect(error.code == .protocolError && error.message.contains("outbox epoch"))
        hello.outboxEpoch = 3
        #expect(try Handshake.accept(hello, policy: policy, connectionID: 1).get().0.features.contains(.reliableDelivery))
        hello.outboxEpoch = nil
        policy.deliveryEpoch = nil  // a gateway without reliable delivery ignores the offer
        #expect(try Handshake.accept(hello, policy: policy, connectionID: 1).get().0.features == .checksum)
    }

    @Test("reliable delivery is negotiated only with a delivery epoch; a WELCOME without one is refused")
    func reliableNeedsEpoch() throws {
        var hello = sampleHello
        hello.features = [.checksum, .reliableDelivery]
        hello.outboxEpoch = 1
        var policy = samplePolicy
        policy.features = [.checksum, .reliableDelivery]
        let (plain, _) = try Handshake.accept(hello, policy: policy, connectionID: 1).get()
        #expect(plain.features == .checksum && plain.deliveryEpoch == nil)
        var forged = plain
        forged.features = [.checksum, .reliableDelivery]
        #expect(throws: ProtocolError.self) { try Handshake.validate(forged, offered: hello) }
    }

    @Test("the client rejects a WELCOME that chose what it did not offer")
    func clientValidation() throws {
        let (welcome, _) = try Handshake.accept(sampleHello, policy: samplePolicy, connectionID: 1).get()
        var other = welcome
        other.version = 9
        #expect(throws: ProtocolError.self) { try Handshake.validate(other, offered: sampleHello) }
        other = welcome
        other.features = Features(rawValue: 2)
        #expect(throws: ProtocolError.self) { try Handshake.validate(other, offered: sampleHello) }
        other = welcome
        other.maxBodySize = 10
        #expect(throws: ProtocolError.self) { try Handshake.validate(other, offered: sampleHello) }
        #expect(try Handshake.validate(welcome, offered: sampleHello).peerMaxBodySize == 1 << 20)
    }
}

@Suite("Client session state machine")
struct ClientSessionStateMachineTests {
    func makeEstablished(checksums: Bool = true) throws -> ClientSessionStateMachine {
        var machine = ClientSessionStateMachine(hello: sampleHello)
        var policy = samplePolicy
        if !checksums { policy.features = [] }
        let (welcome, negotiated) = try Handshake.accept(sampleHello, policy: policy, connectionID: 1).get()
        #expect(machine.received(Frame(.welcome(welcome), flags: .checksum)) == .established(negotiated))
        return machine
    }

    @Test("before WELCOME only WELCOME, ERROR, GOAWAY, PING and extensions are allowed")
    func beforeWelcome() {
        let forbidden: [Frame.Payload] = [
            .response(.init(id: 1)), .push(.init(topic: "t")), .pong(.init(id: 1)), .request(.init(id: 1, method: "m")),
            .cancel(.init(requestID: 1)), .hello(sampleHello),
        ]
        for payload in forbidden {
            var machine = ClientSessionStateMachine(hello: sampleHello)
            guard case .violation(let error) = machine.received(Frame(payload, flags: .checksum)) else {
                Issue.record("\(payload) must be a violation before WELCOME")
                continue
            }
            #expect(error.code == .unexpectedFrame)
            #expect(machine.phase == .closed)
        }
        var machine = ClientSessionStateMachine(hello: sampleHello)
        #expect(machine.received(Frame(.ping(.init(id: 3)))) == .replyPong(.init(id: 3)))
        let report = Frame.ErrorReport(code: .unauthenticated, message: "bad token")
        #expect(machine.received(Frame(.error(report))) == .peerError(report))
    }

    @Test("a WELCOME without a checksum is refused")
    func welcomeNeedsChecksum() throws {
        var machine = ClientSessionStateMachine(hello: sampleHello)
        let (welcome, _) = try Handshake.accept(sampleHello, policy: samplePolicy, connectionID: 1).get()
        guard case .violation(let error) = machine.received(Frame(.welcome(welcome))) else {
            Issue.record("expected a violation")
            return
        }
        #expect(error.code == .checksumMismatch)
    }

    @Test("after WELCOME, frames are routed by type and checksums are enforced when negotiated")
    func established() throws {
        var machine = try self.makeEstablished()
        #expect(machine.outboundFlags == .checksum)
        #expect(machine.acceptsRequests)
        let response = Frame.Response(id: 1, body: ByteBuffer(string: "x"))
        #expect(machine.received(Frame(.response(response), flags: .checksum)) == .response(response))
        #expect(machine.received(Frame(.push(.init(topic: "t")), flags: .checksum)) == .push(.init(topic: "t")))
        #expect(machine.received(Frame(.pong(.init(id: 2)), flags: .checksum)) == .pong(.init(id: 2)))
        #expect(
            machine.received(Frame(.extension(.init(type: FrameType(rawValue: 0xF0))), flags: .checksum)) == .ignore
        )
        guard case .violation(let error) = machine.received(Frame(.response(response))) else {
            Issue.record("a frame without the negotiated checksum must be a violation")
            return
        }
        #expect(error.code == .checksumMismatch)
    }

    @Test("without negotiated checksums, frames without one are fine")
    func noChecksums() throws {
        var machine = try self.makeEstablished(checksums: false)
        #expect(machine.outboundFlags == [])
        #expect(machine.received(Frame(.push(.init(topic: "t")))) == .push(.init(topic: "t")))
    }

    @Test("GOAWAY drains: no new requests, responses still arrive")
    func goAway() throws {
        var machine = try self.makeEstablished()
        let goAway = Frame.GoAway(reason: .shutdown)
        #expect(machine.received(Frame(.goAway(goAway), flags: .checksum)) == .goAway(goAway))
        #expect(!machine.acceptsRequests)
        #expect(machine.received(Frame(.response(.init(id: 1)), flags: .checksum)) == .response(.init(id: 1)))
    }

    @Test("reliable-delivery frames are allowed only when the feature was negotiated, and only gateway to client")
    func reliableFramesOnClient() throws {
        let ack = Frame.MessageAck(entries: [.init(id: 1)])
        let delivery = Frame.Delivery(sequence: 1, topic: "t")
        var plain = try self.makeEstablished()
        guard case .violation(let error) = plain.received(Frame(.delivery(delivery), flags: .checksum)) else {
            Issue.record("DELIVERY without the feature must be a violation")
            return
        }
        #expect(error.code == .unexpectedFrame)

        var hello = sampleHello
        hello.features = [.checksum, .reliableDelivery]
        hello.outboxEpoch = 1
        var policy = samplePolicy
        policy.features = [.checksum, .reliableDelivery]
        policy.deliveryEpoch = 77
        let (welcome, _) = try Handshake.accept(hello, policy: policy, connectionID: 1).get()
        #expect(welcome.deliveryEpoch == 77)
        var reliable = ClientSessionStateMachine(hello: hello)
        guard case .established = reliable.received(Frame(.welcome(welcome), flags: .checksum)) else {
            Issue.record("expected the handshake to complete")
            return
        }
        #expect(reliable.received(Frame(.messageAck(ack), flags: .checksum)) == .messageAck(ack))
        #expect(reliable.received(Frame(.delivery(delivery), flags: .checksum)) == .delivery(delivery))
        guard case .violation = reliable.received(Frame(.deliveryAck(.init(sequence: 1)), flags: .checksum)) else {
            Issue.record("DELIVERY_ACK goes client to gateway only")
            return
        }
    }

    @Test("a gateway may not send client frames")
    func clientFramesFromGateway() throws {
        for payload: Frame.Payload in [.request(.init(id: 1, method: "m")), .cancel(.init(requestID: 1)), .hello(sampleHello)] {
            var machine = try self.makeEstablished()
            guard case .violation = machine.received(Frame(payload, flags: .checksum)) else {
                Issue.record("\(payload) must be a violation")
                continue
            }
        }
    }
}

@Suite("Gateway session state machine")
struct GatewaySessionStateMachineTests {
    func makeEstablished() throws -> GatewaySessionStateMachine {
        var machine = GatewaySessionStateMachine()
        #expect(machine.received(Frame(.hello(sampleHello), flags: .checksum)) == .forwardHello(sampleHello))
        let (_, negotiated) = try Handshake.accept(sampleHello, policy: samplePolicy, connectionID: 1).get()
        machine.welcomeSent(negotiated)
        return machine
    }

    @Test("the first frame must be a checksummed HELLO")
    func firstFrame() {
        var machine = GatewaySessionStateMachine()
        guard case .violation(let error) = machine.received(Frame(.ping(.init(id: 1)))) else {
            Issue.record("expected a violation")
            return
        }
        #expect(error.code == .unexpectedFrame)
        var unchecked = GatewaySessionStateMachine()
        guard case .violation(let checksumError) = unchecked.received(Frame(.hello(sampleHello))) else {
            Issue.record("expected a violation")
            return
        }
        #expect(checksumError.code == .checksumMismatch)
    }

    @Test("nothing but ERROR (or a stray PONG) may arrive while the gateway negotiates")
    func negotiating() {
        var machine = GatewaySessionStateMachine()
        _ = machine.received(Frame(.hello(sampleHello), flags: .checksum))
        #expect(machine.received(Frame(.pong(.init(id: 1)), flags: .checksum)) == .ignore)
        guard case .violation = machine.received(Frame(.request(.init(id: 1, method: "m")), flags: .checksum)) else {
            Issue.record("expected a violation")
            return
        }
    }

    @Test("requests and cancels are passed to the connection, which tracks the requests in flight")
    func requests() throws {
        var machine = try self.makeEstablished()
        let request = Frame.Request(id: 1, method: "m")
        #expect(machine.received(Frame(.request(request), flags: .checksum)) == .forwardRequest(request))
        #expect(machine.received(Frame(.cancel(.init(requestID: 9)), flags: .checksum)) == .cancelRequest(.init(requestID: 9)))
    }

    @Test("draining refuses new requests, still passes cancels on, and leaves closing to the client")
    func draining() throws {
        var machine = try self.makeEstablished()
        _ = machine.received(Frame(.request(.init(id: 1, method: "m")), flags: .checksum))
        _ = machine.received(Frame(.request(.init(id: 2, method: "m")), flags: .checksum))
        #expect(machine.drain() == .sendGoAway)
        #expect(machine.drain() == .none)
        guard case .refuseRequest(let refusal) = machine.received(Frame(.request(.init(id: 3, method: "m")), flags: .checksum)) else {
            Issue.record("expected a refusal")
            return
        }
        #expect(refusal.id == 3 && refusal.status == .unavailable)
        #expect(machine.received(Frame(.cancel(.init(requestID: 2)), flags: .checksum)) == .cancelRequest(.init(requestID: 2)))
        #expect(
            machine.received(Frame(.ping(.init(id: 1)), flags: .checksum)) == .replyPong(.init(id: 1)),
            "still alive until the client closes"
        )
    }

    @Test("draining a connection still in its handshake sends GOAWAY and closes at once")
    func drainDuringHandshake() throws {
        var fresh = GatewaySessionStateMachine()
        #expect(fresh.drain() == .sendGoAwayAndClose)
        #expect(fresh.phase == .closed)
        var negotiating = GatewaySessionStateMachine()
        _ = negotiating.received(Frame(.hello(sampleHello), flags: .checksum))
        #expect(negotiating.drain() == .sendGoAwayAndClose)
    }

    @Test("reliable messages are forwarded only with the feature; while draining they are ignored, acks still count")
    func reliableFramesOnGateway() throws {
        let message = Frame.Message(id: 1, topic: "t", conversation: "c", sequence: 1)
        var plain = try self.makeEstablished()
        guard case .violation = plain.received(Frame(.message(message), flags: .checksum)) else {
            Issue.record("MESSAGE without the feature must be a violation")
            return
        }
        var hello = sampleHello
        hello.features = [.checksum, .reliableDelivery]
        hello.outboxEpoch = 1
        var policy = samplePolicy
        policy.features = [.checksum, .reliableDelivery]
        policy.deliveryEpoch = 77
        let (_, negotiated) = try Handshake.accept(hello, policy: policy, connectionID: 1).get()
        var machine = GatewaySessionStateMachine()
        _ = machine.received(Frame(.hello(hello), flags: .checksum))
        machine.welcomeSent(negotiated)
        #expect(machine.received(Frame(.message(message), flags: .checksum)) == .forwardMessage(message))
        #expect(machine.received(Frame(.deliveryAck(.init(sequence: 3)), flags: .checksum)) == .forwardDeliveryAck(.init(sequence: 3)))
        _ = machine.drain()
        #expect(machine.received(Frame(.message(message), flags: .checksum)) == .ignore)
        #expect(machine.received(Frame(.deliveryAck(.init(sequence: 4)), flags: .checksum)) == .forwardDeliveryAck(.init(sequence: 4)))
        guard case .violation = machine.received(Frame(.delivery(.init(sequence: 1, topic: "t")), flags: .checksum)) else {
            Issue.record("DELIVERY goes gateway to client only")
            return
        }
    }

    @Test("a client may not send gateway frames")
    func gatewayFramesFromClient() throws {
        let payloads: [Frame.Payload] = [
            .response(.init(id: 1)), .push(.init(topic: "t")), .goAway(.init(reason: .shutdown)), .hello(sampleHello),
        ]
        for payload in payloads {
            var machine = try self.makeEstablished()
            guard case .violation(let error) = machine.received(Frame(payload, flags: .checksum)) else {
                Issue.record("\(payload) must be a violation")
                continue
            }
            #expect(error.code == .unexpectedFrame)
        }
    }
}
