import NIOCore
import Testing

@testable import TetherCore

/// The client connection's machine, event by event, with no channel and no clock.
@Suite("Client connection state machine")
struct ClientConnectionStateMachineTests {
    typealias Machine = ClientConnectionStateMachine

    static let start = TetherInstant(nanoseconds: 1_000_000_000)
    static let hello = Frame.Hello(versions: 1...1, features: .checksum, maxBodySize: 1 << 20, clientID: "alice", outboxEpoch: 5)
    static let foreground = Machine.HeartbeatPreference(mode: .foreground)

    static func welcome(slots: UInt32 = 2, reliable: Bool = false, answers: Bool = false) -> Frame {
        Frame(
            .welcome(
                .init(
                    version: 1,
                    features: reliable
                        ? (answers ? [.checksum, .reliableDelivery, .messageAnswers] : [.checksum, .reliableDelivery]) : .checksum,
                    connectionID: 1,
                    heartbeatInterval: .seconds(10),
                    idleTimeout: .seconds(30),
                    maxBodySize: 1024,
                    maxConcurrentRequests: slots,
                    deliveryEpoch: reliable ? 7 : nil
                )
            ),
            flags: .checksum
        )
    }

    func machine(reliable: Bool = false, failingLink: LinkHealth.Policy? = nil) -> Machine {
        var hello = Self.hello
        if reliable { hello.features.formUnion([.reliableDelivery, .messageAnswers]) }
        return Machine(
            configuration: .init(
                hello: hello,
                handshakeTimeout: .seconds(5),
                heartbeat: HeartbeatPolicy(timeout: .seconds(2), minimumTimeout: .seconds(2)),
                reliability: reliable
                    ? .init(window: 2, retransmission: RTTEstimator(initialTimeout: .seconds(1), minimumTimeout: .seconds(1))) : nil,
                failingLink: failingLink
            )
        )
    }

    func established(slots: UInt32 = 2, reliable: Bool = false, answers: Bool = false, failingLink: LinkHealth.Policy? = nil) -> Machine {
        var machine = self.machine(reliable: reliable, failingLink: failingLink)
        _ = machine.start(now: Self.start)
        _ = machine.received(Self.welcome(slots: slots, reliable: reliable, answers: answers), now: Self.start, preference: Self.foreground)
        return machine
    }

    func request(_ id: UInt64, bytes: Int = 0) -> Frame.Request {
        Frame.Request(id: id, method: "m", body: ByteBuffer(repeating: 0, count: bytes))
    }

    func response(_ id: UInt64, status: StatusCode = .ok, body: String = "") -> Frame {
        Frame(.response(.init(id: id, status: status, body: ByteBuffer(string: body))), flags: .checksum)
    }

    @Test("HELLO once when the channel is active; WELCOME establishes; no WELCOME by the deadline fails the handshake")
    func handshake() {
        var machine = self.machine()
        #expect(machine.start(now: Self.start) == Self.hello)
        #expect(machine.start(now: Self.start) == nil, "once")
        let next66 = machine.nextDeadline()
        #expect(next66 == Self.start + .seconds(5))
        #expect(machine.timerFired(now: Self.start + .seconds(4)).handshakeTimedOut == false, "not yet")
        let due = machine.timerFired(now: Self.start + .seconds(5))
        #expect(due.handshakeTimedOut && due.close != nil)
        #expect(machine.closed(now: Self.start + .seconds(5))?.handshakeFailed == true)

        var other = self.machine()
        _ = other.start(now: Self.start)
        guard case .established(let negotiated) = other.received(Self.welcome(), now: Self.start, preference: Self.foreground) else {
            Issue.record("expected the connection to be established")
            return
        }
        #expect(negotiated.maxConcurrentRequests == 2 && other.acceptsRequests)
        let next80 = other.nextDeadline()
        #expect(next80 == Self.start + .seconds(10), "the heartbeat's, at the gateway's interval; the handshake's is gone")
    }

