import NIOConcurrencyHelpers
import NIOCore
import NIOEmbedded
import Testing
import TetherCompression
import TetherTestSupport

@testable import TetherCore
@testable import TetherGateway

private let defaultHello = Frame.Hello(versions: 1...1, features: .checksum, maxBodySize: 1 << 20, clientID: "alice")

/// Request handlers that wait until the test releases them, or until they are cancelled; all on
/// the `EmbeddedEventLoop`'s thread, which the handlers' tasks (on the connection's loop) share.
final class HeldRequests: Sendable {
    private struct State {
        var waiting: [UInt64: CheckedContinuation<Void, Never>] = [:]
        var released: Set<UInt64> = []
        var started: [UInt64] = []
        var cancelled: [UInt64] = []
    }

    private let state = NIOLockedValueBox(State())

    /// A handler that waits for ``release(_:)`` (then echoes the body) or its cancellation.
    var handler: Gateway.Handler {
        { request, _ in
            self.state.withLockedValue { $0.started.append(request.id) }
            await withTaskCancellationHandler {
                await withCheckedContinuation { continuation in
                    let go = self.state.withLockedValue { state -> Bool in
                        if state.released.contains(request.id) || Task.isCancelled { return true }
                        state.waiting[request.id] = continuation
                        return false
                    }
                    if go { continuation.resume() }
                }
            } onCancel: {
                let waiter = self.state.withLockedValue { state in
                    state.cancelled.append(request.id)
                    return state.waiting.removeValue(forKey: request.id)
                }
                waiter?.resume()
            }
            return request.body
        }
    }

    /// Lets request `id`'s handler answer.
    func release(_ id: UInt64) {
        let waiter = self.state.withLockedValue { state in
            state.released.insert(id)
            return state.waiting.removeValue(forKey: id)
        }
        waiter?.resume()
    }

    var started: [UInt64] { self.state.withLockedValue { $0.started } }
    var cancelled: [UInt64] { self.state.withLockedValue { $0.cancelled } }
}

extension GatewayConnectionHandler {
    /// Delivers `push` to this connection alone.
    func deliver(_ push: EncodedPush) -> Bool {
        var compressed = CompressedPush()
        return self.deliver(push, compressed: &compressed)
    }
}

/// The gateway's connection handler on an `EmbeddedChannel`, with virtual time, serving a
/// gateway whose one event loop is the channel's: the handshake and the handlers' tasks run on
/// it when the test runs the loop. The channel carries bytes, as a socket would.
final class GatewayHandlerFixture {
    let loop = EmbeddedEventLoop()
    let channel: EmbeddedChannel
    let gateway: Gateway
    let handler: GatewayConnectionHandler
    let held = HeldRequests()

    init(
        handshake: Duration = .seconds(10),
        handler: Duration = .seconds(30),
        idle: Duration = .seconds(30),
        maxConcurrentRequests: Int = 512,
        configure: (inout GatewayConfiguration) throws -> Void = { _ in },
        routes: (Gateway, HeldRequests) -> Void = { _, _ in }
    ) throws {
        var configuration = GatewayConfiguration.defaults
        configuration.listen = nil
        configuration.timeouts = .init(handshake: handshake, handler: handler, idle: idle, shutdownGracePeriod: .seconds(5))
        configuration.limits.maxConcurrentRequestsPerConnection = maxConcurrentRequests
        try configure(&configuration)
        self.gateway = try Gateway(
            configuration: configuration,
            eventLoopGroup: self.loop,
            clock: EventLoopClock(self.loop),
            logger: testLogger("gateway")
        )
        self.gateway.handle("hold", self.held.handler)
        routes(self.gateway, self.held)
        self.channel = EmbeddedChannel(loop: self.loop)
        self.handler = GatewayConnectionHandler(
            services: self.gateway.services,
            id: 1,
            framing: .byteStream,
            eventLoop: self.loop,
            pushes: self.gateway.pushBatchers[ObjectIdentifier(self.loop)],
            logger: testLogger("gateway-handler")
        )
        try self.channel.pipeline.syncOperations.addHandler(self.handler)
        try self.channel.connect(to: SocketAddress(ipAddress: "127.0.0.1", port: 1)).wait()
    }

    /// The loop's push batcher, which the handler drains before its own writes.
    var pushes: PushBatcher { self.gateway.pushBatchers[ObjectIdentifier(self.loop)]! }

    /// Delivers `frame` to the handler as bytes, in one read (and its read-complete).
    func writeInbound(_ frame: Frame) throws {
        try self.channel.writeInbound(try FrameEncoder().encode(frame, allocator: self.channel.allocator))
    }

