import NIOConcurrencyHelpers
import NIOCore
import Testing

@testable import TetherCore
@testable import TetherGateway

/// The gateway connection's machine, event by event, with no channel and no clock.
@Suite("Gateway connection state machine")
struct GatewayConnectionStateMachineTests {
    typealias Machine = GatewayConnectionHandler.StateMachine

    static let start = NIODeadline.uptimeNanoseconds(1_000_000_000)
    static let hello = Frame.Hello(versions: 1...1, features: .checksum, maxBodySize: 4096, clientID: "alice")

    func machine(maxRunning: Int = 2, maxWaiting: Int = 3, handlerTimeout: TimeAmount = .seconds(30)) -> Machine {
        Machine(
            configuration: .init(
                handshakeTimeout: .seconds(10),
                handlerTimeout: handlerTimeout,
                idleTimeout: .seconds(30),
                shutdownGracePeriod: .seconds(5),
                maxRunning: maxRunning,
                maxWaiting: maxWaiting
            ),
            now: Self.start
        )
    }

    /// A machine past its handshake.
    func established(
        maxRunning: Int = 2,
        maxWaiting: Int = 3,
        handlerTimeout: TimeAmount = .seconds(30),
        credentialsDeadline: NIODeadline? = nil
    ) throws -> Machine {
        var machine = self.machine(maxRunning: maxRunning, maxWaiting: maxWaiting, handlerTimeout: handlerTimeout)
        guard case .startHandshake = machine.received(Frame(.hello(Self.hello), flags: .checksum), now: Self.start) else {
            throw Failure("expected the handshake to start")
        }
        let policy = Handshake.GatewayPolicy(
            features: .checksum,
            heartbeatInterval: .seconds(10),
            idleTimeout: .seconds(30),
            maxBodySize: 1 << 20,
            maxConcurrentRequests: UInt32(maxRunning)
        )
        let (_, negotiated) = try Handshake.accept(Self.hello, policy: policy, connectionID: 1).get()
        #expect(machine.welcome(negotiated, credentialsDeadline: credentialsDeadline) == [])
        return machine
    }

    struct Failure: Error {
        var message: String
        init(_ message: String) { self.message = message }
    }

    func request(_ id: UInt64, timeout: Duration? = nil) -> Frame {
        Frame(.request(.init(id: id, method: "m", timeout: timeout)), flags: .checksum)
    }

    @Test(
        "requests are tracked from the moment they are read: a duplicate id in flight is a violation; a CANCEL of an unknown id does nothing"
    )
    func tracking() throws {
        var machine = try self.established()
        guard case .request(let request) = machine.received(self.request(1), now: Self.start) else {
            Issue.record("expected the request to be passed on")
            return
        }
        #expect(request.timeout == .seconds(30), "no client timeout: the handler time limit")
        #expect(machine.requestsInFlight == 1)
        guard case .sendErrorAndClose(let error) = machine.received(self.request(1), now: Self.start) else {
            Issue.record("a duplicate request id must be a violation")
            return
        }
        #expect(error.code == .protocolError)

        var other = try self.established()
        guard case .none = other.received(Frame(.cancel(.init(requestID: 9)), flags: .checksum), now: Self.start) else {
            Issue.record("expected nothing to cancel")
            return
        }
        _ = other.received(self.request(1, timeout: .seconds(3)), now: Self.start)
        guard case .cancel = other.received(Frame(.cancel(.init(requestID: 1)), flags: .checksum), now: Self.start) else {
            Issue.record("expected the request to be settled")
            return
        }
        #expect(other.requestsInFlight == 0)
        #expect(other.responseReady(1) == false, "a cancelled request is not answered")
    }

    @Test("each request is answered once: after its deadline's answer, the handler's late answer is dropped")
    func answeredOnce() throws {
        var machine = try self.established()
        _ = machine.received(self.request(1, timeout: .seconds(2)), now: Self.start)
        _ = machine.received(self.request(2, timeout: .seconds(60)), now: Self.start)
        let due = machine.timerFired(now: Self.start + .seconds(2))
        #expect(due.responses.map(\.id) == [1] && due.responses[0].status == .deadlineExceeded)
        #expect(machine.responseReady(1) == false, "the handler's late answer")
        #expect(machine.responseReady(2) == true)
        #expect(machine.responseReady(2) == false)
        #expect(machine.responseReady(99) == false)
    }

