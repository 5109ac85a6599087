import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOPosix
import Testing
import TetherTestSupport

@testable import Tether
@testable import TetherCore

private let defaultHello = Frame.Hello(versions: 1...1, features: .checksum, maxBodySize: 1 << 20, clientID: "alice")
private let welcome = Frame.Welcome(
    version: 1,
    features: .checksum,
    connectionID: 1,
    heartbeatInterval: .seconds(10),
    idleTimeout: .seconds(30),
    maxBodySize: 1 << 20,
    maxConcurrentRequests: 16
)

/// The client's connection handler on an `EmbeddedChannel`, with virtual time. The channel
/// carries bytes, as a socket would: the fixture encodes the frames it writes in and decodes
/// the bytes the handler writes out.
final class ClientHandlerFixture {
    let loop = EmbeddedEventLoop()
    let channel: EmbeddedChannel
    let established: EventLoopPromise<Handshake.Negotiated>
    let closed: EventLoopPromise<ConnectionClosure>
    let handler: ClientConnectionHandler
    let pushes = NIOLockedValueBox<[Frame.Push]>([])
    let goAways = NIOLockedValueBox<[Frame.GoAway]>([])
    /// The heartbeat mode the "app" wants.
    let heartbeatMode = NIOLockedValueBox(HeartbeatMode.foreground)
    /// What NAT-timeout probing would say the network tolerates.
    let learnedInterval = NIOLockedValueBox<Duration?>(nil)
    /// The idle probes reported, with whether each was answered.
    let idleProbes = NIOLockedValueBox<[(HeartbeatStateMachine.IdleProbe, Bool)]>([])
    let hello: Frame.Hello

    init(
        handshakeTimeout: Duration = .seconds(5),
        heartbeatTimeout: Duration = .seconds(5),
        hello: Frame.Hello = defaultHello,
        reliability: ClientConnectionStateMachine.Configuration.Reliability? = nil,
        reliable: ReliableCallbacks? = nil
    ) throws {
        self.hello = hello
        self.channel = EmbeddedChannel(loop: self.loop)
        self.established = self.loop.makePromise()
        self.closed = self.loop.makePromise()
        let pushes = self.pushes
        let goAways = self.goAways
        self.handler = ClientConnectionHandler(
            configuration: .init(
                hello: hello,
                handshakeTimeout: handshakeTimeout,
                heartbeat: HeartbeatPolicy(timeout: heartbeatTimeout, minimumTimeout: heartbeatTimeout),
                reliability: reliability
            ),
            maxInboundBodySize: 1 << 20,
            framing: .byteStream,
            clock: EventLoopClock(self.loop),
            callbacks: .init(
                push: { push in pushes.withLockedValue { $0.append(push) } },
                goAway: { goAway in goAways.withLockedValue { $0.append(goAway) } },
                reliable: reliable,
                heartbeatPreference: { [heartbeatMode, learnedInterval] in
                    .init(mode: heartbeatMode.withLockedValue { $0 }, learnedInterval: learnedInterval.withLockedValue { $0 })
                },
                idleProbe: { [idleProbes] probe, answered in idleProbes.withLockedValue { $0.append((probe, answered)) } }
            ),
            established: self.established,
            closed: self.closed,
            logger: testLogger("handler")
        )
        try self.channel.pipeline.syncOperations.addHandler(self.handler)
        try self.channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
    }

    /// Decoded frames of a write that ``readFrame()`` has not returned yet.
    private var unread: [Frame] = []

    /// The next frame the handler wrote and flushed (a write may hold several).
    func readFrame() throws -> Frame? {
        if self.unread.isEmpty {
            guard var bytes = try self.channel.readOutbound(as: ByteBuffer.self) else { return nil }
            var decoder = FrameDecoder(maxBodySize: 1 << 20)
            while let frame = try decoder.decodeFrame(from: &bytes) { self.unread.append(frame) }
            #expect(bytes.readableBytes == 0, "whole frames only")
        }
        return self.unread.isEmpty ? nil : self.unread.removeFirst()
    }

