import NIOCore
import Testing

@testable import TetherCore

/// The gateway connection's machine, event by event, with no channel and no clock.
@Suite("Gateway connection state machine")
struct GatewayConnectionStateMachineTests {
    typealias Machine = GatewayConnectionStateMachine

    static let start = TetherInstant(nanoseconds: 1_000_000_000)
    static let hello = Frame.Hello(versions: 1...1, features: .checksum, maxBodySize: 4096, clientID: "alice")

    static func configuration(
        maxRunning: Int = 2,
        maxWaiting: Int = 3,
        handlerTimeout: Duration = .seconds(30),
        requestsPerSecond: Int? = nil,
        messagesPerSecond: Int? = nil
    ) -> Machine.Configuration {
        Machine.Configuration(
            handshakeTimeout: .seconds(10),
            idleTimeout: .seconds(30),
            shutdownGracePeriod: .seconds(5),
            requests: .init(
                handlerTimeout: handlerTimeout,
                maxRunning: maxRunning,
                maxWaiting: maxWaiting,
                requestsPerSecond: requestsPerSecond
            ),
            inbox: .init(maxMessages: 4, maxBytes: 1 << 20, maxBatch: 8, messagesPerSecond: messagesPerSecond),
            deliveryWindow: 4
        )
    }

    /// A machine past its handshake (with reliable delivery if `resume` is set).
    static func established(
        _ configuration: Machine.Configuration = Self.configuration(),
        credentialsDeadline: TetherInstant? = nil,
        resume: UInt64? = nil,
        features extra: Features = []
    ) throws -> Machine {
        var machine = Machine(configuration: configuration, now: Self.start)
        var hello = Self.hello
        var features: Features = Features.checksum.union(extra)
        hello.features.formUnion(extra)
        if resume != nil {
            features.formUnion([.reliableDelivery, .messageAnswers])
            hello.features = features
            hello.outboxEpoch = 1
        }
        guard case .authenticate = machine.received(Frame(.hello(hello), flags: .checksum), now: Self.start) else {
            throw Failure("expected the handshake to start")
        }
        let policy = Handshake.GatewayPolicy(
            features: features,
            heartbeatInterval: .seconds(10),
            idleTimeout: .seconds(30),
            maxBodySize: 1 << 20,
            maxConcurrentRequests: UInt32(configuration.requests.maxRunning),
            deliveryEpoch: resume == nil ? nil : 9
        )
        let (_, negotiated) = try Handshake.accept(hello, policy: policy, connectionID: 1).get()
        guard
            case .some = machine.handshakeSucceeded(
                .init(negotiated: negotiated, credentialsDeadline: credentialsDeadline, resume: resume),
                now: Self.start
            )
        else { throw Failure("expected WELCOME") }
        return machine
    }

    struct Failure: Error {
        var message: String
        init(_ message: String) { self.message = message }
    }

    func request(_ id: UInt64, timeout: Duration? = nil) -> Frame {
        Frame(.request(.init(id: id, method: "m", timeout: timeout)), flags: .checksum)
    }

    func message(_ id: UInt64, sequence: UInt64? = nil) -> Frame {
        Frame(.message(.init(id: id, topic: "t", conversation: "c", sequence: sequence ?? id)), flags: .checksum)
    }

    /// Routes a request the way the handler does for a task handler.
    func route(
        _ machine: inout Machine,
        _ frame: Frame,
        at now: TetherInstant = Self.start
    ) throws -> (Frame.Request, GatewayRequestTable.OnHandlerNeeded?) {
        guard case .route(let request) = machine.received(frame, now: now) else { throw Failure("expected a request to route") }
        return (request, machine.handlerNeeded(request, now: now))
    }

    // MARK: The handshake

    @Test("HELLO with a checksum starts the handshake; anything else first, or a second frame before WELCOME, is a violation")
    func handshake() throws {
        var machine = Machine(configuration: Self.configuration(), now: Self.start)
        guard case .writeAndClose(.error(let error), _) = machine.received(Frame(.ping(.init(id: 1)), flags: .checksum), now: Self.start)
        else { throw Failure("the first frame must be HELLO") }
        #expect(error.code == .unexpectedFrame && machine.isClosing)

        var unchecked = Machine(configuration: Self.configuration(), now: Self.start)
        guard case .writeAndClose(.error(let mismatch), _) = unchecked.received(Frame(.hello(Self.hello)), now: Self.start) else {
            throw Failure("HELLO must carry a checksum")
        }
        #expect(mismatch.code == .checksumMismatch)

        var waiting = Machine(configuration: Self.configuration(), now: Self.start)
        _ = waiting.received(Frame(.hello(Self.hello), flags: .checksum), now: Self.start)
        guard case .none = waiting.received(Frame(.pong(.init(id: 1)), flags: .checksum), now: Self.start) else {
            throw Failure("a PONG while authenticating is ignored")
        }
        guard case .writeAndClose(.error(let early), _) = waiting.received(self.request(1), now: Self.start) else {
            throw Failure("a request before WELCOME breaks the protocol")
        }
        #expect(early.code == .unexpectedFrame)
    }