    @Test("the effective timeout is the client's, capped by the handler time limit")
    func effectiveTimeout() throws {
        var machine = try self.established(handlerTimeout: .seconds(10))
        guard case .request(let short) = machine.received(self.request(1, timeout: .seconds(3)), now: Self.start),
            case .request(let long) = machine.received(self.request(2, timeout: .seconds(60)), now: Self.start)
        else {
            Issue.record("expected requests")
            return
        }
        #expect(short.timeout == .seconds(3) && long.timeout == .seconds(10))
        #expect(machine.nextDeadline == Self.start + .seconds(3))
    }

    @Test("handler slots: beyond the limit requests wait in order; one settled while waiting never starts; reading stops and resumes")
    func slots() throws {
        var machine = try self.established(maxRunning: 2, maxWaiting: 2)
        var requests: [Frame.Request] = []
        for id in 1...5 as ClosedRange<UInt64> {
            guard case .request(let request) = machine.received(self.request(id), now: Self.start) else { throw Failure("request") }
            requests.append(request)
        }
        #expect(machine.handlerNeeded(requests[0]) == .start)
        #expect(machine.handlerNeeded(requests[1]) == .start)
        #expect(machine.handlerNeeded(requests[2]) == .queued)
        #expect(machine.readRequested() == true, "one waits: reading goes on")
        #expect(machine.handlerNeeded(requests[3]) == .queued)
        #expect(machine.readRequested() == false, "two wait: reading stops")
        _ = machine.received(Frame(.cancel(.init(requestID: 3)), flags: .checksum), now: Self.start)  // cancelled while waiting
        #expect(machine.responseReady(1) == true)
        let ended = machine.handlerEnded()
        #expect(ended.start.map(\.id) == [4], "3 was cancelled while it waited: 4 starts in its place")
        #expect(ended.resumeReading, "the held read goes on")
        #expect(!ended.done)
        #expect(machine.running == 2 && machine.tasks == 2)
    }

    @Test("writability: reads are held while the channel is not writable, and resume once")
    func writability() throws {
        var machine = try self.established()
        #expect(machine.writabilityChanged(false) == false, "nothing was held")
        #expect(machine.readRequested() == false)
        #expect(machine.readRequested() == false)
        #expect(machine.writabilityChanged(true) == true, "one held read goes on")
        #expect(machine.writabilityChanged(true) == false)
    }

    @Test("time limits: each task gets the whole limit from its own start; past it, it is cancelled and reported")
    func timeLimits() throws {
        var machine = try self.established(handlerTimeout: .seconds(10))
        let cancelled = NIOLockedValueBox<[Int]>([])
        let first = machine.startTimeLimit({ cancelled.withLockedValue { $0.append(1) } }, now: Self.start)
        #expect(machine.endTimeLimit(first) == false, "in time")
        let second = machine.startTimeLimit({ cancelled.withLockedValue { $0.append(2) } }, now: Self.start + .seconds(5))
        for cancel in machine.timerFired(now: Self.start + .seconds(10)).cancel { cancel() }
        #expect(cancelled.withLockedValue { $0 }.isEmpty, "not before its own deadline (15 s)")
        for cancel in machine.timerFired(now: Self.start + .seconds(15)).cancel { cancel() }
        #expect(cancelled.withLockedValue { $0 } == [2])
        #expect(machine.endTimeLimit(second) == true, "ran past its limit, whatever it returns")
    }

    @Test("one timer: the next deadline is the earliest of the handshake's, the requests', the idle one and the grace period")
    func nextDeadline() throws {
        var fresh = self.machine()
        #expect(fresh.nextDeadline == Self.start + .seconds(10), "the handshake's")
        let due = fresh.timerFired(now: Self.start + .seconds(10))
        guard case .error(let report)? = due.sendAndClose else {
            Issue.record("expected ERROR")
            return
        }
        #expect(report.code == .handshakeTimeout)

        var machine = try self.established()
        #expect(machine.nextDeadline == Self.start + .seconds(30), "idle")
        _ = machine.received(self.request(1, timeout: .seconds(5)), now: Self.start + .seconds(1))
        #expect(machine.nextDeadline == Self.start + .seconds(6), "the request's")
        #expect(machine.responseReady(1) == true)
        #expect(machine.nextDeadline == Self.start + .seconds(31), "idle, from the last frame read")
        #expect(machine.drain(now: Self.start + .seconds(2)) == .sendGoAway)
        #expect(machine.nextDeadline == Self.start + .seconds(7), "the grace period")
        #expect(machine.timerFired(now: Self.start + .seconds(7)).close)
    }