    /// Delivers `frame` to the handler as bytes, in one read.
    func writeInbound(_ frame: Frame) throws {
        try self.channel.writeInbound(try FrameEncoder().encode(frame, allocator: self.channel.allocator))
    }

    func establish(welcome: Frame.Welcome = welcome) throws {
        #expect(try self.readFrame()?.payload == .hello(self.hello))
        try self.writeInbound(Frame(.welcome(welcome), flags: .checksum))
        #expect(try self.established.futureResult.wait().connectionID == 1)
    }

    /// Sends a request as a caller on the event loop does, then lets the loop finish its batch
    /// (where the flush of a request sent with others in flight waits).
    func request(id: UInt64, timeout: Duration = .seconds(30)) -> EventLoopFuture<ByteBuffer> {
        let future = self.requestWithoutRunningLoop(id: id, timeout: timeout)
        self.loop.run()
        return future
    }

    func requestWithoutRunningLoop(id: UInt64, timeout: Duration = .seconds(30)) -> EventLoopFuture<ByteBuffer> {
        let promise = self.loop.makePromise(of: ByteBuffer.self)
        self.handler.sendRequest(
            .init(id: id, method: "m", body: ByteBuffer()),
            deadline: EventLoopClock(self.loop).now + timeout,
            waiter: .promise(promise)
        )
        return promise.futureResult
    }

    func closure() throws -> ConnectionClosure? {
        let result = NIOLockedValueBox<ConnectionClosure?>(nil)
        self.closed.futureResult.whenSuccess { closure in result.withLockedValue { $0 = closure } }
        self.loop.run()
        return result.withLockedValue { $0 }
    }
}

@Suite("Client connection handler")
struct ClientConnectionHandlerTests {
    @Test("sends HELLO with a checksum as soon as the channel is active")
    func sendsHello() throws {
        let fixture = try ClientHandlerFixture()
        let frame = try fixture.readFrame()
        #expect(frame?.payload == .hello(defaultHello) && frame?.flags == .checksum)
        _ = try? fixture.channel.finish()
    }

    @Test("no WELCOME within the handshake timeout fails the handshake and closes")
    func handshakeTimeout() throws {
        let fixture = try ClientHandlerFixture(handshakeTimeout: .seconds(2))
        _ = try fixture.readFrame()
        fixture.loop.advanceTime(by: .milliseconds(1999))
        #expect(fixture.channel.isActive)
        fixture.loop.advanceTime(by: .milliseconds(1))
        #expect(!fixture.channel.isActive)
        #expect(throws: TetherError.self) { try fixture.established.futureResult.wait() }
        #expect(try fixture.closure()?.uptime == .zero)
    }