    /// Sends a request (with a checksum, as negotiated).
    func request(_ id: UInt64, method: String = "hold", timeout: Duration? = nil) throws {
        try self.writeInbound(Frame(.request(.init(id: id, method: method, timeout: timeout)), flags: .checksum))
    }

    /// HELLO in, the handshake's task run, WELCOME out.
    func establish(hello: Frame.Hello = defaultHello) throws {
        try self.writeInbound(Frame(.hello(hello), flags: .checksum))
        self.loop.run()
        let sent = try self.readOutbound()
        #expect(sent?.type == .welcome && sent?.flags == .checksum, "WELCOME carries a checksum")
    }

    /// The first half of the handshake of a small client, without checksums and with a body
    /// limit of `maxBodySize`: the HELLO is read, the handshake's task has not run yet.
    func helloWithoutChecksums(maxBodySize: UInt32) throws {
        try self.writeInbound(
            Frame(.hello(.init(versions: 1...1, features: [], maxBodySize: maxBodySize, clientID: "small")), flags: .checksum)
        )
    }

    /// The second half: the handshake's task runs and the WELCOME goes out.
    func welcomeWithoutChecksums() throws {
        self.loop.run()
        let sent = try self.readOutbound()
        #expect(sent?.type == .welcome && sent?.flags == .checksum)
    }

    /// Frames of a write that ``readOutbound()`` has not returned yet.
    private var unread: [Frame] = []

    /// The next frame the handler wrote and flushed (a write may hold several).
    func readOutbound() throws -> Frame? {
        if self.unread.isEmpty {
            guard let frames = try self.readOutboundWrite() else { return nil }
            self.unread = frames
        }
        return self.unread.isEmpty ? nil : self.unread.removeFirst()
    }

    /// The frames of the next write.
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
    @Test("a client sending requests at 10x the per-connection rate gets the rate, paced, with no request refused")
    func requestsPaced() throws {
        let limit = 1_000
        let fixture = try GatewayHandlerFixture(
            idle: .seconds(3_600),
            configure: { $0.limits.requestsPerSecondPerConnection = limit },
            routes: { gateway, _ in gateway.handleInline("echo") { request, _ in request.body } }
        )
        try fixture.establish()
        let step = TimeAmount.milliseconds(10)
        let perStep = 10 * limit / 100  // 10x the limit
        let seconds = 10
        var nextID: UInt64 = 1
        var answered = 0
        var refused: [Frame.Response] = []
        for _ in 0..<(seconds * 100) {
            var bytes = fixture.channel.allocator.buffer(capacity: perStep * 32)
            for _ in 0..<perStep {
                try FrameEncoder().encode(
                    Frame(.request(.init(id: nextID, method: "echo")), flags: .checksum),
                    into: &bytes
                )
                nextID += 1
            }
            try fixture.channel.writeInbound(bytes)
            fixture.loop.advanceTime(by: step)
            while let frames = try fixture.readOutboundWrite() {
                for frame in frames {
                    guard case .response(let response) = frame.payload else { continue }
                    if response.status == .ok { answered += 1 } else { refused.append(response) }
                }
            }
        }
        #expect(refused.isEmpty, "over the rate, requests wait; none is refused: \(refused.prefix(3))")
        let sustained = Double(answered - limit) / Double(seconds)  // less the initial burst
        #expect(sustained >= 0.95 * Double(limit), "\(answered) answered in \(seconds) s at a limit of \(limit)/s")
        #expect(answered <= limit * (seconds + 1) + perStep, "never more than the rate and its burst")
        #expect(fixture.channel.isActive, "the connection stays open")
        _ = try? fixture.channel.finish()
    }

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

