import Crypto
package import NIOCore
import NIOHTTP1
import TetherNIO

// The stream: a GET admitted opens it on its connection; POST bodies reach the connection's
// handler above when it asks to read, and count as read once it asks again.
extension HTTPStreamServerHandler {
    /// Opens a stream on this connection, if the gateway admits it.
    func open(_ request: HTTPRequestHead, context: ChannelHandlerContext) {
        let start: () throws -> Void
        switch self.admit(context.channel, .stream) {
        case .refused(let refusal):
            self.refuseAndClose(refusal, request.version, context)
            return
        case .admitted(let admitted):
            start = admitted
        }
        let token = self.sessions.makeToken()
        let key = HTTPStreamBinding.makeKey()
        var headers = HTTPHeaders()
        headers.add(name: "Content-Type", value: HTTPStreamBinding.contentType)
        headers.add(name: "Cache-Control", value: "no-store, no-transform")
        headers.add(name: "X-Accel-Buffering", value: "no")
        headers.add(name: HTTPStreamBinding.sessionHeader, value: token)
        if request.version == .http1_0 {
            // No chunked encoding in HTTP/1.0: the body ends when the connection does.
            headers.add(name: "Connection", value: "close")
        }
        // The head and the token line first: what the connection's handler writes as it is
        // added (a refusal's ERROR, a GOAWAY while the gateway drains) goes in the body.
        self.mode = .stream(Stream(token: token, key: HTTPStreamBinding.symmetricKey(key)!))
        context.write(Self.wrapOutboundOut(.head(HTTPResponseHead(version: request.version, status: .ok, headers: headers))), promise: nil)
        let line = HTTPStreamBinding.sessionLine(token: token, key: key) + "\n"
        var first = context.channel.allocator.buffer(capacity: line.utf8.count)
        first.writeString(line)
        context.write(Self.wrapOutboundOut(.body(.byteBuffer(first))), promise: nil)
        do {
            try start()
        } catch {
            context.close(promise: nil)
            return
        }
        self.sessions.register(HTTPStreamSession(token: token, handler: NIOLoopBound(self, eventLoop: context.eventLoop)))
        self.markServed()
        context.flush()
    }

    /// A POST's body for this stream: read it when the handler above asks.
    func deliver(_ body: ByteBuffer, proof: String, on eventLoop: any EventLoop) -> EventLoopFuture<HTTPStreamSession.Delivery> {
        guard let context, case .stream(var stream) = self.mode, !stream.ended else {
            return eventLoop.makeSucceededFuture(.ended)
        }
        // Only the stream's reader has the key: anyone else's POST is refused, and the stream
        // does not see it. The POST's number in the proof makes a replayed one fail too.
        let expected = HTTPStreamBinding.proof(key: stream.key, post: stream.posts, body: body)
        guard Self.constantTimeEqual(expected, proof) else {
            return context.eventLoop.makeSucceededFuture(.forbidden(post: stream.posts))
        }
        guard stream.pending == nil else { return context.eventLoop.makeSucceededFuture(.busy) }
        stream.posts += 1
        let promise = context.eventLoop.makePromise(of: HTTPStreamSession.Delivery.self)
        stream.pending = Pending(body: body, promise: promise)
        self.mode = .stream(stream)
        self.deliverPending(context: context)
        return promise.futureResult
    }

    /// Whether two proofs are equal, in a time that does not depend on where they differ.
    static func constantTimeEqual(_ a: String, _ b: String) -> Bool {
        let (x, y) = (Array(a.utf8), Array(b.utf8))
        guard x.count == y.count else { return false }
        var difference: UInt8 = 0
        for index in x.indices { difference |= x[index] ^ y[index] }
        return difference == 0
    }

    /// Passes the pending body up once the handler above asked to read.
    func deliverPending(context: ChannelHandlerContext) {
        guard case .stream(var stream) = self.mode, stream.readRequested, var pending = stream.pending, !pending.passedUp else { return }
        stream.readRequested = false
        pending.passedUp = true
        let body = pending.body
        pending.body = ByteBuffer()  // the handler above owns it now
        stream.pending = pending
        self.mode = .stream(stream)
        context.fireChannelRead(Self.wrapInboundOut(body))
        context.fireChannelReadComplete()
        // As a socket with autoRead asks again after each read: the handler above decides, and
        // its next read says it has taken the body (``read(context:)``).
        if context.channel.isActive { context.channel.read() }
    }

    package func read(context: ChannelHandlerContext) {
        if case .post(let post) = self.mode, let account = self.account, account.isPaused || account.shouldPause {
            guard self.settings.bytesInFlightWhilePaused == 0 else {
                // HTTP/2: a paused stream's DATA waits in the HTTP/2 handler as slices of the
                // connection's reads, holding more than the window it counts. Refused instead.
                self.refuseAndClose(Self.budgetFull, post.version, context)
                return
            }
            // The budget is exhausted while this POST holds part of its body: wait for room.
            if !account.isPaused {
                account.paused()
                if case .post(let post) = self.mode { self.hold(post.body.readableBytes, inProgress: true) }
            }
            self.pausedRead = true
            return
        }
        if case .stream(var stream) = self.mode {
            if let pending = stream.pending, pending.passedUp {
                // The handler above took the last body and asks for more: it has read it.
                stream.pending = nil
                self.mode = .stream(stream)
                pending.promise.succeed(.accepted)
            }
            if case .stream(var stream) = self.mode {
                stream.readRequested = true
                self.mode = .stream(stream)
                self.deliverPending(context: context)
            }
        }
        context.read()
    }

    package func write(context: ChannelHandlerContext, data: NIOAny, promise: EventLoopPromise<Void>?) {
        guard case .stream(let stream) = self.mode else {
            context.write(data, promise: promise)  // a response of the handlers after this one
            return
        }
        guard !stream.ended else {
            promise?.fail(ChannelError.ioOnClosedChannel)
            return
        }
        context.write(Self.wrapOutboundOut(.body(.byteBuffer(Self.unwrapOutboundIn(data)))), promise: promise)
    }

    package func close(context: ChannelHandlerContext, mode: CloseMode, promise: EventLoopPromise<Void>?) {
        if case .stream(var stream) = self.mode, !stream.ended {
            // The end of the chunked body, so that a proxy passes the end on as an end.
            stream.ended = true
            self.mode = .stream(stream)
            context.writeAndFlush(Self.wrapOutboundOut(.end(nil)), promise: nil)
        }
        context.close(mode: mode, promise: promise)
    }

    package func channelInactive(context: ChannelHandlerContext) {
        self.idleTimer?.cancel()
        if case .stream(var stream) = self.mode {
            stream.ended = true
            let pending = stream.pending
            stream.pending = nil
            self.mode = .stream(stream)
            self.sessions.end(stream.token)
            pending?.promise.succeed(.ended)
        }
        context.fireChannelInactive()
    }
}