    @Test("an idle link is pinged each interval; a PONG keeps it alive")
    func heartbeat() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()
        fixture.loop.advanceTime(by: .seconds(9))
        #expect(try fixture.readFrame() == nil)
        fixture.loop.advanceTime(by: .seconds(1))
        guard case .ping(let ping)? = try fixture.readFrame()?.payload else {
            Issue.record("expected a PING after one interval")
            return
        }
        fixture.loop.advanceTime(by: .seconds(1))
        try fixture.writeInbound(Frame(.pong(ping), flags: .checksum))
        fixture.loop.advanceTime(by: .seconds(8))
        #expect(fixture.channel.isActive, "the PONG proved the link alive")
        fixture.loop.advanceTime(by: .seconds(1))
        #expect(try fixture.readFrame()?.type == .ping, "next PING one interval after the last one")
        _ = try? fixture.channel.finish()
    }

    @Test("background mode pings as rarely as the gateway's idle timeout allows; foreground again uses its interval")
    func heartbeatModes() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()  // the gateway: interval 10 s, idle timeout 30 s
        fixture.heartbeatMode.withLockedValue { $0 = .background }
        fixture.handler.refreshHeartbeatMode()
        fixture.loop.advanceTime(by: .seconds(14))
        #expect(try fixture.readFrame() == nil, "no PING at 10 s in the background")
        fixture.loop.advanceTime(by: .seconds(1))
        guard case .ping(let ping)? = try fixture.readFrame()?.payload else {
            Issue.record("expected a PING at half the idle timeout")
            return
        }
        try fixture.writeInbound(Frame(.pong(ping), flags: .checksum))
        fixture.loop.advanceTime(by: .seconds(5))
        fixture.heartbeatMode.withLockedValue { $0 = .foreground }
        fixture.handler.refreshHeartbeatMode()
        guard case .ping(let probe)? = try fixture.readFrame()?.payload else {
            Issue.record("expected a PING at once: back in the foreground, the link is checked now")
            return
        }
        try fixture.writeInbound(Frame(.pong(probe), flags: .checksum))
        fixture.loop.advanceTime(by: .seconds(9))
        #expect(try fixture.readFrame() == nil)
        fixture.loop.advanceTime(by: .seconds(1))
        #expect(try fixture.readFrame()?.type == .ping, "the gateway's interval again")
        _ = try? fixture.channel.finish()
    }

    @Test("back in the foreground, a link that died in the background is found within one PONG timeout")
    func foregroundProbeFindsDeadLink() throws {
        let fixture = try ClientHandlerFixture(heartbeatTimeout: .seconds(2))
        try fixture.establish()
        fixture.heartbeatMode.withLockedValue { $0 = .background }
        fixture.handler.refreshHeartbeatMode()
        fixture.loop.advanceTime(by: .seconds(3))
        fixture.heartbeatMode.withLockedValue { $0 = .foreground }
        fixture.handler.refreshHeartbeatMode()
        #expect(try fixture.readFrame()?.type == .ping)
        fixture.loop.advanceTime(by: .seconds(2))
        #expect(!fixture.channel.isActive, "no answer within 2 s: dead, 5 s after the app came back")
        guard case .heartbeatTimeout? = try fixture.closure()?.reason else {
            Issue.record("expected a heartbeat timeout")
            return
        }
        #expect(fixture.idleProbes.withLockedValue { $0.isEmpty }, "a probe on demand says nothing about the NAT")
    }

    @Test("NAT-timeout probing: the learned interval caps the heartbeat, and idle probes are reported answered or not")
    func idleProbesReported() throws {
        let fixture = try ClientHandlerFixture(heartbeatTimeout: .seconds(2))
        fixture.learnedInterval.withLockedValue { $0 = .seconds(12) }
        fixture.heartbeatMode.withLockedValue { $0 = .background }
        try fixture.establish()  // the gateway allows 15 s in the background; the network 12 s
        fixture.loop.advanceTime(by: .seconds(11))
        #expect(try fixture.readFrame() == nil)
        fixture.loop.advanceTime(by: .seconds(1))
        guard case .ping(let ping)? = try fixture.readFrame()?.payload else {
            Issue.record("expected a PING at the learned interval")
            return
        }
        fixture.loop.advanceTime(by: .milliseconds(40))
        try fixture.writeInbound(Frame(.pong(ping), flags: .checksum))
        var reports = fixture.idleProbes.withLockedValue { $0 }
        #expect(reports.count == 1 && reports[0].0.interval == .seconds(12) && reports[0].1, "answered")

        // The prober grows the interval to 14 s: the next PING waits that long, and dies.
        fixture.learnedInterval.withLockedValue { $0 = .seconds(14) }
        fixture.handler.refreshHeartbeatMode()
        fixture.loop.advanceTime(by: .seconds(14))
        #expect(try fixture.readFrame()?.type == .ping)
        fixture.loop.advanceTime(by: .seconds(2))
        #expect(!fixture.channel.isActive)
        reports = fixture.idleProbes.withLockedValue { $0 }
        #expect(reports.count == 2 && reports[1].0.interval == .seconds(14) && !reports[1].1, "unanswered")
        _ = try fixture.closure()
        #expect(fixture.idleProbes.withLockedValue { $0.count } == 2, "reported once, not again when the channel closes")
    }

    @Test("a connection reset while an idle probe waits is the probe's failure; a close the client asked for is not")
    func idleProbeReset() throws {
        let fixture = try ClientHandlerFixture(heartbeatTimeout: .seconds(2))
        try fixture.establish()
        fixture.loop.advanceTime(by: .seconds(10))
        #expect(try fixture.readFrame()?.type == .ping)
        fixture.channel.pipeline.fireErrorCaught(IOError(errnoCode: 104, reason: "read"))  // ECONNRESET
        #expect(!fixture.channel.isActive)
        let reports = fixture.idleProbes.withLockedValue { $0 }
        #expect(reports.count == 1 && reports[0].0.interval == .seconds(10) && !reports[0].1)

        let other = try ClientHandlerFixture(heartbeatTimeout: .seconds(2))
        try other.establish()
        other.loop.advanceTime(by: .seconds(10))
        #expect(try other.readFrame()?.type == .ping)
        other.handler.closeAtClientRequest()
        other.loop.run()
        #expect(!other.channel.isActive)
        #expect(other.idleProbes.withLockedValue { $0.isEmpty })
    }

    @Test("no frame within the PONG timeout: the link is dead and the connection closes")
    func deadLink() throws {
        let fixture = try ClientHandlerFixture(heartbeatTimeout: .seconds(3))
        try fixture.establish()
        fixture.loop.advanceTime(by: .seconds(10))
        #expect(try fixture.readFrame()?.type == .ping)
        fixture.loop.advanceTime(by: .milliseconds(2999))
        #expect(fixture.channel.isActive)
        fixture.loop.advanceTime(by: .milliseconds(1))
        #expect(!fixture.channel.isActive)
        guard case .heartbeatTimeout(let silence)? = try fixture.closure()?.reason else {
            Issue.record("expected a heartbeat timeout")
            return
        }
        #expect(silence == .seconds(13))
    }

    @Test("responses complete their own requests, in any order; unknown ids are ignored")
    func correlation() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()
        let first = fixture.request(id: 1)
        let second = fixture.request(id: 2)
        #expect(try fixture.readFrame()?.type == .request)
        #expect(try fixture.readFrame()?.type == .request)
        try fixture.writeInbound(Frame(.response(.init(id: 99, body: ByteBuffer(string: "stray"))), flags: .checksum))
        try fixture.writeInbound(Frame(.response(.init(id: 2, body: ByteBuffer(string: "two"))), flags: .checksum))
        try fixture.writeInbound(
            Frame(.response(.init(id: 1, status: .invalidRequest, message: "bad")), flags: .checksum)
        )
        #expect(try second.wait().string == "two")
        do {
            _ = try first.wait()
            Issue.record("expected a server error")
        } catch let error as TetherError {
            #expect(error.code == .serverError && error.status == .invalidRequest && error.message == "bad")
        }
        _ = try? fixture.channel.finish()
    }

    @Test("on the loop: a request alone leaves at once; with others in flight, all leave in one flush at the end of the batch")
    func onLoopFlushCoalescing() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()
        let first = fixture.requestWithoutRunningLoop(id: 1)
        #expect(try fixture.readFrame()?.payload == .request(.init(id: 1, method: "m")))
        // Two more while the first is on the wire: written, not yet flushed.
        let second = fixture.requestWithoutRunningLoop(id: 2)
        let third = fixture.requestWithoutRunningLoop(id: 3)
        #expect(try fixture.readFrame() == nil)
        fixture.loop.run()
        #expect(try fixture.readFrame()?.payload == .request(.init(id: 2, method: "m")))
        #expect(try fixture.readFrame()?.payload == .request(.init(id: 3, method: "m")))
        for id: UInt64 in 1...3 {
            try fixture.writeInbound(Frame(.response(.init(id: id, body: ByteBuffer(string: "\(id)"))), flags: .checksum))
        }
        #expect(try [first, second, third].map { try $0.wait().string } == ["1", "2", "3"])
        // Nothing in flight again: the next one leaves at once.
        _ = fixture.requestWithoutRunningLoop(id: 4)
        #expect(try fixture.readFrame()?.payload == .request(.init(id: 4, method: "m")))
        _ = try? fixture.channel.finish()
    }

    @Test("a long batch of requests on the loop leaves in chunks: every 64th written request flushes at once")
    func onLoopFlushChunks() throws {
        let fixture = try ClientHandlerFixture()
        var roomy = welcome
        roomy.maxConcurrentRequests = 1000
        try fixture.establish(welcome: roomy)
        _ = fixture.requestWithoutRunningLoop(id: 1)
        #expect(try fixture.readFrame()?.payload == .request(.init(id: 1, method: "m")))
        for id: UInt64 in 2...150 { _ = fixture.requestWithoutRunningLoop(id: id) }
        func flushedIDs() throws -> [UInt64] {
            var ids: [UInt64] = []
            while let frame = try fixture.readFrame() {
                guard case .request(let request) = frame.payload else { Issue.record("expected REQUEST, got \(frame.type)"); continue }
                ids.append(request.id)
            }
            return ids
        }
        #expect(try flushedIDs() == Array(2...129), "two chunks of 64 left without waiting for the end of the batch")
        fixture.loop.run()
        #expect(try flushedIDs() == Array(130...150), "the rest at the end of the batch")
        _ = try? fixture.channel.finish()
    }

    @Test("a request's deadline fails it with timedOut and sends CANCEL")
    func requestDeadline() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()
        let response = fixture.request(id: 7, timeout: .seconds(2))
        #expect(try fixture.readFrame()?.type == .request)
        fixture.loop.advanceTime(by: .seconds(2))
        #expect(throws: TetherError.self) { try response.wait() }
        #expect(try fixture.readFrame()?.payload == .cancel(.init(requestID: 7)))
        _ = try? fixture.channel.finish()
    }

    @Test("one timer serves every request's deadline: each fails at its own; an answered one never")
    func requestDeadlines() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()
        let responses = [(1, 3), (2, 1), (3, 2)].map { id, seconds in fixture.request(id: UInt64(id), timeout: .seconds(Int64(seconds))) }
        for _ in 1...3 { #expect(try fixture.readFrame()?.type == .request) }
        try fixture.writeInbound(Frame(.response(.init(id: 3, body: ByteBuffer(string: "ok"))), flags: .checksum))
        #expect(try responses[2].wait() == ByteBuffer(string: "ok"))
        var failed: [UInt64] = []
        for _ in 1...6 {
            fixture.loop.advanceTime(by: .milliseconds(500))
            while case .cancel(let cancel)? = try fixture.readFrame()?.payload { failed.append(cancel.requestID) }
        }
        #expect(failed == [2, 1])
        for response in responses[0...1] {
            #expect(throws: TetherError.self) { try response.wait() }
        }
        _ = try? fixture.channel.finish()
    }

    @Test("pushes go to the callback; PINGs are answered")
    func pushesAndPings() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()
        try fixture.writeInbound(Frame(.push(.init(topic: "t", body: ByteBuffer(string: "x"))), flags: .checksum))
        #expect(fixture.pushes.withLockedValue { $0 } == [.init(topic: "t", body: ByteBuffer(string: "x"))])
        try fixture.writeInbound(Frame(.ping(.init(id: 5)), flags: .checksum))
        #expect(try fixture.readFrame()?.payload == .pong(.init(id: 5)))
        _ = try? fixture.channel.finish()
    }

    @Test("GOAWAY: no new requests, the request in flight finishes, then the client closes")
    func goAway() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()
        let inFlight = fixture.request(id: 1)
        _ = try fixture.readFrame()
        let goAway = Frame.GoAway(reason: .shutdown, retryAfter: .seconds(1))
        try fixture.writeInbound(Frame(.goAway(goAway), flags: .checksum))
        #expect(fixture.goAways.withLockedValue { $0 } == [goAway])
        let late = fixture.request(id: 2)
        do {
            _ = try late.wait()
        } catch let error as TetherError {
            #expect(error.code == .notDispatched, "sent again on the next connection by the client")
        }
        #expect(fixture.channel.isActive)
        try fixture.writeInbound(Frame(.response(.init(id: 1, body: ByteBuffer(string: "done"))), flags: .checksum))
        #expect(try inFlight.wait().string == "done")
        #expect(!fixture.channel.isActive, "the client closes once drained")
        guard case .goingAway? = try fixture.closure()?.reason else {
            Issue.record("expected goingAway")
            return
        }
    }

    @Test("no more requests on the wire than WELCOME's max concurrent requests; the rest wait their turn")
    func concurrencyLimit() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()  // WELCOME grants 16 slots
        let responses = (1...20).map { fixture.request(id: UInt64($0)) }
        var sent: [UInt64] = []
        while case .request(let request)? = try fixture.readFrame()?.payload { sent.append(request.id) }
        #expect(sent == Array(1...16))

        // An answer frees a slot for the next in line.
        try fixture.writeInbound(Frame(.response(.init(id: 3, body: ByteBuffer(string: "three"))), flags: .checksum))
        #expect(try responses[2].wait().string == "three")
        #expect(try fixture.readFrame()?.payload == .request(.init(id: 17, method: "m")))

        // A queued request that is cancelled was never sent: no CANCEL goes out.
        fixture.handler.cancelRequest(id: 19)
        #expect(throws: TetherError.self) { try responses[18].wait() }
        #expect(try fixture.readFrame() == nil)

        // A sent one that is cancelled gets a CANCEL, and its slot goes to the next in line (18).
        fixture.handler.cancelRequest(id: 5)
        #expect(try fixture.readFrame()?.payload == .cancel(.init(requestID: 5)))
        #expect(try fixture.readFrame()?.payload == .request(.init(id: 18, method: "m")))

        // GOAWAY: what is still queued (20) was never sent, so it can go on the next connection.
        try fixture.writeInbound(Frame(.goAway(.init(reason: .shutdown)), flags: .checksum))
        do {
            _ = try responses[19].wait()
            Issue.record("expected notDispatched")
        } catch let error as TetherError {
            #expect(error.code == .notDispatched)
        }
        // The requests on the wire are lost with the connection.
        _ = try? fixture.channel.finish()
        do {
            _ = try responses[0].wait()
            Issue.record("expected connectionLost")
        } catch let error as TetherError {
            #expect(error.code == .connectionLost)
        }
    }

    @Test("a protocol violation by the gateway gets ERROR and a close; requests in flight fail with connectionLost")
    func violation() throws {
        let fixture = try ClientHandlerFixture()
        try fixture.establish()
        let inFlight = fixture.request(id: 1)
        _ = try fixture.readFrame()
        try fixture.writeInbound(Frame(.request(.init(id: 1, method: "reverse")), flags: .checksum))
        guard case .error(let report)? = try fixture.readFrame()?.payload else {
            Issue.record("expected ERROR")
            return
        }
        #expect(report.code == .unexpectedFrame)
        fixture.loop.run()
        #expect(!fixture.channel.isActive)
        do {
            _ = try inFlight.wait()
            Issue.record("expected connectionLost")
        } catch let error as TetherError {
            #expect(error.code == .connectionLost)
        }
    }
}