    @Test("a task handler starts at once, on the loop, while the request is read; it takes a slot until its task ends")
    func handlerStartsImmediately() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        try fixture.request(1)
        #expect(fixture.held.started == [1], "the handler ran until it first suspended, inside the read")
        #expect(fixture.handler.machine.runningHandlers == 1 && fixture.handler.machine.tasks == 1)
        fixture.held.release(1)
        fixture.loop.run()
        #expect(try fixture.readOutbound()?.payload == .response(.init(id: 1, body: ByteBuffer())))
        #expect(fixture.handler.machine.runningHandlers == 0 && fixture.handler.machine.tasks == 0, "an idle connection holds no task")
        _ = try? fixture.channel.finish()
    }

    @Test("a deadline is answered on the event loop, the handler is cancelled, its late answer dropped")
    func deadline() throws {
        let fixture = try GatewayHandlerFixture(handler: .seconds(2))
        try fixture.establish()
        try fixture.request(4, timeout: .seconds(60))
        fixture.loop.advanceTime(by: .seconds(2))
        guard case .response(let response)? = try fixture.readOutbound()?.payload else {
            Issue.record("expected the deadline answer")
            return
        }
        #expect(response.id == 4 && response.status == .deadlineExceeded)
        #expect(fixture.held.cancelled == [4], "the handler's task is cancelled")
        fixture.loop.run()  // the cancelled handler returns: its answer is dropped
        #expect(try fixture.readOutbound() == nil, "a request is answered once")
        #expect(fixture.handler.machine.runningHandlers == 0)
        _ = try? fixture.channel.finish()
    }

    @Test("CANCEL settles the request: its handler is stopped, nothing is sent, its slot is free again")
    func cancel() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        try fixture.request(9)
        try fixture.writeInbound(Frame(.cancel(.init(requestID: 9)), flags: .checksum))
        #expect(fixture.held.cancelled == [9])
        #expect(fixture.handler.machine.requestsInFlight == 0)
        fixture.loop.run()
        #expect(try fixture.readOutbound() == nil)
        #expect(fixture.handler.machine.runningHandlers == 0)
        // A CANCEL for a request that is not in flight is ignored.
        try fixture.writeInbound(Frame(.cancel(.init(requestID: 77)), flags: .checksum))
        #expect(fixture.channel.isActive)
        _ = try? fixture.channel.finish()
    }

    @Test("closing the connection stops every handler; the gateway counts it until their tasks ended")
    func closeSettlesAll() throws {
        let fixture = try GatewayHandlerFixture()
        #expect(fixture.gateway.activity.active == 1, "an open connection is counted")
        try fixture.establish()
        try fixture.request(1)
        try fixture.request(2)
        fixture.channel.close(promise: nil)
        #expect(Set(fixture.held.cancelled) == [1, 2])
        #expect(fixture.gateway.activity.active == 1, "closed, but its handlers' tasks have not ended")
        fixture.loop.run()
        #expect(fixture.gateway.activity.active == 0)
        #expect(try fixture.readOutbound() == nil)
    }

    @Test("the client's timeout is used when shorter than the gateway's limit")
    func clientTimeout() throws {
        let fixture = try GatewayHandlerFixture(handler: .seconds(30))
        try fixture.establish()
        try fixture.request(4, timeout: .milliseconds(500))
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
        try fixture.writeInbound(Frame(.ping(.init(id: 1)), flags: .checksum))
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
        fixture.handler.drain(.init(reason: .shutdown))
        #expect(try fixture.readOutbound()?.type == .goAway)
        try fixture.request(1)
        #expect(fixture.held.started.isEmpty, "not run")
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
            try fixture.request(id, timeout: .seconds(seconds))
        }
        fixture.loop.advanceTime(by: .milliseconds(500))
        fixture.held.release(3)
        fixture.loop.run()
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
        for id in 1...4 as ClosedRange<UInt64> { try fixture.request(id) }
        for id in 1...3 as ClosedRange<UInt64> { fixture.held.release(id) }
        #expect(try fixture.readOutbound() == nil, "the handlers have not run yet")
        fixture.loop.run()
        let write = try fixture.readOutboundWrite()
        #expect(write?.map(\.payload) == (1...3).map { .response(.init(id: $0, body: ByteBuffer())) })
        #expect(try fixture.readOutbound() == nil)
        // No other request in flight: nothing else can join this write, so it leaves at once.
        fixture.held.release(4)
        fixture.loop.run()
        #expect(try fixture.readOutboundWrite()?.map(\.payload) == [.response(.init(id: 4, body: ByteBuffer()))])
        // Closing flushes what was written first.
        let push = try EncodedPush(.init(topic: "last"), allocator: ByteBufferAllocator())
        #expect(fixture.handler.deliver(push))
        fixture.channel.close(promise: nil)
        #expect(try fixture.readOutbound()?.payload == .push(.init(topic: "last")))
        _ = try? fixture.channel.finish()
    }

    @Test("answers given while reading (here PONGs) leave in one flush, when the read completes")
    func flushAtEndOfRead() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        let pipeline = fixture.channel.pipeline.syncOperations
        let encoder = FrameEncoder()
        for id: UInt64 in 1...2 {
            pipeline.fireChannelRead(
                NIOAny(try encoder.encode(Frame(.ping(.init(id: id)), flags: .checksum), allocator: ByteBufferAllocator()))
            )
        }
        #expect(try fixture.readOutbound() == nil, "not flushed while the read goes on")
        pipeline.fireChannelReadComplete()
        #expect(try fixture.readOutboundWrite()?.map(\.payload) == [.pong(.init(id: 1)), .pong(.init(id: 2))])
        _ = try? fixture.channel.finish()
    }

    @Test("the answers to a long read leave in chunks: every 64th written frame flushes at once")
    func flushChunksWhileReading() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        var bytes = ByteBuffer()
        for id in 1...150 as ClosedRange<UInt64> {
            try FrameEncoder().encode(Frame(.ping(.init(id: id)), flags: .checksum), into: &bytes)
        }
        let pipeline = fixture.channel.pipeline.syncOperations
        pipeline.fireChannelRead(NIOAny(bytes))  // one read holding 150 frames
        #expect(try fixture.readOutboundWrite()?.map(\.payload) == (1...64).map { .pong(.init(id: $0)) })
        #expect(try fixture.readOutboundWrite()?.map(\.payload) == (65...128).map { .pong(.init(id: $0)) })
        #expect(try fixture.readOutbound() == nil, "the rest waits for the end of the read")
        pipeline.fireChannelReadComplete()
        #expect(try fixture.readOutboundWrite()?.map(\.payload) == (129...150).map { .pong(.init(id: $0)) })
        _ = try? fixture.channel.finish()
    }

    @Test(
        "a push to connections that compress it is compressed once per batch: the others write the same bytes, and only the first pays the compression's work"
    )
    func pushCompressedOnce() throws {
        let compressing: (inout GatewayConfiguration) throws -> Void = { $0.compression = try Compression(threshold: 64, level: 6) }
        let hello = Frame.Hello(versions: 1...1, features: [.checksum, .compression], maxBodySize: 1 << 20, clientID: "alice")
        let fixtures = try (0..<3).map { _ in try GatewayHandlerFixture(configure: compressing) }
        for fixture in fixtures { try fixture.establish(hello: hello) }
        let body = ByteBuffer(string: String(repeating: #"{"price": 101.25, "symbol": "TTHR"} "#, count: 64))
        let push = try EncodedPush(.init(topic: "quotes", body: body), allocator: ByteBufferAllocator())
        for fixture in fixtures { _ = fixture.handler.io.takeCompressionWork() }

        var compressed = CompressedPush()
        var sent: [ByteBuffer] = []
        var work: [Int] = []
        for fixture in fixtures {
            #expect(fixture.handler.deliver(push, compressed: &compressed))
            fixture.handler.flushIfPending()
            sent.append(try #require(try fixture.channel.readOutbound(as: ByteBuffer.self)))
            work.append(fixture.handler.io.takeCompressionWork())
        }
        #expect(sent[0].readableBytes < body.readableBytes / 4, "compressed: \(sent[0].readableBytes) bytes for \(body.readableBytes)")
        #expect(sent.allSatisfy { $0 == sent[0] }, "the same bytes for every connection")
        #expect(work[0] > 0 && work[1...].allSatisfy { $0 == 0 }, "only the first compressed: \(work)")

        // As a client reads it: the push, compressed, with its checksum.
        var decoder = FrameDecoder(maxBodySize: 1 << 20)
        var bytes = sent[1]
        let frame = try #require(try decoder.decodeFrame(from: &bytes, inflater: try PayloadInflater()))
        #expect(frame.payload == .push(.init(topic: "quotes", body: body)))
        #expect(frame.flags.contains(.checksum))
        for fixture in fixtures { _ = try? fixture.channel.finish() }
    }

    @Test("a push encoded once: the connection's checksum choice, only once established, one flush per batch, the size limit")
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
            #expect(frame?.payload == push.pushes[0].payload)
        }
        #expect(try checksummed.readOutbound() == nil)
        _ = try? checksummed.channel.finish()

        // A client without checksums and with a small body limit, still in its handshake: pushes
        // reach it only once its WELCOME went out (the registry lists it as established then).
        let plain = try GatewayHandlerFixture()
        try plain.helloWithoutChecksums(maxBodySize: 1024)
        #expect(!plain.handler.deliver(push), "not established: not for this connection yet")
        #expect(try plain.readOutbound() == nil)
        try plain.welcomeWithoutChecksums()
        #expect(try plain.readOutbound() == nil, "nothing was held")
        let big = try EncodedPush(.init(topic: "room", body: ByteBuffer(repeating: 1, count: 2000)), allocator: ByteBufferAllocator())
        #expect(!plain.handler.deliver(big), "over the client's limit: dropped")
        #expect(plain.handler.deliver(push))
        plain.handler.flushIfPending()
        let sent = try plain.readOutbound()
        #expect(sent?.flags == [] && sent?.payload == push.pushes[0].payload)
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
        try fixture.request(9)
        fixture.pushes.add(try EncodedPush(pushes[2], allocator: ByteBufferAllocator()), to: recipients)
        fixture.held.release(9)
        fixture.loop.run()
        #expect(try fixture.readOutbound()?.payload == .push(pushes[2]))
        #expect(try fixture.readOutbound()?.payload == .response(.init(id: 9, body: ByteBuffer())))
        #expect(try fixture.readOutbound() == nil)
        _ = try? fixture.channel.finish()
    }

    @Test("pushes to other recipients are not joined; a client with a small limit gets, in order, the pushes it accepts")
    func pushBurstSplit() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.helloWithoutChecksums(maxBodySize: 1024)
        try fixture.welcomeWithoutChecksums()

        let small = Frame.Push(topic: "a", body: ByteBuffer(string: "small"))
        let big = Frame.Push(topic: "a", body: ByteBuffer(repeating: 1, count: 2000))
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

    @Test("reading stops while the channel is not writable, or while too many requests wait for a slot; it resumes once")
    func readsHeld() throws {
        let fixture = try GatewayHandlerFixture(maxConcurrentRequests: 1)
        let counter = ReadCounter()
        try fixture.channel.pipeline.syncOperations.addHandler(counter, position: .first)
        try fixture.establish()
        let before = counter.reads
        fixture.channel.read()
        #expect(counter.reads == before + 1)

        fixture.channel.isWritable = false
        fixture.channel.pipeline.fireChannelWritabilityChanged()
        fixture.channel.read()
        fixture.channel.read()
        #expect(counter.reads == before + 1, "no read while responses cannot be written")
        fixture.channel.isWritable = true
        fixture.channel.pipeline.fireChannelWritabilityChanged()
        #expect(counter.reads == before + 2, "the held read goes on once, when the channel is writable again")

        // One slot: request 1 runs, 16 more wait; then reading stops until a slot frees.
        for id in 1...17 as ClosedRange<UInt64> { try fixture.request(id) }
        fixture.channel.read()
        #expect(counter.reads == before + 2, "16 requests wait: no more are read")
        fixture.held.release(1)
        fixture.loop.run()
        #expect(counter.reads == before + 3, "a slot freed: reading resumes")
        #expect(fixture.held.started == [1, 2], "the next in line started")
        _ = try? fixture.channel.finish()
    }

    @Test("a credential refresh that waited for a slot runs once one frees, is answered, and gives its slot back")
    func refreshWaitsForASlot() throws {
        let fixture = try GatewayHandlerFixture(maxConcurrentRequests: 1)
        try fixture.establish()
        try fixture.request(1)
        try fixture.request(2, method: "$auth")
        #expect(fixture.handler.machine.runningHandlers == 1, "the refresh waits behind the held request")
        fixture.held.release(1)
        fixture.loop.run()
        let answers = try [fixture.readOutbound(), fixture.readOutbound()].compactMap { frame -> UInt64? in
            guard case .response(let response)? = frame?.payload, response.status == .ok else { return nil }
            return response.id
        }
        #expect(answers == [1, 2], "the gateway has no authenticator: the refresh is answered ok")
        #expect(fixture.handler.machine.runningHandlers == 0 && fixture.handler.machine.tasks == 0, "no slot is left taken")
        fixture.channel.close(promise: nil)
        fixture.loop.run()
        #expect(fixture.gateway.activity.active == 0, "so the gateway is not held open by it")
    }

    @Test("a malformed frame gets ERROR and a close; an empty method is malformed")
    func malformed() throws {
        let fixture = try GatewayHandlerFixture()
        try fixture.establish()
        try fixture.writeInbound(Frame(.request(.init(id: 1, method: "")), flags: .checksum))
        guard case .error(let report)? = try fixture.readOutbound()?.payload else {
            Issue.record("expected ERROR")
            return
        }
        #expect(report.code == .protocolError && report.message.contains("method is empty"))
        fixture.loop.run()
        #expect(!fixture.channel.isActive)
    }
}

/// Counts the `read`s that reach the bottom of a pipeline.
private final class ReadCounter: ChannelOutboundHandler {
    typealias OutboundIn = Never
    var reads = 0

    func read(context: ChannelHandlerContext) {
        self.reads += 1
        context.read()
    }
}