    @Test("a connection silent for the idle timeout gets GOAWAY; a frame postpones it")
    func idle() throws {
        var machine = try self.established()
        _ = machine.received(Frame(.ping(.init(id: 1)), flags: .checksum), now: Self.start + .seconds(20))
        #expect(machine.timerFired(now: Self.start + .seconds(30)).sendAndClose == nil)
        guard case .goAway(let goAway)? = machine.timerFired(now: Self.start + .seconds(50)).sendAndClose else {
            Issue.record("expected GOAWAY")
            return
        }
        #expect(goAway.reason == .idleTimeout)
    }

    @Test("expired credentials: the timer is set for them, and at their deadline the connection is drained with GOAWAY")
    func credentialsExpire() throws {
        var machine = try self.established(credentialsDeadline: Self.start + .seconds(12))
        #expect(machine.nextDeadline == Self.start + .seconds(12))
        let early = machine.timerFired(now: Self.start + .seconds(11))
        #expect(early.drain == nil && early.sendAndClose == nil)
        let due = machine.timerFired(now: Self.start + .seconds(12))
        #expect(due.drain?.reason == .credentialsExpired)
        #expect(due.sendAndClose == nil, "drained, not cut: the requests in flight are answered")
        #expect(machine.timerFired(now: Self.start + .seconds(13)).drain == nil, "once")
        #expect(machine.drain(now: Self.start + .seconds(12)) == .sendGoAway)
    }

    @Test("over the request rate: resource exhausted without a handler; over the message rate: not taken; both refill")
    func rates() throws {
        var machine = Machine(
            configuration: .init(
                handshakeTimeout: .seconds(10),
                handlerTimeout: .seconds(30),
                idleTimeout: .seconds(30),
                shutdownGracePeriod: .seconds(5),
                maxRunning: 100,
                maxWaiting: 100,
                requestsPerSecond: 2,
                messagesPerSecond: 1
            ),
            now: Self.start
        )
        _ = machine.received(Frame(.hello(Self.hello), flags: .checksum), now: Self.start)
        let policy = Handshake.GatewayPolicy(
            features: [.checksum, .reliableDelivery],
            heartbeatInterval: .seconds(10),
            idleTimeout: .seconds(30),
            maxBodySize: 1 << 20,
            maxConcurrentRequests: 100,
            deliveryEpoch: 1
        )
        var hello = Self.hello
        hello.features = [.checksum, .reliableDelivery]
        hello.outboxEpoch = 1
        let (_, negotiated) = try Handshake.accept(hello, policy: policy, connectionID: 1).get()
        _ = machine.welcome(negotiated)

        for id in UInt64(1)...2 {
            guard case .request = machine.received(self.request(id), now: Self.start) else { throw Failure("request \(id) refused") }
        }
        guard case .rateLimited(.response(let refusal)?) = machine.received(self.request(3), now: Self.start) else {
            throw Failure("expected a refusal")
        }
        #expect(refusal.id == 3 && refusal.status == .resourceExhausted && refusal.message.contains("2 requests per second"))
        #expect(machine.requestsInFlight == 2, "the refused one is not in flight")
        guard case .request = machine.received(self.request(3), now: Self.start + .milliseconds(500)) else {
            throw Failure("half a second later there is room again")
        }

        let message = Frame(.message(.init(id: 1, topic: "t", conversation: "c", sequence: 1)), flags: .checksum)
        guard case .message = machine.received(message, now: Self.start) else { throw Failure("the first message is taken") }
        guard case .rateLimited(nil) = machine.received(message, now: Self.start) else { throw Failure("the second is not") }
        guard case .message = machine.received(message, now: Self.start + .seconds(1)) else { throw Failure("a second later it is") }
    }

    @Test("a last frame that cannot be written holds the connection for the close timeout at most")
    func closeTimeout() throws {
        var machine = try self.established()
        let first = machine.startClosing(writingLastFrameAt: Self.start + .seconds(1))
        let second = machine.startClosing(writingLastFrameAt: Self.start + .seconds(1))
        #expect(first && !second, "once")
        #expect(machine.nextDeadline == Self.start + .seconds(3), "the default close timeout is 2 s")
        #expect(!machine.timerFired(now: Self.start + .seconds(2)).close)
        let due = machine.timerFired(now: Self.start + .seconds(3))
        #expect(due.close && due.lastFrameStuck)
    }