@Suite("Client connection handler, reliable messages")
struct ClientReliableHandlerTests {
    func record(_ id: UInt64) -> OutboxRecord {
        OutboxRecord(
            id: id,
            topic: "t",
            conversation: "c",
            sequence: id,
            priority: .normal,
            expiresAt: nil,
            body: ByteBuffer(string: "\(id)")
        )
    }

    @Test("one timer sends each unacknowledged message again at its own retransmission timeout; an acknowledged one never")
    func retransmissionTimer() throws {
        var reliableHello = defaultHello
        reliableHello.features.insert(.reliableDelivery)
        reliableHello.outboxEpoch = 5
        // Every timeout is at least 1 s, whatever the RTT samples say; each retransmission doubles it.
        let fixture = try ClientHandlerFixture(
            hello: reliableHello,
            reliability: .init(window: 100, retransmission: RTTEstimator(initialTimeout: .seconds(1), minimumTimeout: .seconds(1))),
            reliable: ReliableCallbacks(acknowledged: { _ in }, sent: { _ in }, delivery: { _, _ in .accepted })
        )
        var reliableWelcome = welcome
        reliableWelcome.features.insert(.reliableDelivery)
        reliableWelcome.deliveryEpoch = 7
        try fixture.establish(welcome: reliableWelcome)
        func sent() throws -> [UInt64] {
            var ids: [UInt64] = []
            while let frame = try fixture.readFrame() {
                if case .message(let message) = frame.payload { ids.append(message.id) }
            }
            return ids
        }
        func acknowledge(_ ids: UInt64...) throws {
            try fixture.writeInbound(Frame(.messageAck(.init(entries: ids.map { .init(id: $0) })), flags: .checksum))
        }

        fixture.handler.enqueueMessages((1...3).map(self.record))  // t = 0: due at 1 s
        #expect(try sent() == [1, 2, 3])
        try acknowledge(2)
        fixture.loop.advanceTime(by: .milliseconds(500))
        fixture.handler.enqueueMessages([self.record(4)])  // due at 1.5 s
        #expect(try sent() == [4])

        fixture.loop.advanceTime(by: .milliseconds(499))
        #expect(try sent() == [])
        fixture.loop.advanceTime(by: .milliseconds(1))  // t = 1 s: 1 and 3 again, next due at 3 s
        #expect(try sent() == [1, 3])
        fixture.loop.advanceTime(by: .milliseconds(500))  // t = 1.5 s: 4 again, next due at 3.5 s
        #expect(try sent() == [4])
        try acknowledge(1, 3)
        fixture.loop.advanceTime(by: .seconds(2))  // t = 3.5 s
        #expect(try sent() == [4])
        #expect(fixture.channel.isActive)
        _ = try? fixture.channel.finish()
    }

