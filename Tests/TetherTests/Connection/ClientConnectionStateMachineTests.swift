import NIOConcurrencyHelpers
import NIOCore
import Testing

@testable import Tether
@testable import TetherCore

/// The client connection's machine, event by event, with no channel and no clock.
@Suite("Client connection state machine")
struct ClientConnectionStateMachineTests {
    typealias Machine = ClientConnectionHandler.StateMachine

    static let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
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

    func machine(reliable: Bool = false) -> Machine {
        var hello = Self.hello
        if reliable { hello.features.formUnion([.reliableDelivery, .messageAnswers]) }
        return Machine(
            configuration: .init(
                hello: hello,
                handshakeTimeout: .seconds(5),
                heartbeat: try! .init(timeout: .seconds(2), minimumTimeout: .seconds(2), jitter: 0, suspensionThreshold: nil),
                reliability: reliable
                    ? (window: 2, retransmission: RTTEstimator(initialTimeout: .seconds(1), minimumTimeout: .seconds(1))) : nil
            )
        )
    }

    func established(slots: UInt32 = 2, reliable: Bool = false, answers: Bool = false) -> Machine {
        var machine = self.machine(reliable: reliable)
        _ = machine.start(now: Self.start)
        _ = machine.received(Self.welcome(slots: slots, reliable: reliable, answers: answers), now: Self.start, preference: Self.foreground)
        return machine
    }

    /// A waiter that records what it got.
    final class Outcome: Sendable {
        private let result = NIOLockedValueBox<Result<ByteBuffer, TetherError>?>(nil)
        var waiter: ResponseWaiter { .callback { result in self.result.withLockedValue { $0 = result } } }
        var error: TetherError? {
            guard case .failure(let error)? = self.result.withLockedValue({ $0 }) else { return nil }
            return error
        }
        var body: String? {
            guard case .success(let body)? = self.result.withLockedValue({ $0 }) else { return nil }
            return String(buffer: body)
        }
    }

    func request(_ id: UInt64, bytes: Int = 0) -> Frame.Request {
        Frame.Request(id: id, method: "m", body: ByteBuffer(repeating: 0, count: bytes))
    }

    @Test("HELLO once when the channel is active; WELCOME establishes; no WELCOME by the deadline fails the handshake")
    func handshake() {
        var machine = self.machine()
        #expect(machine.start(now: Self.start) == Self.hello)
        #expect(machine.start(now: Self.start) == nil, "once")
        #expect(machine.nextDeadline == Self.start + .seconds(5))
        let due = machine.timerFired(now: Self.start + .seconds(5))
        #expect(due.handshakeTimedOut?.code == .handshakeFailed)
        #expect(due.close != nil)

        var other = self.machine()
        _ = other.start(now: Self.start)
        guard case .established(let negotiated) = other.received(Self.welcome(), now: Self.start, preference: Self.foreground) else {
            Issue.record("expected the connection to be established")
            return
        }
        #expect(negotiated.maxConcurrentRequests == 2 && other.acceptsRequests)
        #expect(other.heartbeat?.interval == .seconds(10), "the gateway's interval in the foreground")
        #expect(other.nextDeadline == Self.start + .seconds(10), "the heartbeat's; the handshake's is gone")
    }

    @Test("requests go straight to the wire while slots are free; the rest queue; too large, duplicate and early ones fail")
    func submit() {
        var early = self.machine()
        let refused = Outcome()
        guard case .fail(_, let error) = early.submit(self.request(1), deadline: Self.start, waiter: refused.waiter) else {
            Issue.record("no request before WELCOME")
            return
        }
        #expect(error.code == .notDispatched)

        var machine = self.established(slots: 2)
        let deadline = Self.start + .seconds(30)
        guard case .write = machine.submit(self.request(1), deadline: deadline, waiter: Outcome().waiter),
            case .write = machine.submit(self.request(2), deadline: deadline, waiter: Outcome().waiter),
            case .queued = machine.submit(self.request(3), deadline: deadline, waiter: Outcome().waiter)
        else {
            Issue.record("expected two writes and a queued request")
            return
        }
        #expect(machine.requestsOnWire == 2 && machine.requestCount == 3)
        guard case .fail(_, let duplicate) = machine.submit(self.request(2), deadline: deadline, waiter: Outcome().waiter) else {
            Issue.record("a duplicate id must fail")
            return
        }
        #expect(duplicate.code == .invalidArgument)
        guard case .fail(_, let large) = machine.submit(self.request(9, bytes: 2000), deadline: deadline, waiter: Outcome().waiter) else {
            Issue.record("a request over the gateway's limit must fail")
            return
        }
        #expect(large.code == .requestTooLarge)
    }

