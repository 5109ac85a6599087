package import NIOCore
package import TetherCompression
package import TetherCore

/// What the client's and the gateway's connection handlers share: reading and decoding frames,
/// writing and flushing them, closing after a last frame, holding reads back, and the timer.
///
/// Each handler owns one and does everything through it; only the session rules differ between
/// the two sides. A class, not a value: writing, flushing and closing call into the pipeline,
/// which may call back into the handler (a writability change during a flush, a close once a
/// write completed) while the call is under way. The transport below (TCP, TLS, a WebSocket framer) delivers
/// bytes, as a stream or one frame per message (``Framing``); nothing here depends on which.
///
/// **The flush policy.** Frames written while a read is being handled leave together at the
/// end of the read. Frames written outside a read (an answer from a task, a push) leave at the
/// end of the event loop's current batch of work, so that everything the batch writes shares
/// one `writev`: the handler queues ``flushAtEndOfBatch(context:)`` when
/// ``flushSoon(context:alone:)`` says so. Once ``maxUnflushedFrames`` wait, they leave at once,
/// so the peer works on the first while the rest are written; and a frame nothing else can
/// join (`alone`) leaves at once too.
///
/// ```swift
/// func channelRead(context: ChannelHandlerContext, data: NIOAny) {
///     self.io.channelRead(Self.unwrapInboundIn(data))
///     while let event = self.io.next() { self.handle(event, context: context) }
/// }
/// ```
package final class FrameConnection {
    /// Frames written and not flushed before a flush goes at once.
    package static let maxUnflushedFrames = 64

    /// What the connection read.
    package enum Inbound {
        case frame(Frame)
        /// The bytes broke the protocol; nothing more is decoded.
        case violation(ProtocolError)
    }

    private var reader: FrameReader
    private var writer: FrameWriter
    /// Between a read and its `channelReadComplete`.
    package private(set) var isReading = false
    /// Frames were written and not flushed.
    package private(set) var flushOwed = false
    /// A flush at the end of the loop's batch is queued.
    private var flushQueued = false
    /// Frames written since the last flush.
    private var unflushed = 0
    /// The pipeline asked to read and the read is held back.
    private var readHeld = false
    /// Whether reads stop while the channel is not writable (the peer does not read).
    private let holdsReadsWhileUnwritable: Bool
    /// The channel's writability, as its events tell it.
    package private(set) var isWritable = true
    /// Closing: nothing more is written.
    package private(set) var isClosing = false
    /// The connection's one timer.
    package var timer = ConnectionTimer()
    /// Told the bytes read and written since it was last told: at the end of each read and at
    /// each flush (not per frame), for metrics and statistics.
    package var countBytes: ((_ read: Int, _ written: Int) -> Void)?
    /// With ``Features/compression`` negotiated: the connection's compressor and decompressor.
    package var compression: (deflater: PayloadDeflater, inflater: PayloadInflater)?
    /// Bytes read and written and not told yet.
    private var bytesRead = 0
    private var bytesWritten = 0

    /// - Parameters:
    ///   - framing: How the transport delivers frames.
    ///   - holdsReadsWhileUnwritable: Stop reading while the peer does not read what is written
    ///     (the gateway); a client keeps reading, or both sides could wait on each other.
    package init(framing: Framing, holdsReadsWhileUnwritable: Bool) {
        self.reader = FrameReader(framing: framing)
        self.writer = FrameWriter(framing: framing)
        self.holdsReadsWhileUnwritable = holdsReadsWhileUnwritable
    }

    /// How the transport delivers frames.
    package var framing: Framing { self.reader.framing }

    /// Whether REQUEST and MESSAGE may carry a trace context (negotiated in the handshake).
    package var acceptsTraceContext: Bool {
        get { self.reader.acceptsTraceContext }
        set { self.reader.acceptsTraceContext = newValue }
    }

    /// Whether a DELIVERY may carry the ACKED_ELSEWHERE flag (negotiated).
    package var acceptsSharedDeliveries: Bool {
        get { self.reader.acceptsSharedDeliveries }
        set { self.reader.acceptsSharedDeliveries = newValue }
    }

    /// The largest frame body accepted; raised once the handshake is done.
    package var maxInboundBodySize: Int {
        get { self.reader.maxBodySize }
        set { self.reader.maxBodySize = newValue }
    }

    /// The handler was added: frames are encoded into buffers of the channel's allocator.
    package func handlerAdded(context: ChannelHandlerContext) {
        self.writer = FrameWriter(framing: self.writer.framing, allocator: context.channel.allocator)
        self.isWritable = context.channel.isWritable
    }

    // MARK: Reading

    /// A read from the channel: its bytes are decoded by ``next()``.
    package func channelRead(_ bytes: ByteBuffer) {
        self.isReading = true
        self.bytesRead += bytes.readableBytes
        self.reader.append(bytes)
    }

    /// Whether bytes were read and not decoded yet (a partial frame, or frames left while the
    /// owner held reads).
    package var hasBufferedBytes: Bool { self.reader.hasPartialFrame }

    /// How many bytes were read and not decoded yet.
    package var bufferedBytes: Int { self.reader.bufferedBytes }

    /// The next frame decoded from what was read, or the violation that ends the connection.
    package func next() -> Inbound? {
        do {
            return try self.reader.next(inflater: self.compression?.inflater).map(Inbound.frame)
        } catch {
            return .violation(error)
        }
    }

    /// The read is complete: what was written while handling it is flushed.
    package func channelReadComplete(context: ChannelHandlerContext) {
        self.isReading = false
        self.reader.readComplete()
        if self.flushOwed { self.flush(context: context) }
        self.tellByteCounts()
    }

    /// The payload bytes the connection's compression inflated and deflated since the last
    /// call: what it cost, to pace.
    package func takeCompressionWork() -> Int {
        guard let compression = self.compression else { return 0 }
        return compression.deflater.takeWork() + compression.inflater.takeWork()
    }

    /// Tells ``countBytes`` what was read and written since it was last told.
    package func tellByteCounts() {
        guard self.bytesRead > 0 || self.bytesWritten > 0, let countBytes else { return }
        let (read, written) = (self.bytesRead, self.bytesWritten)
        self.bytesRead = 0
        self.bytesWritten = 0
        countBytes(read, written)
    }

    /// Passes encoded bytes to the channel.
    private func emit(_ bytes: ByteBuffer, context: ChannelHandlerContext, promise: EventLoopPromise<Void>? = nil) {
        self.bytesWritten += bytes.readableBytes
        context.write(NIOAny(bytes), promise: promise)
    }

    // MARK: Writing

    /// Encodes and writes a frame, without flushing.
    /// - Throws: ``FrameEncodingError`` if a field is over its size limit; nothing is written.
    package func write(_ frame: Frame, context: ChannelHandlerContext) throws(FrameEncodingError) {
        if let bytes = try self.writer.append(frame, deflater: self.compression?.deflater) {
            self.emit(bytes, context: context)
        }
        self.unflushed += 1
        self.flushOwed = true
    }

    /// Writes frames encoded elsewhere (a push encoded once for many connections), after those
    /// written before, without flushing.
    package func write(encoded bytes: ByteBuffer, context: ChannelHandlerContext) {
        if let joined = self.writer.take() { self.emit(joined, context: context) }
        self.emit(bytes, context: context)
        self.unflushed += 1
        self.flushOwed = true
    }

    /// Flushes what was written; a flush queued for later is no longer owed.
    /// - Parameter promise: Completed once the bytes are written.
    package func flush(context: ChannelHandlerContext, promise: EventLoopPromise<Void>? = nil) {
        self.flushOwed = false
        self.unflushed = 0
        if let bytes = self.writer.take() {
            self.emit(bytes, context: context, promise: promise)
        } else {
            promise?.succeed()
        }
        context.flush()
        if !self.isReading { self.tellByteCounts() }
    }

    /// What ``flushSoon(context:alone:)`` did.
    package enum FlushDecision: Sendable, Hashable {
        /// It flushed now.
        case flushed
        /// The handler must queue ``FrameConnection/flushAtEndOfBatch(context:)`` on the loop.
        case queueEndOfBatch
        /// The flush comes later: at the end of the current read, or the one queued already.
        case later
    }

    /// Flushes by the policy: at the end of the current read; outside a read at the end of the
    /// loop's batch of work; at once when ``maxUnflushedFrames`` wait or nothing else can join
    /// this write (`alone`).
    package func flushSoon(context: ChannelHandlerContext, alone: Bool = false) -> FlushDecision {
        guard self.flushOwed else { return .later }
        if self.unflushed >= Self.maxUnflushedFrames || (alone && !self.isReading) {
            self.flush(context: context)
            return .flushed
        }
        guard !self.isReading, !self.flushQueued else { return .later }
        self.flushQueued = true
        return .queueEndOfBatch
    }

    /// The flush queued at the end of the loop's batch: flushes unless something did meanwhile.
    /// - Returns: Whether it flushed.
    @discardableResult
    package func flushAtEndOfBatch(context: ChannelHandlerContext) -> Bool {
        self.flushQueued = false
        guard self.flushOwed else { return false }
        self.flush(context: context)
        return true
    }

    /// The connection's timer fired: ``ConnectionTimer/fired()``, and the write buffer kept
    /// between batches is let go if nothing waits in it (a connection the timer finds idle
    /// holds no buffer; a busy one allocates it again at most once per timer).
    package func timerFired() {
        self.timer.fired()
        if !self.flushOwed { self.writer.releaseStorage() }
    }

    // MARK: Closing

    /// Writes a last frame, flushes, and closes the channel once it is written. The caller's
    /// machine bounds how long that may take (a peer that does not read never completes it).
    /// - Returns: `false` if the connection was closing already (nothing is written).
    @discardableResult
    package func writeAndClose(_ frame: Frame, context: ChannelHandlerContext) -> Bool {
        guard !self.isClosing else { return false }
        try? self.write(frame, context: context)  // a last frame that cannot be encoded is not sent
        self.isClosing = true
        let written = context.eventLoop.makePromise(of: Void.self)
        self.flush(context: context, promise: written)
        written.futureResult.assumeIsolated().whenComplete { _ in context.close(promise: nil) }
        return true
    }

    /// Closes the channel after what was written so far.
    package func close(context: ChannelHandlerContext) {
        self.isClosing = true
        if self.flushOwed { self.flush(context: context) }
        context.close(promise: nil)
    }

    /// Called from the handler's outbound `close`: what was written first goes out first.
    package func closing(context: ChannelHandlerContext) {
        self.isClosing = true
        if self.flushOwed { self.flush(context: context) }
    }

    // MARK: Backpressure

    /// The pipeline wants to read: passes the read on, or holds it while the peer does not read
    /// (see `holdsReadsWhileUnwritable`) or the owner holds reads (`ownerHolds`).
    package func read(context: ChannelHandlerContext, ownerHolds: Bool) {
        if ownerHolds || (self.holdsReadsWhileUnwritable && !self.isWritable) {
            self.readHeld = true
        } else {
            context.read()
        }
    }

    /// Passes on a held read, unless something still holds reads.
    package func resumeReading(context: ChannelHandlerContext, ownerHolds: Bool) {
        guard self.readHeld, !ownerHolds, !(self.holdsReadsWhileUnwritable && !self.isWritable) else { return }
        self.readHeld = false
        context.read()
    }

    /// The channel's writability changed.
    /// - Returns: Whether it is writable now.
    package func writabilityChanged(context: ChannelHandlerContext, ownerHolds: Bool) -> Bool {
        self.isWritable = context.channel.isWritable
        if self.isWritable { self.resumeReading(context: context, ownerHolds: ownerHolds) }
        return self.isWritable
    }
}

extension FrameConnection.Inbound: Sendable {}