    @Test("no complete handshake within the timeout: ERROR handshake timeout; WELCOME for a closed connection is not sent")
    func handshakeTimeout() {
        var machine = Machine(configuration: Self.configuration(), now: Self.start)
        let next109 = machine.nextDeadline(now: Self.start)
        #expect(next109 == Self.start + .seconds(10))
        #expect(machine.timerFired(now: Self.start + .seconds(9)).end == nil)
        guard case .writeAndClose(.error(let report), _)? = machine.timerFired(now: Self.start + .seconds(10)).end else {
            Issue.record("expected ERROR")
            return
        }
        #expect(report.code == .handshakeTimeout)
        let negotiated = Handshake.Negotiated(
            version: 1,
            features: .checksum,
            connectionID: 1,
            peerMaxBodySize: 4096,
            heartbeatInterval: .seconds(10),
            idleTimeout: .seconds(30),
            maxConcurrentRequests: 2
        )
        #expect(machine.handshakeSucceeded(.init(negotiated: negotiated), now: Self.start + .seconds(11)) == nil)
    }

    @Test("an established connection enforces the negotiated checksum and the frames a client may send")
    func rules() throws {
        var machine = try Self.established()
        guard case .writeAndClose(.error(let missing), _) = machine.received(Frame(.ping(.init(id: 1))), now: Self.start) else {
            throw Failure("a frame without the negotiated checksum is a violation")
        }
        #expect(missing.code == .checksumMismatch)
        var other = try Self.established()
        guard case .writeAndClose(.error(let notReliable), _) = other.received(self.message(1), now: Self.start) else {
            throw Failure("MESSAGE without reliable delivery is a violation")
        }
        #expect(notReliable.code == .unexpectedFrame)
        // Channels without the feature negotiated: their frames are unexpected (SUBSCRIBED and
        // PUBLICATION never come from a client; see `channelFrames`).
        for payload: Frame.Payload in [
            .subscribe(.init(id: 1, channel: "news")),
            .unsubscribe(.init(channel: "news")),
            .subscribed(.init(id: 1)),
            .publication(.init(channel: "news")),
            .presence(.init(channel: "news", kind: .left, clientID: "bob")),
        ] {
            var channels = try Self.established()
            guard case .writeAndClose(.error(let refused), _) = channels.received(Frame(payload, flags: .checksum), now: Self.start) else {
                throw Failure("\(payload.type) is a violation")
            }
            #expect(refused.code == .unexpectedFrame, "\(payload.type)")
        }
        var third = try Self.established()
        guard case .write(.pong(let pong)) = third.received(Frame(.ping(.init(id: 7)), flags: .checksum), now: Self.start) else {
            throw Failure("PING gets PONG")
        }
        #expect(pong.id == 7)
    }

    @Test(
        "with channels negotiated, SUBSCRIBE and UNSUBSCRIBE go to the hub; a draining connection refuses SUBSCRIBE; SUBSCRIBED and PUBLICATION from a client are violations"
    )
    func channelFrames() throws {
        var machine = try Self.established(features: .channels)
        guard
            case .subscribe(let subscribe) = machine.received(
                Frame(.subscribe(.init(id: 3, channel: "news", recoverFrom: .init(epoch: 5, offset: 2))), flags: .checksum),
                now: Self.start
            )
        else { throw Failure("SUBSCRIBE goes to the hub") }
        #expect(subscribe.id == 3 && subscribe.recoverFrom == ChannelPosition(epoch: 5, offset: 2))
        guard case .unsubscribe("news") = machine.received(Frame(.unsubscribe(.init(channel: "news")), flags: .checksum), now: Self.start)
        else { throw Failure("UNSUBSCRIBE goes to the hub") }
        for payload: Frame.Payload in [
            .subscribed(.init(id: 1)), .publication(.init(channel: "news")),
            .presence(.init(channel: "news", kind: .left, clientID: "bob")),
        ] {
            var wrongWay = try Self.established(features: .channels)
            guard case .writeAndClose(.error(let refused), _) = wrongWay.received(Frame(payload, flags: .checksum), now: Self.start) else {
                throw Failure("\(payload.type) from a client is a violation")
            }
            #expect(refused.code == .unexpectedFrame)
        }
        #expect(machine.drain(now: Self.start) == .sendGoAway)
        guard
            case .write(.subscribed(let refused)) = machine.received(
                Frame(.subscribe(.init(id: 4, channel: "news")), flags: .checksum),
                now: Self.start
            )
        else { throw Failure("a draining connection answers SUBSCRIBE itself") }
        #expect(refused.id == 4 && refused.status == .unavailable)
    }