    @Test("a WELCOME without its checksum, and a frame before WELCOME, break the protocol")
    func handshakeViolations() {
        var machine = self.machine()
        _ = machine.start(now: Self.start)
        var welcome = Self.welcome()
        welcome.flags = []
        guard case .sendErrorAndClose(let error) = machine.received(welcome, now: Self.start, preference: Self.foreground) else {
            Issue.record("expected a violation")
            return
        }
        #expect(error.code == .checksumMismatch)
        #expect(machine.outboundFlags == .checksum, "the closing ERROR carries a checksum")

        var early = self.machine()
        _ = early.start(now: Self.start)
        guard case .sendErrorAndClose(let unexpected) = early.received(self.response(1), now: Self.start, preference: Self.foreground)
        else {
            Issue.record("expected a violation")
            return
        }
        #expect(unexpected.code == .unexpectedFrame)

        // Channels not negotiated: a gateway's channel frames are unexpected, and SUBSCRIBE never
        // comes from a gateway (see `channelFrames`).
        for payload: Frame.Payload in [
            .subscribed(.init(id: 1)),
            .publication(.init(channel: "news")),
            .unsubscribe(.init(channel: "news")),
            .presence(.init(channel: "news", kind: .left, clientID: "bob")),
            .subscribe(.init(id: 1, channel: "news")),
        ] {
            var established = self.established()
            guard
                case .sendErrorAndClose(let refused) = established.received(
                    Frame(payload, flags: .checksum),
                    now: Self.start,
                    preference: Self.foreground
                )
            else {
                Issue.record("\(payload.type) is a violation")
                continue
            }
            #expect(refused.code == .unexpectedFrame, "\(payload.type)")
        }
    }

    @Test(
        "with channels negotiated, SUBSCRIBED, PUBLICATION and UNSUBSCRIBE go to the subscriptions; SUBSCRIBE from a gateway is a violation"
    )
    func channelFrames() {
        func established() -> Machine {
            var hello = Self.hello
            hello.features.insert(.channels)
            var machine = Machine(
                configuration: .init(
                    hello: hello,
                    handshakeTimeout: .seconds(5),
                    heartbeat: HeartbeatPolicy(timeout: .seconds(2), minimumTimeout: .seconds(2))
                )
            )
            _ = machine.start(now: Self.start)
            guard case .welcome(var welcome) = Self.welcome().payload else { preconditionFailure() }
            welcome.features.insert(.channels)
            _ = machine.received(Frame(.welcome(welcome), flags: .checksum), now: Self.start, preference: Self.foreground)
            return machine
        }
        for payload: Frame.Payload in [
            .subscribed(.init(id: 1)), .publication(.init(channel: "news")), .unsubscribe(.init(channel: "news")),
            .presence(.init(channel: "news", kind: .joined, clientID: "bob", info: "B")),
        ] {
            var machine = established()
            guard
                case .channel(let routed) = machine.received(Frame(payload, flags: .checksum), now: Self.start, preference: Self.foreground)
            else {
                Issue.record("\(payload.type) goes to the subscriptions")
                continue
            }
            #expect(routed == payload)
        }
        var machine = established()
        guard
            case .sendErrorAndClose(let refused) = machine.received(
                Frame(.subscribe(.init(id: 1, channel: "news")), flags: .checksum),
                now: Self.start,
                preference: Self.foreground
            )
        else {
            Issue.record("SUBSCRIBE from a gateway is a violation")
            return
        }
        #expect(refused.code == .unexpectedFrame)
    }

    @Test("requests go straight to the wire while slots are free; the rest queue; too large, duplicate and early ones are refused")
    func submit() {
        var early = self.machine()
        #expect(early.submit(self.request(1), deadline: Self.start) == .refuse(.notAccepting), "no request before WELCOME")

        var machine = self.established(slots: 2)
        let deadline = Self.start + .seconds(30)
        #expect(machine.submit(self.request(1), deadline: deadline) == .write)
        #expect(machine.submit(self.request(2), deadline: deadline) == .write)
        #expect(machine.submit(self.request(3), deadline: deadline) == .queued)
        #expect(machine.requestsOnWire == 2)
        #expect(machine.submit(self.request(2), deadline: deadline) == .refuse(.duplicate))
        #expect(machine.submit(self.request(9, bytes: 2000), deadline: deadline) == .refuse(.tooLarge(size: 2007, limit: 1024)))
    }

