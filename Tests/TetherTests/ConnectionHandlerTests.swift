import Logging
import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import NIOPosix
import Testing

@testable import Tether
@testable import TetherCore
@testable import TetherGateway
@testable import TetherNIO

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

/// The client's protocol handler on an `EmbeddedChannel`, with virtual time.
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
        handshakeTimeout: TimeAmount = .seconds(5),
        heartbeatTimeout: TimeAmount = .seconds(5),
        hello: Frame.Hello = defaultHello,
        reliability: (window: Int, retransmission: RTTEstimator)? = nil,
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
                heartbeat: try .init(
                    timeout: Duration(heartbeatTimeout),
                    minimumTimeout: Duration(heartbeatTimeout),
                    jitter: 0,
                    suspensionThreshold: nil
                ),
                maxInboundBodySize: 1 << 20,
                reliability: reliability
            ),
            callbacks: .init(
                push: { push in pushes.withLockedValue { $0.append(push) } },
                goAway: { goAway in goAways.withLockedValue { $0.append(goAway) } },
                reliable: reliable,
                heartbeatMode: { [heartbeatMode] in heartbeatMode.withLockedValue { $0 } },
                learnedInterval: { [learnedInterval] in learnedInterval.withLockedValue { $0 } },
                idleProbe: { [idleProbes] probe, answered in idleProbes.withLockedValue { $0.append((probe, answered)) } }
            ),
            established: self.established,
            closed: self.closed,
            logger: testLogger("handler")
        )
        try self.channel.pipeline.syncOperations.addHandler(self.handler)
        try self.channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
    }

    func readFrame() throws -> Frame? { try self.channel.readOutbound(as: Frame.self) }

    func establish(welcome: Frame.Welcome = welcome) throws {
        #expect(try self.readFrame()?.payload == .hello(self.hello))
        try self.channel.writeInbound(Frame(.welcome(welcome), flags: .checksum))
        #expect(try self.established.futureResult.wait().connectionID == 1)
    }

    /// Sends a request as a caller on the event loop does, then lets the loop finish its batch
    /// (where the flush of a request sent with others in flight waits).
    func request(id: UInt64, timeout: TimeAmount = .seconds(30)) -> EventLoopFuture<ByteBuffer> {
        let future = self.requestWithoutRunningLoop(id: id, timeout: timeout)
        self.loop.run()
        return future
    }

    func requestWithoutRunningLoop(id: UInt64, timeout: TimeAmount = .seconds(30)) -> EventLoopFuture<ByteBuffer> {
        let promise = self.loop.makePromise(of: ByteBuffer.self)
        self.handler.sendRequest(
            .init(id: id, method: "m", body: ByteBuffer()),
            deadline: self.loop.now + timeout,
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
        try fixture.channel.writeInbound(Frame(.pong(ping), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.pong(ping), flags: .checksum))
        fixture.loop.advanceTime(by: .seconds(5))
        fixture.heartbeatMode.withLockedValue { $0 = .foreground }
        fixture.handler.refreshHeartbeatMode()
        guard case .ping(let probe)? = try fixture.readFrame()?.payload else {
            Issue.record("expected a PING at once: back in the foreground, the link is checked now")
            return
        }
        try fixture.channel.writeInbound(Frame(.pong(probe), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.pong(ping), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.response(.init(id: 99, body: ByteBuffer(string: "stray"))), flags: .checksum))
        try fixture.channel.writeInbound(Frame(.response(.init(id: 2, body: ByteBuffer(string: "two"))), flags: .checksum))
        try fixture.channel.writeInbound(
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
            try fixture.channel.writeInbound(Frame(.response(.init(id: id, body: ByteBuffer(string: "\(id)"))), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.response(.init(id: 3, body: ByteBuffer(string: "ok"))), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.push(.init(topic: "t", body: ByteBuffer(string: "x"))), flags: .checksum))
        #expect(fixture.pushes.withLockedValue { $0 } == [.init(topic: "t", body: ByteBuffer(string: "x"))])
        try fixture.channel.writeInbound(Frame(.ping(.init(id: 5)), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.goAway(goAway), flags: .checksum))
        #expect(fixture.goAways.withLockedValue { $0 } == [goAway])
        let late = fixture.request(id: 2)
        do {
            _ = try late.wait()
        } catch let error as TetherError {
            #expect(error.code == .notDispatched, "sent again on the next connection by the client")
        }
        #expect(fixture.channel.isActive)
        try fixture.channel.writeInbound(Frame(.response(.init(id: 1, body: ByteBuffer(string: "done"))), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.response(.init(id: 3, body: ByteBuffer(string: "three"))), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.goAway(.init(reason: .shutdown)), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.request(.init(id: 1, method: "reverse")), flags: .checksum))
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

/// The gateway's protocol handler on an `EmbeddedChannel`, with virtual time.
final class GatewayHandlerFixture {
    let loop = EmbeddedEventLoop()
    let channel: EmbeddedChannel
    let requests = RequestRegistry()
    let handler: GatewayConnectionHandler
    /// The loop's push batcher, which the handler drains before its own writes.
    let pushes: PushBatcher

    init(handshake: TimeAmount = .seconds(10), handler: TimeAmount = .seconds(30), idle: TimeAmount = .seconds(30)) throws {
        self.channel = EmbeddedChannel(loop: self.loop)
        self.pushes = PushBatcher(loop: self.loop)
        self.handler = GatewayConnectionHandler(
            configuration: .init(
                handshakeTimeout: handshake,
                handlerTimeout: handler,
                idleTimeout: idle,
                shutdownGracePeriod: .seconds(5),
                maxInboundBodySize: 1 << 20,
                maxBufferedOutboundBytes: 4 << 20
            ),
            requests: self.requests,
            pushes: self.pushes,
            logger: testLogger("gateway-handler")
        )
        // As in production, the encoder sits below the protocol handler: the channel holds bytes.
        try self.channel.pipeline.syncOperations.addHandler(FrameEncodingHandler())
        try self.channel.pipeline.syncOperations.addHandler(self.handler)
        try self.channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
    }

    /// Starts a stand-in handler for request `id`, as the application layer would, that runs
    /// until its task is cancelled; the task's value says whether it was (`nil`: not started).
    /// On the main actor, like the tests that use it, so that the `EmbeddedEventLoop` is only
    /// ever used from one thread.
    @MainActor
    func startHandler(_ id: UInt64) async -> Task<Bool?, Never> {
        let (started, running) = AsyncStream.makeStream(of: Void.self)
        let requests = self.requests
        let task = Task {
            await requests.run(id) {
                running.yield()
                try? await Task.sleep(for: .seconds(600))
                return Task.isCancelled
            }
        }
        var iterator = started.makeAsyncIterator()
        await iterator.next()
        return task
    }

    func establish() throws {
        try self.channel.writeInbound(Frame(.hello(defaultHello), flags: .checksum))
        #expect(try self.channel.readInbound(as: Frame.self)?.type == .hello)
        self.send(Frame(.welcome(welcome)))
        let sent = try self.readOutbound()
        #expect(sent?.type == .welcome && sent?.flags == .checksum)
    }

    /// The first half of the handshake of a small client: HELLO without checksums and with a
    /// body limit of `maxBodySize`, passed up to the application layer.
    func helloWithoutChecksums(maxBodySize: UInt32) throws {
        try self.channel.writeInbound(
            Frame(.hello(.init(versions: 1...1, features: [], maxBodySize: maxBodySize, clientID: "small")), flags: .checksum)
        )
        _ = try self.channel.readInbound(as: Frame.self)
    }

    /// The second half: the application layer's WELCOME without checksums, sent.
    func welcomeWithoutChecksums() throws {
        var plainWelcome = welcome
        plainWelcome.features = []
        self.send(Frame(.welcome(plainWelcome)))
        #expect(try self.readOutbound()?.type == .welcome)
    }

    /// Writes and flushes `frame` as the application layer does, and runs the loop: the handler
    /// flushes at the end of the loop's batch of work.
    func send(_ frame: Frame) {
        self.channel.writeAndFlush(frame, promise: nil)
        self.loop.run()
    }

    /// Frames of a write that ``readOutbound()`` has not returned yet.
    private var unread: [Frame] = []

    /// The next frame the handler wrote, decoded from the bytes the encoder produced (a write
    /// may hold several frames).
    func readOutbound() throws -> Frame? {
        if self.unread.isEmpty {
            guard let frames = try self.readOutboundWrite() else { return nil }
            self.unread = frames
        }
        return self.unread.isEmpty ? nil : self.unread.removeFirst()
    }

    /// The frames of the next write, decoded from the bytes the encoder produced.
    func readOutboundWrite() throws -> [Frame]? {
        #expect(self.unread.isEmpty, "the frames of the previous write were all read")
        guard var bytes = try self.channel.readOutbound(as: ByteBuffer.self) else { return nil }
        var decoder = FrameDecoder(maxBodySize: 1 << 20)
        var frames: [Frame] = []
        while let frame = try decoder.decodeFrame(from: &bytes) { frames.append(frame) }
        #expect(bytes.readableBytes == 0, "whole frames only")
        return frames
    }

    /// This connection as the only recipient of a push, as the registry groups it.
    func recipients() -> ConnectionRegistry.LoopRecipients {
        ConnectionRegistry.LoopRecipients(loop: self.loop, handlers: [NIOLoopBound(self.handler, eventLoop: self.loop)])
    }
}

@Suite("Gateway connection handler")
struct GatewayConnectionHandlerTests {
    @Test("no HELLO within the handshake timeout: ERROR handshake timeout, then close")
    func handshakeTimeout() throws {
        let fixture = try GatewayHandlerFixture(handshake: .seconds(3))
        fixture.loop.advanceTime(by: .seconds(3))
        guard case .error(let report)? = try fixture.readOutbound()?.payload else {
            Issue.record("expected ERROR")
            return
        }
        #expect(report.code == .handshakeTimeout)
        fixture.loop.run()
        #expect(!fixture.channel.isActive)
    }

    @Test("a deadline is answered on the event loop, the handler is cancelled, its late answer dropped")
    @MainActor
    func deadline() async throws {
        let fixture = try GatewayHandlerFixture(handler: .seconds(2))
        try fixture.establish()
        try fixture.channel.writeInbound(Frame(.request(.init(id: 4, method: "slow", timeout: .seconds(60))), flags: .checksum))
        #expect(try fixture.channel.readInbound(as: Frame.self)?.type == .request)
        let handler = await fixture.startHandler(4)
        fixture.loop.advanceTime(by: .seconds(2))
        let answer = try fixture.readOutbound()
        guard case .response(let response)? = answer?.payload else {
            Issue.record("expected the deadline answer")
            return
        }
        #expect(response.id == 4 && response.status == .deadlineExceeded)
        #expect(await handler.value == true, "the handler's task is cancelled")
        #expect(!fixture.requests.isPending(4))
        let late = await fixture.requests.run(4) { true }
        #expect(late == nil, "settled: a waiting handler would not even start")
        fixture.send(Frame(.response(.init(id: 4, body: ByteBuffer(string: "late")))))
        #expect(try fixture.readOutbound() == nil, "a request is answered once")
        _ = try? fixture.channel.finish()
    }

    @Test("CANCEL settles the request: its handler is stopped, nothing is sent, a late answer is dropped")
    @MainActor
    func cancel() async throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        try fixture.channel.writeInbound(Frame(.request(.init(id: 9, method: "m")), flags: .checksum))
        let handler = await fixture.startHandler(9)
        try fixture.channel.writeInbound(Frame(.cancel(.init(requestID: 9)), flags: .checksum))
        #expect(await handler.value == true)
        #expect(fixture.requests.count == 0)
        #expect(try fixture.channel.readInbound(as: Frame.self)?.type == .request, "only the REQUEST reached the application")
        #expect(try fixture.channel.readInbound(as: Frame.self) == nil)
        fixture.send(Frame(.response(.init(id: 9, body: ByteBuffer(string: "late")))))
        #expect(try fixture.readOutbound() == nil)
        _ = try? fixture.channel.finish()
    }

    @Test("closing the connection stops every handler")
    @MainActor
    func closeSettlesAll() async throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        try fixture.channel.writeInbound(Frame(.request(.init(id: 1, method: "m")), flags: .checksum))
        try fixture.channel.writeInbound(Frame(.request(.init(id: 2, method: "m")), flags: .checksum))
        let handlers = [await fixture.startHandler(1), await fixture.startHandler(2)]
        _ = try? fixture.channel.finish()
        for handler in handlers { #expect(await handler.value == true) }
        #expect(fixture.requests.count == 0)
    }

    @Test("the client's timeout is used when shorter than the gateway's limit")
    func clientTimeout() throws {
        let fixture = try GatewayHandlerFixture(handler: .seconds(30))
        try fixture.establish()
        try fixture.channel.writeInbound(Frame(.request(.init(id: 4, method: "slow", timeout: .milliseconds(500))), flags: .checksum))
        fixture.loop.advanceTime(by: .milliseconds(499))
        #expect(try fixture.readOutbound() == nil)
        fixture.loop.advanceTime(by: .milliseconds(1))
        #expect(try fixture.readOutbound()?.type == .response)
        _ = try? fixture.channel.finish()
    }

    @Test("a connection silent for the idle timeout gets GOAWAY and is closed; traffic postpones it")
    func idle() throws {
        let fixture = try GatewayHandlerFixture(idle: .seconds(30))
        try fixture.establish()
        fixture.loop.advanceTime(by: .seconds(20))
        try fixture.channel.writeInbound(Frame(.ping(.init(id: 1)), flags: .checksum))
        #expect(try fixture.readOutbound()?.type == .pong)
        fixture.loop.advanceTime(by: .seconds(29))
        #expect(fixture.channel.isActive)
        fixture.loop.advanceTime(by: .seconds(1))
        guard case .goAway(let goAway)? = try fixture.readOutbound()?.payload else {
            Issue.record("expected GOAWAY")
            return
        }
        #expect(goAway.reason == .idleTimeout)
        fixture.loop.run()
        #expect(!fixture.channel.isActive)
    }

    @Test("drain: GOAWAY, refusals, and a close at the end of the grace period if the client stays")
    func drain() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        fixture.channel.pipeline.triggerUserOutboundEvent(GatewayConnectionEvent.drain(.init(reason: .shutdown)), promise: nil)
        #expect(try fixture.readOutbound()?.type == .goAway)
        try fixture.channel.writeInbound(Frame(.request(.init(id: 1, method: "m")), flags: .checksum))
        #expect(try fixture.channel.readInbound(as: Frame.self) == nil, "not forwarded")
        guard case .response(let refusal)? = try fixture.readOutbound()?.payload else {
            Issue.record("expected a refusal")
            return
        }
        #expect(refusal.status == .unavailable)
        fixture.loop.advanceTime(by: .milliseconds(4999))
        #expect(fixture.channel.isActive, "waits for the client to close")
        fixture.loop.advanceTime(by: .milliseconds(1))
        #expect(!fixture.channel.isActive)
    }

    @Test("one timer serves every deadline: each request is answered at its own, in order; an answered one never")
    func deadlineSweep() throws {
        let fixture = try GatewayHandlerFixture(handler: .seconds(30))
        try fixture.establish()
        for (id, seconds) in [(1, 3), (2, 1), (3, 2)] as [(UInt64, Int64)] {
            try fixture.channel.writeInbound(Frame(.request(.init(id: id, method: "m", timeout: .seconds(seconds))), flags: .checksum))
        }
        fixture.loop.advanceTime(by: .milliseconds(500))
        fixture.send(Frame(.response(.init(id: 3, body: ByteBuffer(string: "ok")))))
        #expect(try fixture.readOutbound()?.type == .response)
        var expired: [(UInt64, Int64)] = []
        for step in 1...6 as ClosedRange<Int64> {
            fixture.loop.advanceTime(by: .milliseconds(500))
            while case .response(let response)? = try fixture.readOutbound()?.payload {
                #expect(response.status == .deadlineExceeded)
                expired.append((response.id, 500 + step * 500))
            }
        }
        #expect(expired.map(\.0) == [2, 1])
        #expect(expired.map(\.1) == [1000, 3000], "each at its own deadline (ms)")
        _ = try? fixture.channel.finish()
    }

    @Test(
        "the responses to a batch of requests leave in one write and one flush, at the end of the loop's batch; the last one in flight at once"
    )
    func flushCoalescing() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        for id in 1...4 as ClosedRange<UInt64> {
            try fixture.channel.writeInbound(Frame(.request(.init(id: id, method: "m")), flags: .checksum))
        }
        func respond(_ id: UInt64) {
            fixture.channel.writeAndFlush(Frame(.response(.init(id: id, body: ByteBuffer(string: "ok")))), promise: nil)
        }
        for id in 1...3 as ClosedRange<UInt64> { respond(id) }
        #expect(try fixture.readOutbound() == nil, "not flushed yet: other handlers of the batch may still answer")
        fixture.loop.run()
        let write = try fixture.readOutboundWrite()
        #expect(write?.map(\.payload) == (1...3).map { .response(.init(id: $0, body: ByteBuffer(string: "ok"))) })
        #expect(try fixture.readOutbound() == nil)
        // No other request in flight: nothing else can join this write, so it leaves at once.
        respond(4)
        #expect(try fixture.readOutbound()?.payload == .response(.init(id: 4, body: ByteBuffer(string: "ok"))))
        // Closing flushes what was written first.
        fixture.channel.write(Frame(.push(.init(topic: "last", body: ByteBuffer()))), promise: nil)
        fixture.channel.flush()
        fixture.channel.close(promise: nil)
        #expect(try fixture.readOutbound()?.payload == .push(.init(topic: "last")))
        _ = try? fixture.channel.finish()
    }

    @Test("answers given while reading (here PONGs) leave in one flush, when the read completes")
    func flushAtEndOfRead() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        let pipeline = fixture.channel.pipeline.syncOperations
        pipeline.fireChannelRead(NIOAny(Frame(.ping(.init(id: 1)), flags: .checksum)))
        pipeline.fireChannelRead(NIOAny(Frame(.ping(.init(id: 2)), flags: .checksum)))
        #expect(try fixture.readOutbound() == nil, "not flushed while the read goes on")
        pipeline.fireChannelReadComplete()
        #expect(try fixture.readOutboundWrite()?.map(\.payload) == [.pong(.init(id: 1)), .pong(.init(id: 2))])
        _ = try? fixture.channel.finish()
    }

    @Test("the answers to a long read leave in chunks: every 64th written frame flushes at once")
    func flushChunksWhileReading() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        let pipeline = fixture.channel.pipeline.syncOperations
        for id in 1...150 as ClosedRange<UInt64> {
            pipeline.fireChannelRead(NIOAny(Frame(.ping(.init(id: id)), flags: .checksum)))
        }
        #expect(try fixture.readOutboundWrite()?.map(\.payload) == (1...64).map { .pong(.init(id: $0)) })
        #expect(try fixture.readOutboundWrite()?.map(\.payload) == (65...128).map { .pong(.init(id: $0)) })
        #expect(try fixture.readOutbound() == nil, "the rest waits for the end of the read")
        pipeline.fireChannelReadComplete()
        #expect(try fixture.readOutboundWrite()?.map(\.payload) == (129...150).map { .pong(.init(id: $0)) })
        _ = try? fixture.channel.finish()
    }

    @Test("pushes written before WELCOME wait for it; pushes over the client's limit are dropped")
    func pushOrdering() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.helloWithoutChecksums(maxBodySize: 1024)
        fixture.channel.write(Frame(.push(.init(topic: "early", body: ByteBuffer()))), promise: nil)
        #expect(try fixture.readOutbound() == nil)
        try fixture.welcomeWithoutChecksums()
        #expect(try fixture.readOutbound()?.payload == .push(.init(topic: "early")))
        let dropped = fixture.loop.makePromise(of: Void.self)
        fixture.channel.writeAndFlush(Frame(.push(.init(topic: "big", body: ByteBuffer(repeating: 0, count: 2000)))), promise: dropped)
        #expect(throws: (any Error).self) { try dropped.futureResult.wait() }
        #expect(try fixture.readOutbound() == nil)
        _ = try? fixture.channel.finish()
    }

    @Test("a push encoded once: the connection's checksum choice, held until WELCOME, one flush per batch, the size limit")
    func encodedPush() throws {
        let push = try EncodedPush(.init(topic: "room", body: ByteBuffer(string: "hi")), allocator: ByteBufferAllocator())
        let checksummed = try GatewayHandlerFixture()
        try checksummed.establish()
        #expect(checksummed.handler.deliver(push), "the caller must flush")
        #expect(!checksummed.handler.deliver(push), "a flush is already due")
        #expect(try checksummed.readOutbound() == nil, "nothing leaves before the batch's flush")
        checksummed.handler.flushIfPending()
        for _ in 0..<2 {
            let frame = try checksummed.readOutbound()
            #expect(frame?.flags == .checksum)
            #expect(frame?.payload == .push(push.pushes[0]))
        }
        #expect(try checksummed.readOutbound() == nil)
        _ = try? checksummed.channel.finish()

        // A client without checksums and with a small body limit, still in its handshake.
        let plain = try GatewayHandlerFixture()
        try plain.helloWithoutChecksums(maxBodySize: 64)
        #expect(!plain.handler.deliver(push), "held until WELCOME")
        #expect(try plain.readOutbound() == nil)
        try plain.welcomeWithoutChecksums()
        let held = try plain.readOutbound()
        #expect(held?.flags == [] && held?.payload == .push(push.pushes[0]))
        let big = try EncodedPush(.init(topic: "room", body: ByteBuffer(repeating: 1, count: 100)), allocator: ByteBufferAllocator())
        #expect(!plain.handler.deliver(big), "over the client's limit: dropped")
        #expect(plain.handler.deliver(push))
        plain.handler.flushIfPending()
        let sent = try plain.readOutbound()
        #expect(sent?.flags == [] && sent?.payload == .push(push.pushes[0]))
        #expect(try plain.readOutbound() == nil)
        _ = try? plain.channel.finish()
    }

    @Test("a burst of pushes to the same recipients leaves in one write, in order, before the connection's next response")
    func pushBurstJoined() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        let recipients = fixture.recipients()
        let pushes = (1...3).map { Frame.Push(topic: "room", body: ByteBuffer(string: "message \($0)")) }
        for push in pushes[0..<2] {
            fixture.pushes.add(try EncodedPush(push, allocator: ByteBufferAllocator()), to: recipients)
        }
        #expect(try fixture.readOutbound() == nil, "held until the end of the loop's batch")
        fixture.loop.run()
        let burst = try fixture.readOutboundWrite()
        #expect(burst?.map(\.payload) == pushes[0..<2].map { .push($0) })
        #expect(burst?.allSatisfy { $0.flags == .checksum } == true)
        #expect(try fixture.readOutbound() == nil)

        // A push made before a response, on the same loop, arrives before it.
        try fixture.channel.writeInbound(Frame(.request(.init(id: 9, method: "send")), flags: .checksum))
        _ = try fixture.channel.readInbound(as: Frame.self)
        fixture.pushes.add(try EncodedPush(pushes[2], allocator: ByteBufferAllocator()), to: recipients)
        fixture.send(Frame(.response(.init(id: 9, status: .ok))))
        #expect(try fixture.readOutbound()?.payload == .push(pushes[2]))
        #expect(try fixture.readOutbound()?.payload == .response(.init(id: 9, status: .ok)))
        #expect(try fixture.readOutbound() == nil)
        _ = try? fixture.channel.finish()
    }

    @Test("pushes to other recipients are not joined; a client with a small limit gets, in order, the pushes it accepts")
    func pushBurstSplit() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.helloWithoutChecksums(maxBodySize: 64)
        try fixture.welcomeWithoutChecksums()

        let small = Frame.Push(topic: "a", body: ByteBuffer(string: "small"))
        let big = Frame.Push(topic: "a", body: ByteBuffer(repeating: 1, count: 100))
        let other = Frame.Push(topic: "b", body: ByteBuffer(string: "other"))
        let room = fixture.recipients()
        for push in [small, big, small] {
            fixture.pushes.add(try EncodedPush(push, allocator: ByteBufferAllocator()), to: room)
        }
        // The same connection, reached through another target: a run of its own.
        fixture.pushes.add(try EncodedPush(other, allocator: ByteBufferAllocator()), to: fixture.recipients())
        fixture.loop.run()
        // Over the limit somewhere in the run: each push on its own, the big one dropped.
        #expect(try fixture.readOutbound()?.payload == .push(small))
        #expect(try fixture.readOutbound()?.payload == .push(small))
        let last = try fixture.readOutbound()
        #expect(last?.payload == .push(other) && last?.flags == [])
        #expect(try fixture.readOutbound() == nil)
        _ = try? fixture.channel.finish()
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
            reliability: (window: 100, retransmission: RTTEstimator(initialTimeout: .seconds(1), minimumTimeout: .seconds(1))),
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
            try fixture.channel.writeInbound(Frame(.messageAck(.init(entries: ids.map { .init(id: $0) })), flags: .checksum))
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
            reliability: (window: 100, retransmission: RTTEstimator()),
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
        try fixture.channel.writeInbound(Frame(.ping(.init(id: 9)), flags: .checksum))
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
        try fixture.channel.writeInbound(Frame(.messageAck(.init(entries: [.init(id: 1, status: .ok)])), flags: .checksum))
        #expect(acknowledged.withLockedValue { $0 } == [1])
        _ = try? fixture.channel.finish()
    }
}