    // MARK: Requests

    @Test("requests are tracked from the moment a task needs them: a duplicate id in flight is a violation; CANCEL settles one")
    func tracking() throws {
        var machine = try Self.established()
        let (request, start) = try self.route(&machine, self.request(1))
        #expect(request.timeout == .seconds(30), "no client timeout: the handler time limit")
        #expect(start == .start && machine.requestsInFlight == 1 && machine.isInFlight(1))
        guard case .writeAndClose(.error(let error), let settle) = machine.received(self.request(1), now: Self.start) else {
            throw Failure("a duplicate request id must be a violation")
        }
        #expect(error.code == .protocolError && settle == [1], "the running one is settled (its task cancelled)")

        var other = try Self.established()
        guard case .none = other.received(Frame(.cancel(.init(requestID: 9)), flags: .checksum), now: Self.start) else {
            throw Failure("nothing to cancel")
        }
        _ = try self.route(&other, self.request(1, timeout: .seconds(3)))
        guard case .cancelHandler(1) = other.received(Frame(.cancel(.init(requestID: 1)), flags: .checksum), now: Self.start) else {
            throw Failure("expected the request to be settled")
        }
        #expect(other.requestsInFlight == 0)
        #expect(other.responseReady(1, routedDirectly: false) == false, "a cancelled request is not answered")
    }

    @Test("an inline answer costs no table entry; each request is answered once, the late one after its deadline dropped")
    func answeredOnce() throws {
        var machine = try Self.established()
        guard case .route = machine.received(self.request(5), now: Self.start) else { throw Failure("route") }
        #expect(machine.requestsInFlight == 0, "routed directly, not in the table")
        #expect(machine.responseReady(5, routedDirectly: true) == true, "answered at once")

        _ = try self.route(&machine, self.request(1, timeout: .seconds(2)))
        _ = try self.route(&machine, self.request(2, timeout: .seconds(60)))
        let due = machine.timerFired(now: Self.start + .seconds(2))
        #expect(due.responses.map(\.id) == [1] && due.responses[0].status == .deadlineExceeded && due.cancel == [1])
        #expect(machine.responseReady(1, routedDirectly: false) == false, "the handler's late answer")
        #expect(machine.responseReady(2, routedDirectly: false) == true)
        #expect(machine.responseReady(2, routedDirectly: false) == false)
    }

    @Test("the effective timeout is the client's, capped by the handler time limit")
    func effectiveTimeout() throws {
        var machine = try Self.established(Self.configuration(handlerTimeout: .seconds(10)))
        let (short, _) = try self.route(&machine, self.request(1, timeout: .seconds(3)))
        let (long, _) = try self.route(&machine, self.request(2, timeout: .seconds(60)))
        #expect(short.timeout == .seconds(3) && long.timeout == .seconds(10))
        let next190 = machine.nextDeadline(now: Self.start)
        #expect(next190 == Self.start + .seconds(3))
    }

    @Test("handler slots: beyond the limit requests wait in order; one settled while waiting never starts; reads are held, then resume")
    func slots() throws {
        var machine = try Self.established(Self.configuration(maxRunning: 2, maxWaiting: 2))
        var outcomes: [GatewayRequestTable.OnHandlerNeeded?] = []
        for id in 1...4 as ClosedRange<UInt64> { outcomes.append(try self.route(&machine, self.request(id)).1) }
        #expect(outcomes == [.start, .start, .queued, .queued])
        #expect(machine.holdsReads, "two wait: reading stops")
        _ = machine.received(Frame(.cancel(.init(requestID: 3)), flags: .checksum), now: Self.start)  // cancelled while waiting
        #expect(!machine.holdsReads)
        let answered = machine.responseReady(1, routedDirectly: false)
        #expect(answered)
        let ended = machine.handlerEnded()
        #expect(ended.start.map(\.id) == [4], "3 was cancelled while it waited: 4 starts in its place")
        #expect(!ended.done && machine.tasks == 2)
        // Answer and end in one event: 2 answers; 4 was cancelled meanwhile, its answer is dropped.
        let second = machine.handlerEnded(answering: 2)
        #expect(second.writeAnswer && second.start.isEmpty && machine.requestsInFlight == 1)
        _ = machine.received(Frame(.cancel(.init(requestID: 4)), flags: .checksum), now: Self.start)
        let fourth = machine.handlerEnded(answering: 4)
        #expect(!fourth.writeAnswer, "settled by the CANCEL: nothing more is written")
        #expect(machine.tasks == 0 && machine.requestsInFlight == 0)
    }