    @Test("a response completes its request and frees its slot for the next in line; unknown and unsent ids are ignored")
    func responses() {
        var machine = self.established(slots: 1)
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(30))
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(30))
        guard case .none = machine.received(self.response(2), now: Self.start, preference: Self.foreground) else {
            Issue.record("a response to a request never sent is ignored")
            return
        }
        guard case .none = machine.received(self.response(7), now: Self.start, preference: Self.foreground) else {
            Issue.record("a response to an unknown id is ignored")
            return
        }
        guard
            case .complete(let id, let response, let pastDeadline, let send, let close) = machine.received(
                self.response(1, body: "one"),
                now: Self.start,
                preference: Self.foreground
            )
        else {
            Issue.record("expected the request to complete")
            return
        }
        #expect(id == 1 && String(buffer: response.body) == "one" && !pastDeadline)
        #expect(send?.id == 2 && close == nil, "the waiting request takes the slot")
        #expect(machine.requestsOnWire == 1)
    }

    @Test("a deadline exceeded that comes at or after the caller's deadline says so (the handler makes it a timeout)")
    func pastDeadline() {
        var machine = self.established()
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(1))
        guard
            case .complete(_, _, let pastDeadline, _, _) = machine.received(
                self.response(1, status: .deadlineExceeded),
                now: Self.start + .seconds(1),
                preference: Self.foreground
            )
        else {
            Issue.record("expected a completion")
            return
        }
        #expect(pastDeadline)
    }

    @Test("cancel: a sent request gets CANCEL and gives its slot to the next; a queued one just ends; twice does nothing")
    func cancel() {
        var machine = self.established(slots: 1)
        for id in 1...3 { _ = machine.submit(self.request(UInt64(id)), deadline: Self.start + .seconds(30)) }
        guard case .cancelled(let queuedCancel, let queuedSend, _) = machine.cancel(3) else {
            Issue.record("expected the queued request to end")
            return
        }
        #expect(!queuedCancel && queuedSend == nil)
        guard case .cancelled(let sendCancel, let send, _) = machine.cancel(1) else {
            Issue.record("expected the sent request to end")
            return
        }
        #expect(sendCancel && send?.id == 2)
        guard case .none = machine.cancel(1) else {
            Issue.record("cancelling twice does nothing")
            return
        }
    }

    @Test("one timer: each request ends at its own deadline (CANCEL if it was sent); the heartbeat pings, then declares the link dead")
    func timers() {
        var machine = self.established(slots: 1)
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(3))
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(2))
        let next191 = machine.nextDeadline()
        #expect(next191 == Self.start + .seconds(2))
        var due = machine.timerFired(now: Self.start + .seconds(2))
        #expect(due.expired.map(\.id) == [2] && due.expired.map(\.wasSent) == [false], "2 was queued: no CANCEL")
        due = machine.timerFired(now: Self.start + .seconds(3))
        #expect(due.expired.map(\.id) == [1] && due.expired.map(\.wasSent) == [true])
        due = machine.timerFired(now: Self.start + .seconds(10))
        #expect(due.heartbeat == .sendPing(id: 1))
        due = machine.timerFired(now: Self.start + .seconds(12))
        guard case .heartbeatTimeout? = due.close else {
            Issue.record("no answer within the PONG timeout: the link is dead")
            return
        }
        #expect(machine.takeIdleProbeReport()?.answered == false, "an idle probe died waiting")
    }

    @Test(
        "a link that is up but failing: once half of at least 4 requests sent timed out, the connection closes as linkFailing; queued ones do not count"
    )
    func failingLink() throws {
        var machine = self.established(
            slots: 2,
            failingLink: try LinkHealth.Policy(failureRate: 0.5, minimumRequests: 4, window: .seconds(60))
        )
        var now = Self.start
        // Two answered, then timeouts: 1 of 3 is below the minimum, 2 of 4 is failing.
        for id in UInt64(1)...2 {
            _ = machine.submit(self.request(id), deadline: now + .seconds(1))
            _ = machine.received(self.response(id), now: now, preference: Self.foreground)
        }
        _ = machine.submit(self.request(3), deadline: now + .seconds(1))
        _ = machine.submit(self.request(4), deadline: now + .seconds(2))
        _ = machine.submit(self.request(5), deadline: now + .seconds(1))  // queued: both slots are busy
        now = now + .seconds(1)
        var due = machine.timerFired(now: now)
        #expect(Set(due.expired.map(\.id)) == [3, 5])
        #expect(due.close == nil, "1 timed out of 3 sent (5 was queued): below the minimum")
        now = now + .seconds(1)
        due = machine.timerFired(now: now)
        guard case .linkFailing(let timedOut, let total)? = due.close else {
            Issue.record("2 of 4 timed out: failing, got \(String(describing: due.close))")
            return
        }
        #expect(timedOut == 2 && total == 4)
        #expect(!machine.acceptsRequests, "closing")
    }

    @Test("GOAWAY: queued requests end not dispatched, the connection closes once drained; during the handshake it is a refusal")
    func goAway() {
        var machine = self.established(slots: 1)
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(30))
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(30))
        let goAway = Frame(.goAway(.init(reason: .shutdown)), flags: .checksum)
        guard case .goAway(_, let unsent, let close) = machine.received(goAway, now: Self.start, preference: Self.foreground) else {
            Issue.record("expected GOAWAY")
            return
        }
        #expect(unsent == [2] && close == nil, "1 is still in flight")
        #expect(!machine.acceptsRequests)
        #expect(machine.submit(self.request(3), deadline: Self.start + .seconds(30)) == .refuse(.notAccepting))
        guard
            case .complete(_, _, _, let send, let drained) = machine.received(
                self.response(1),
                now: Self.start,
                preference: Self.foreground
            )
        else {
            Issue.record("expected the request to complete")
            return
        }
        guard send == nil, case .goingAway? = drained else {
            Issue.record("drained: close")
            return
        }

        var fresh = self.machine()
        _ = fresh.start(now: Self.start)
        guard case .refused(.goAway) = fresh.received(goAway, now: Self.start, preference: Self.foreground) else {
            Issue.record("expected a refusal")
            return
        }
    }

    @Test("the client drains: closes at once if nothing is in flight, else after the last answer")
    func drain() {
        var idle = self.established()
        guard case .shutdown? = idle.drain() else {
            Issue.record("nothing in flight: close now")
            return
        }
        var busy = self.established()
        _ = busy.submit(self.request(1), deadline: Self.start + .seconds(30))
        #expect(busy.drain() == nil)
        guard case .complete(_, _, _, _, .shutdown?) = busy.received(self.response(1), now: Self.start, preference: Self.foreground) else {
            Issue.record("the last answer closes the drained connection")
            return
        }
    }

    @Test("closing settles everything once: queued requests not dispatched, sent ones lost; no WELCOME is a failed handshake")
    func closed() {
        var machine = self.established(slots: 1)
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(30))
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(30))
        let closed = machine.closed(now: Self.start + .seconds(4))
        #expect(closed?.unsent == [2] && closed?.lost == [1])
        #expect(closed?.handshakeFailed == false && closed?.uptime == .seconds(4))
        #expect(machine.closed(now: Self.start) == nil, "once")

        var fresh = self.machine()
        _ = fresh.start(now: Self.start)
        #expect(fresh.closed(now: Self.start)?.handshakeFailed == true)
    }

    @Test("a violation keeps what was in flight until the channel closes, then ends it as lost")
    func violationSettlesAtClose() {
        var machine = self.established()
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(30))
        guard case .sendErrorAndClose = machine.violation(ProtocolError(code: .protocolError, message: "bad")) else {
            Issue.record("expected ERROR and close")
            return
        }
        guard case .none = machine.received(self.response(1), now: Self.start, preference: Self.foreground) else {
            Issue.record("nothing is read after a violation")
            return
        }
        let closed = machine.closed(now: Self.start)
        #expect(closed?.lost == [1])
        guard case .protocolViolation? = closed?.reason else {
            Issue.record("the reason is the violation")
            return
        }
    }

    @Test("reliable messages: at most a window in flight, each with its retransmission deadline; an acknowledgement frees its place")
    func reliableWindow() {
        var machine = self.established(reliable: true)
        let records = (1...3).map {
            OutboxRecord(id: $0, topic: "t", conversation: "c", sequence: $0, priority: .normal, expiresAt: nil, body: ByteBuffer())
        }
        #expect(machine.enqueueMessages(records) == true)
        #expect(machine.nextMessage(now: Self.start, wallClock: 0)?.0.id == 1)
        #expect(machine.nextMessage(now: Self.start, wallClock: 0)?.0.id == 2)
        #expect(machine.nextMessage(now: Self.start, wallClock: 0) == nil, "the window (2) is full")
        let next299 = machine.nextDeadline()
        #expect(next299 == Self.start + .seconds(1), "the retransmission timeout")
        let ack = Frame(.messageAck(.init(entries: [.init(id: 1)])), flags: .checksum)
        guard case .messagesAcknowledged(let entries) = machine.received(ack, now: Self.start, preference: Self.foreground) else {
            Issue.record("expected an acknowledgement")
            return
        }
        #expect(entries.map(\.id) == [1])
        #expect(machine.nextMessage(now: Self.start, wallClock: 0)?.0.id == 3)
        #expect(machine.timerFired(now: Self.start + .seconds(1)).pumpMessages, "2 and 3 are due again")
        let again = machine.nextMessage(now: Self.start + .seconds(1), wallClock: 0)
        #expect(again?.0.id == 2 && again?.first == false)
    }

    @Test(
        "with the answers feature, an unavailable entry is not final: the message stays in flight and is sent again; without it, it is a refusal"
    )
    func unavailableAnswers() {
        let record = OutboxRecord(id: 1, topic: "t", conversation: "c", sequence: 2, priority: .normal, expiresAt: nil, body: ByteBuffer())
        let notTaken = Frame(.messageAck(.init(entries: [.init(id: 1, status: .unavailable)])), flags: .checksum)

        var machine = self.established(reliable: true, answers: true)
        _ = machine.enqueueMessages([record])
        #expect(machine.nextMessage(now: Self.start, wallClock: 0)?.0.id == 1)
        guard case .messagesAcknowledged(let entries) = machine.received(notTaken, now: Self.start, preference: Self.foreground) else {
            Issue.record("expected an acknowledgement action")
            return
        }
        #expect(entries.isEmpty, "nothing final for the outbox")
        let next328 = machine.nextDeadline()
        #expect(next328 == Self.start + .seconds(1), "still in flight, with its retransmission deadline")
        #expect(machine.timerFired(now: Self.start + .seconds(1)).pumpMessages)
        #expect(machine.nextMessage(now: Self.start + .seconds(1), wallClock: 0)?.0.id == 1, "sent again")

        var old = self.established(reliable: true, answers: false)
        _ = old.enqueueMessages([record])
        _ = old.nextMessage(now: Self.start, wallClock: 0)
        guard case .messagesAcknowledged(let final) = old.received(notTaken, now: Self.start, preference: Self.foreground) else {
            Issue.record("expected an acknowledgement action")
            return
        }
        #expect(final.map(\.status) == [.unavailable], "a gateway without the feature recorded it as the handler's refusal")
    }

    @Test("back in the foreground the link is probed at once; the background interval is as rare as the gateway allows")
    func heartbeatModes() {
        var machine = self.established()
        #expect(machine.heartbeatPreferenceChanged(.init(mode: .background), now: Self.start) == nil)
        let next347 = machine.nextDeadline()
        #expect(next347 == Self.start + .seconds(15), "half the idle timeout")
        #expect(machine.heartbeatPreferenceChanged(Self.foreground, now: Self.start + .seconds(1)) == 1, "a PING now")
    }
}