    @Test("refreshed credentials replace the deadline; no credentials expiry leaves none")
    func credentialsReplaced() throws {
        var machine = try self.established(credentialsDeadline: Self.start + .seconds(12))
        machine.credentialsReplaced(deadline: Self.start + .seconds(20))
        #expect(machine.timerFired(now: Self.start + .seconds(12)).drain == nil)
        #expect(machine.nextDeadline == Self.start + .seconds(20))
        machine.credentialsReplaced(deadline: nil)
        #expect(machine.nextDeadline == Self.start + .seconds(30), "only the idle timeout is left")
        #expect(machine.timerFired(now: Self.start + .seconds(25)).drain == nil)
    }

    @Test("drain: GOAWAY and a grace period once established; GOAWAY and a close during the handshake; nothing twice")
    func drain() throws {
        var established = try self.established()
        #expect(established.drain(now: Self.start) == .sendGoAway)
        #expect(established.drain(now: Self.start) == .none)
        guard case .send(.response(let refusal)) = established.received(self.request(1), now: Self.start) else {
            Issue.record("expected a refusal")
            return
        }
        #expect(refusal.status == .unavailable)
        var fresh = self.machine()
        #expect(fresh.drain(now: Self.start) == .sendGoAwayAndClose)
    }

    @Test("pushes before WELCOME are held and handed over with it; too large ones are refused; closing drops them")
    func pushes() throws {
        var machine = self.machine()
        _ = machine.received(Frame(.hello(Self.hello), flags: .checksum), now: Self.start)
        let early = Frame.Push(topic: "early")
        #expect(machine.admitPush(early) == .held)
        let policy = Handshake.GatewayPolicy(
            features: .checksum,
            heartbeatInterval: .seconds(10),
            idleTimeout: .seconds(30),
            maxBodySize: 1 << 20,
            maxConcurrentRequests: 2
        )
        let (_, negotiated) = try Handshake.accept(Self.hello, policy: policy, connectionID: 1).get()
        #expect(machine.welcome(negotiated) == [early])
        #expect(machine.welcome(negotiated) == nil, "WELCOME goes once")
        let fits = Frame.Push(topic: "t", body: ByteBuffer(repeating: 0, count: 4096 - Frame.Push(topic: "t").bodySize))
        #expect(machine.admitPush(fits) == .write)
        let big = Frame.Push(topic: "t", body: ByteBuffer(repeating: 0, count: 4097 - Frame.Push(topic: "t").bodySize))
        #expect(machine.admitPush(big) == .tooLarge(limit: 4096), "the client's limit is on the whole body")
        #expect(machine.startClosing() == true)
        #expect(machine.startClosing() == false)
        #expect(machine.admitPush(early) == .closing)
    }

    @Test(
        "closing settles the requests (their handlers are cancelled) but not the time limits; the connection is done when its last task ended"
    )
    func closed() throws {
        var machine = try self.established()
        guard case .request(let request) = machine.received(self.request(1), now: Self.start) else { throw Failure("request") }
        #expect(machine.handlerNeeded(request) == .start)
        let task = Task<Void, Never> { try? await Task.sleep(for: .seconds(600)) }
        #expect(machine.handlerStarted(1, task: task) == false)
        machine.taskStarted()  // a reliable loop, say
        let cancelled = NIOLockedValueBox(false)
        let limit = machine.startTimeLimit({ cancelled.withLockedValue { $0 = true } }, now: Self.start)

        let settled = machine.closed()
        let closed = try #require(settled)
        #expect(closed.cancel.count == 1 && !closed.done)
        for task in closed.cancel { task.cancel() }
        #expect(task.isCancelled)
        #expect(!cancelled.withLockedValue { $0 }, "a handler under a time limit runs on: its batch must be committed")
        #expect(machine.nextDeadline == Self.start + .seconds(30), "its limit still holds")
        #expect(machine.endTimeLimit(limit) == false, "ended in time, after the close")
        let again = machine.closed()
        #expect(again == nil, "reported once")
        #expect(machine.responseReady(1) == false, "nothing is answered once closed")
        #expect(machine.taskEnded() == false)
        #expect(machine.handlerEnded().done == true, "the last task ended")
        #expect(machine.handlerStarted(2, task: task) == true, "a task started for a settled request is cancelled at once")
    }
}