    @Test("pacing: requests over the rate wait for the next token instead of being refused, in order, and keep their deadlines")
    func requestPacing() throws {
        var machine = try Self.established(Self.configuration(maxRunning: 100, maxWaiting: 100, requestsPerSecond: 2))
        guard case .route = machine.received(self.request(1), now: Self.start),
            case .route = machine.received(self.request(2), now: Self.start)
        else { throw Failure("the burst is routed at once") }
        guard case .none = machine.received(self.request(3), now: Self.start),
            case .none = machine.received(self.request(4, timeout: .milliseconds(100)), now: Self.start),
            case .none = machine.received(self.request(5), now: Self.start)
        else { throw Failure("over the rate, requests wait") }
        #expect(machine.requestsInFlight == 3, "waiting requests are in flight: nothing is refused")
        let next220 = machine.nextDeadline(now: Self.start)
        #expect(next220 == Self.start + .milliseconds(100), "4's deadline comes before the next token")
        let expired = machine.timerFired(now: Self.start + .milliseconds(100))
        #expect(expired.responses.map(\.id) == [4] && expired.route.isEmpty)
        #expect(machine.nextDeadline(now: Self.start + .milliseconds(100)) == Self.start + .milliseconds(500), "the next token")
        let released = machine.timerFired(now: Self.start + .milliseconds(500))
        #expect(released.route.map(\.id) == [3], "one token in half a second at 2/s")
        #expect(machine.timerFired(now: Self.start + .seconds(1)).route.map(\.id) == [5])
        let three = machine.responseReady(3, routedDirectly: false)
        let five = machine.responseReady(5, routedDirectly: false)
        #expect(three && five)
    }

    // MARK: Time

    @Test("one timer: the next deadline is the earliest of the requests', the idle one and the grace period")
    func nextDeadline() throws {
        var machine = try Self.established()
        let next236 = machine.nextDeadline(now: Self.start)
        #expect(next236 == Self.start + .seconds(30), "idle")
        _ = try self.route(&machine, self.request(1, timeout: .seconds(5)), at: Self.start + .seconds(1))
        let next239 = machine.nextDeadline(now: Self.start)
        #expect(next239 == Self.start + .seconds(6), "the request's")
        let answered = machine.responseReady(1, routedDirectly: false)
        #expect(answered)
        let next242 = machine.nextDeadline(now: Self.start)
        #expect(next242 == Self.start + .seconds(31), "idle, from the last frame read")
        #expect(machine.drain(now: Self.start + .seconds(2)) == .sendGoAway)
        let next245 = machine.nextDeadline(now: Self.start)
        #expect(next245 == Self.start + .seconds(7), "the grace period")
        guard case .close(_, lastFrameStuck: false)? = machine.timerFired(now: Self.start + .seconds(7)).end else {
            throw Failure("the grace period ends: close")
        }
    }

    @Test("a connection silent for the idle timeout gets GOAWAY; a frame postpones it")
    func idle() throws {
        var machine = try Self.established()
        _ = machine.received(Frame(.ping(.init(id: 1)), flags: .checksum), now: Self.start + .seconds(20))
        #expect(machine.timerFired(now: Self.start + .seconds(30)).end == nil)
        guard case .writeAndClose(.goAway(let goAway), _)? = machine.timerFired(now: Self.start + .seconds(50)).end else {
            throw Failure("expected GOAWAY")
        }
        #expect(goAway.reason == .idleTimeout && machine.isClosing)
    }