    @Test("a response completes its request and frees its slot for the next in line; unknown and unsent ids are ignored")
    func responses() {
        var machine = self.established(slots: 1)
        let first = Outcome()
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(30), waiter: first.waiter)
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(30), waiter: Outcome().waiter)
        guard case .none = machine.received(Frame(.response(.init(id: 2)), flags: .checksum), now: Self.start, preference: Self.foreground)
        else {
            Issue.record("a response to a request never sent is ignored")
            return
        }
        let response = Frame(.response(.init(id: 1, body: ByteBuffer(string: "one"))), flags: .checksum)
        guard case .complete(let waiter, let result, let after) = machine.received(response, now: Self.start, preference: Self.foreground)
        else {
            Issue.record("expected the request to complete")
            return
        }
        waiter.resume(with: result)
        #expect(first.body == "one")
        #expect(after.send?.id == 2 && after.close == nil, "the waiting request takes the slot")
        #expect(machine.requestsOnWire == 1)
    }

    @Test("statuses: unavailable is notDispatched (never ran); deadline exceeded past the caller's deadline is timedOut")
    func statuses() {
        var machine = self.established()
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(1), waiter: Outcome().waiter)
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(30), waiter: Outcome().waiter)
        let unavailable = Frame(.response(.init(id: 2, status: .unavailable, message: "going away")), flags: .checksum)
        guard
            case .complete(_, .failure(let notDispatched), _) = machine.received(unavailable, now: Self.start, preference: Self.foreground)
        else {
            Issue.record("expected a failure")
            return
        }
        #expect(notDispatched.code == .notDispatched)
        let late = Frame(.response(.init(id: 1, status: .deadlineExceeded)), flags: .checksum)
        guard
            case .complete(_, .failure(let timedOut), _) = machine.received(
                late,
                now: Self.start + .seconds(1),
                preference: Self.foreground
            )
        else {
            Issue.record("expected a failure")
            return
        }
        #expect(timedOut.code == .timedOut && timedOut.status == .deadlineExceeded)
    }

    @Test("cancel: a sent request gets CANCEL and gives its slot to the next; a queued one just ends")
    func cancel() {
        var machine = self.established(slots: 1)
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(30), waiter: Outcome().waiter)
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(30), waiter: Outcome().waiter)
        _ = machine.submit(self.request(3), deadline: Self.start + .seconds(30), waiter: Outcome().waiter)
        guard case .cancelled(_, let queuedError, let queuedSend, let queuedAfter) = machine.cancel(3) else {
            Issue.record("expected the queued request to end")
            return
        }
        #expect(queuedError.code == .cancelled && !queuedSend && queuedAfter.send == nil)
        guard case .cancelled(_, _, let sendCancel, let after) = machine.cancel(1) else {
            Issue.record("expected the sent request to end")
            return
        }
        #expect(sendCancel && after.send?.id == 2)
        guard case .none = machine.cancel(1) else {
            Issue.record("cancelling twice does nothing")
            return
        }
    }

    @Test("one timer: each request fails at its own deadline (CANCEL if it was sent); the heartbeat pings, then declares the link dead")
    func timers() {
        var machine = self.established(slots: 1)
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(3), waiter: Outcome().waiter)
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(2), waiter: Outcome().waiter)
        #expect(machine.nextDeadline == Self.start + .seconds(2))
        var due = machine.timerFired(now: Self.start + .seconds(2))
        #expect(due.expired.map(\.1.code) == [.timedOut] && due.cancels.isEmpty, "2 was queued: no CANCEL")
        due = machine.timerFired(now: Self.start + .seconds(3))
        #expect(due.expired.count == 1 && due.cancels == [1])
        due = machine.timerFired(now: Self.start + .seconds(10))
        #expect(due.heartbeat == .sendPing(id: 1))
        due = machine.timerFired(now: Self.start + .seconds(12))
        guard case .heartbeatTimeout? = due.close else {
            Issue.record("no answer within the PONG timeout: the link is dead")
            return
        }
        #expect(machine.takeIdleProbeReport()?.answered == false, "an idle probe died waiting")
    }

    @Test("GOAWAY: queued requests fail notDispatched, the connection closes once drained; during the handshake it is a refusal")
    func goAway() {
        var machine = self.established(slots: 1)
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(30), waiter: Outcome().waiter)
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(30), waiter: Outcome().waiter)
        let goAway = Frame(.goAway(.init(reason: .shutdown)), flags: .checksum)
        guard case .goAway(_, let unsent, let close) = machine.received(goAway, now: Self.start, preference: Self.foreground) else {
            Issue.record("expected GOAWAY")
            return
        }
        #expect(unsent.count == 1 && close == nil, "1 is still in flight")
        #expect(!machine.acceptsRequests)
        guard
            case .complete(_, _, let after) = machine.received(
                Frame(.response(.init(id: 1)), flags: .checksum),
                now: Self.start,
                preference: Self.foreground
            )
        else {
            Issue.record("expected the request to complete")
            return
        }
        guard case .goingAway? = after.close else {
            Issue.record("drained: close")
            return
        }

        var fresh = self.machine()
        _ = fresh.start(now: Self.start)
        guard case .refused(let error, _) = fresh.received(goAway, now: Self.start, preference: Self.foreground) else {
            Issue.record("expected a refusal")
            return
        }
        #expect(error.code == .handshakeFailed)
    }

    @Test("closing settles everything once: queued requests notDispatched, sent ones connectionLost; no WELCOME is a failed handshake")
    func closed() {
        var machine = self.established(slots: 1)
        _ = machine.submit(self.request(1), deadline: Self.start + .seconds(30), waiter: Outcome().waiter)
        _ = machine.submit(self.request(2), deadline: Self.start + .seconds(30), waiter: Outcome().waiter)
        let closed = machine.closed(now: Self.start + .seconds(4))
        #expect(Set(closed?.failed.map(\.1.code) ?? []) == [.notDispatched, .connectionLost])
        #expect(closed?.handshakeFailed == nil && closed?.closure.uptime == .seconds(4))
        #expect(machine.closed(now: Self.start) == nil, "once")

        var fresh = self.machine()
        _ = fresh.start(now: Self.start)
        #expect(fresh.closed(now: Self.start)?.handshakeFailed?.code == .handshakeFailed)
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
        #expect(machine.nextDeadline == Self.start + .seconds(1), "the retransmission timeout")
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
        #expect(machine.nextDeadline == Self.start + .seconds(1), "still in flight, with its retransmission deadline")
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
}