    @Test("messages go only while the channel is writable; PONGs and DELIVERY_ACKs never wait behind them")
    func controlFramesFirst() throws {
        let acknowledged = NIOLockedValueBox<[UInt64]>([])
        var reliableHello = defaultHello
        reliableHello.features.insert(.reliableDelivery)
        reliableHello.outboxEpoch = 5
        let fixture = try ClientHandlerFixture(
            hello: reliableHello,
            reliability: .init(window: 100, retransmission: RTTEstimator()),
            reliable: ReliableCallbacks(
                acknowledged: { entries in acknowledged.withLockedValue { $0 += entries.map(\.id) } },
                sent: { _ in },
                delivery: { _, _ in .accepted }
            )
        )
        var reliableWelcome = welcome
        reliableWelcome.features.insert(.reliableDelivery)
        reliableWelcome.deliveryEpoch = 7
        try fixture.establish(welcome: reliableWelcome)

        // The socket's buffer is full: queued messages stay in the scheduler, not in the channel.
        fixture.channel.isWritable = false
        fixture.handler.enqueueMessages((1...50).map(self.record))
        #expect(try fixture.readFrame() == nil, "no message is written while the channel is not writable")

        // Control frames still go out at once.
        try fixture.writeInbound(Frame(.ping(.init(id: 9)), flags: .checksum))
        #expect(try fixture.readFrame()?.payload == .pong(.init(id: 9)))
        fixture.handler.acknowledgeDeliveries(upTo: 3)
        #expect(try fixture.readFrame()?.payload == .deliveryAck(.init(sequence: 3)))
        #expect(try fixture.readFrame() == nil)

        // Writable again: the messages follow, in order, up to the window.
        fixture.channel.isWritable = true
        fixture.channel.pipeline.fireChannelWritabilityChanged()
        var sent: [UInt64] = []
        while let frame = try fixture.readFrame() {
            guard case .message(let message) = frame.payload else { continue }
            sent.append(message.id)
        }
        #expect(sent == Array(1...50))
        try fixture.writeInbound(Frame(.messageAck(.init(entries: [.init(id: 1, status: .ok)])), flags: .checksum))
        #expect(acknowledged.withLockedValue { $0 } == [1])
        _ = try? fixture.channel.finish()
    }
}