    @Test("expired credentials: at their deadline the connection is drained with GOAWAY; refreshed ones move the deadline")
    func credentials() throws {
        var machine = try Self.established(credentialsDeadline: Self.start + .seconds(12))
        let next266 = machine.nextDeadline(now: Self.start)
        #expect(next266 == Self.start + .seconds(12))
        #expect(machine.timerFired(now: Self.start + .seconds(11)).end == nil)
        guard case .drain(let goAway)? = machine.timerFired(now: Self.start + .seconds(12)).end else { throw Failure("expected a drain") }
        #expect(goAway.reason == .credentialsExpired)
        #expect(machine.timerFired(now: Self.start + .seconds(13)).end == nil, "once")

        var refreshed = try Self.established(credentialsDeadline: Self.start + .seconds(12))
        refreshed.credentialsReplaced(deadline: Self.start + .seconds(20))
        #expect(refreshed.timerFired(now: Self.start + .seconds(12)).end == nil)
        let next276 = refreshed.nextDeadline(now: Self.start)
        #expect(next276 == Self.start + .seconds(20))
        refreshed.credentialsReplaced(deadline: nil)
        let next279 = refreshed.nextDeadline(now: Self.start)
        #expect(next279 == Self.start + .seconds(30), "only the idle timeout is left")
    }

    @Test("time limits: armed per handler, each the whole limit from its start; past it the task is cancelled and told so")
    func timeLimits() throws {
        var machine = try Self.established(Self.configuration(handlerTimeout: .seconds(10)))
        let token = machine.newTimeLimit()
        machine.armTimeLimit(token, now: Self.start)
        #expect(machine.disarmTimeLimit(token) == false, "in time")
        machine.armTimeLimit(token, now: Self.start + .seconds(5))
        #expect(machine.timerFired(now: Self.start + .seconds(10)).cancelTimeLimited.isEmpty, "not before its own deadline (15 s)")
        #expect(machine.timerFired(now: Self.start + .seconds(15)).cancelTimeLimited == [token])
        #expect(machine.disarmTimeLimit(token) == true, "ran past its limit, whatever it returns")
        machine.endTimeLimit(token)
    }

    @Test("a last frame that cannot be written holds the connection for the close timeout at most")
    func closeTimeout() throws {
        var machine = try Self.established()
        #expect(machine.startClosing(writingLastFrame: true, now: Self.start + .seconds(1)) != nil)
        #expect(machine.startClosing(writingLastFrame: true, now: Self.start + .seconds(1)) == nil, "once")
        let next301 = machine.nextDeadline(now: Self.start)
        #expect(next301 == Self.start + .seconds(3), "the default close timeout is 2 s")
        #expect(machine.timerFired(now: Self.start + .seconds(2)).end == nil)
        guard case .close(_, lastFrameStuck: true)? = machine.timerFired(now: Self.start + .seconds(3)).end else {
            throw Failure("expected the stuck close")
        }
    }

    @Test("drain: GOAWAY and a grace period once established, new requests refused unavailable; GOAWAY and a close during the handshake")
    func drain() throws {
        var established = try Self.established()
        #expect(established.drain(now: Self.start) == .sendGoAway)
        #expect(established.drain(now: Self.start) == .none)
        guard case .write(.response(let refusal)) = established.received(self.request(1), now: Self.start) else {
            throw Failure("expected a refusal")
        }
        #expect(refusal.status == .unavailable)
        var fresh = Machine(configuration: Self.configuration(), now: Self.start)
        #expect(fresh.drain(now: Self.start) == .sendGoAwayAndClose)
    }

    @Test("closing settles the requests but not the time limits; the connection is done when its last task ended")
    func closed() throws {
        var machine = try Self.established()
        _ = try self.route(&machine, self.request(1))
        machine.taskStarted()  // a reliable batch, say
        let limit = machine.newTimeLimit()
        machine.armTimeLimit(limit, now: Self.start)
        let closedOnce = machine.channelClosed()
        let closed = try #require(closedOnce)
        #expect(closed.settled == [1] && !closed.done)
        let next331 = machine.nextDeadline(now: Self.start)
        #expect(next331 == Self.start + .seconds(30), "the batch's limit still holds")
        #expect(machine.disarmTimeLimit(limit) == false, "ended in time, after the close")
        #expect(machine.channelClosed() == nil, "reported once")
        #expect(machine.responseReady(1, routedDirectly: false) == false, "nothing is answered once closed")
        #expect(machine.taskEnded() == false)
        #expect(machine.handlerEnded().done == true, "the last task ended")
    }

    // MARK: Reliable delivery

    @Test("messages go to the lane one batch at a time; those read meanwhile wait for the batch's end; a retransmission is dropped")
    func batches() throws {
        var machine = try Self.established(resume: 0)
        guard case .processBatch(let first) = machine.received(self.message(1), now: Self.start) else { throw Failure("a batch of one") }
        #expect(first.map(\.message.id) == [1])
        for id in 2...3 as ClosedRange<UInt64> {
            guard case .none = machine.received(self.message(id), now: Self.start) else { throw Failure("waits for the batch") }
        }
        guard case .none = machine.received(self.message(2), now: Self.start) else { throw Failure("a copy of one waiting") }
        #expect(machine.batchEnded(now: Self.start)?.map(\.message.id) == [2, 3])
        #expect(machine.batchEnded(now: Self.start) == nil)
    }

    @Test("pacing: over the message rate, messages wait for tokens (never refused); too many waiting holds reads")
    func messagePacing() throws {
        var machine = try Self.established(Self.configuration(messagesPerSecond: 2), resume: 0)
        guard case .processBatch(let first) = machine.received(self.message(1), now: Self.start) else { throw Failure("batch") }
        #expect(first.count == 1)
        for id in 2...5 as ClosedRange<UInt64> { _ = machine.received(self.message(id), now: Self.start) }
        #expect(machine.holdsReads, "4 wait: the inbox's limit")
        #expect(machine.batchEnded(now: Self.start)?.map(\.message.id) == [2], "one token left of the burst of 2")
        #expect(machine.batchEnded(now: Self.start) == nil, "no token: wait")
        let next364 = machine.nextDeadline(now: Self.start)
        #expect(next364 == Self.start + .milliseconds(500))
        #expect(machine.timerFired(now: Self.start + .milliseconds(500)).batch?.map(\.message.id) == [3])
        _ = machine.batchEnded(now: Self.start + .milliseconds(500))
        #expect(machine.timerFired(now: Self.start + .seconds(2)).batch?.map(\.message.id) == [4, 5])
        #expect(!machine.holdsReads)
    }

    @Test("the delivery pump starts with a read and the resume point's record; acknowledgements are recorded")
    func pump() throws {
        var machine = Machine(configuration: Self.configuration(), now: Self.start)
        var hello = Self.hello
        hello.features = [.checksum, .reliableDelivery]
        hello.outboxEpoch = 1
        _ = machine.received(Frame(.hello(hello), flags: .checksum), now: Self.start)
        let policy = Handshake.GatewayPolicy(
            features: [.checksum, .reliableDelivery],
            heartbeatInterval: .seconds(10),
            idleTimeout: .seconds(30),
            maxBodySize: 1 << 20,
            maxConcurrentRequests: 2,
            deliveryEpoch: 9
        )
        let (_, negotiated) = try Handshake.accept(hello, policy: policy, connectionID: 1).get()
        let succeeded = machine.handshakeSucceeded(.init(negotiated: negotiated, resume: 3), now: Self.start)
        let start = try #require(succeeded)
        #expect(start?.fetch?.after == 3 && start?.fetch?.limit == 4 && start?.record == 3)
        let delivery = StoredDelivery(sequence: 4, topic: "t", body: ByteBuffer())
        #expect(machine.deliveriesFetched([delivery], limit: 4)?.send == [delivery])
        guard case .pump(let actions) = machine.received(Frame(.deliveryAck(.init(sequence: 4)), flags: .checksum), now: Self.start) else {
            throw Failure("a DELIVERY_ACK goes to the pump")
        }
        #expect(actions.record == nil, "the resume point's record is still being written")
        #expect(machine.acknowledgementRecorded(true)?.record == 4)
    }
}

@Suite("Handshake: client ids")
struct HandshakeClientIDTests {
    @Test("a client id starting with $ is refused (reserved for the gateway's records); others are accepted")
    func reservedClientIDs() throws {
        let policy = Handshake.GatewayPolicy(
            features: .checksum,
            heartbeatInterval: .seconds(10),
            idleTimeout: .seconds(30),
            maxBodySize: 1 << 20,
            maxConcurrentRequests: 8,
            deliveryEpoch: nil
        )
        var hello = GatewayConnectionStateMachineTests.hello
        for (clientID, refused) in [("$api", true), ("$", true), ("alice", false), ("a$b", false)] {
            hello.clientID = clientID
            switch Handshake.accept(hello, policy: policy, connectionID: 1) {
            case .success:
                #expect(!refused, "\(clientID)")
            case .failure(let error):
                #expect(refused && error.code == .invalidRequest && error.message.contains("reserved"), "\(clientID): \(error)")
            }
        }
    }
}
