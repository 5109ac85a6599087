import NIOCore
import TetherCore

extension GatewayConnectionHandler {
    /// Writes pushes that were encoded once for many connections, and marks the connection for
    /// a flush without scheduling one (its loop's ``PushBatcher`` flushes every connection it
    /// wrote to at the end of its batch).
    ///
    /// Call it on the event loop. Pushes reach only established connections (the registry
    /// lists a connection as established once its WELCOME is written). A push larger than this
    /// client accepts is dropped (and logged); a client that does not read its pushes is closed.
    /// - Parameter compressed: The push compressed for the connections of this batch that
    ///   compress it: the first one to need it compresses it, the others write the same bytes.
    /// - Returns: Whether the caller must call ``flushIfPending()`` at the end of its batch.
    func deliver(_ push: EncodedPush, compressed: inout CompressedPush) -> Bool {
        guard let context = self.context, self.machine.isEstablished, let limit = self.machine.peerMaxBodySize else { return false }
        guard self.keepsUp(context: context) else { return false }
        let flushOwed = self.io.flushOwed
        if self.io.framing == .byteStream, push.largestBody <= limit, !push.hasPublications || self.takesEvery(push.pushes),
            let bytes = self.sharedFrames(of: push, compressed: &compressed, context: context)
        {
            self.io.write(encoded: bytes, context: context)
        } else {
            // One frame per message, or a push over this client's limit: each push on its own.
            var wrote = false
            for frame in push.pushes where self.takes(frame) {
                guard frame.bodySize <= limit else {
                    self.services.metrics.refused("push_size")
                    self.logger.warning(
                        "dropping a push larger than the client accepts",
                        metadata: ["topic": "\(frame.name)", "bytes": "\(frame.bodySize)", "limit": "\(limit)"]
                    )
                    continue
                }
                wrote = self.write(frame.payload) || wrote
            }
            guard wrote else { return false }
        }
        return !flushOwed
    }

    /// The frames of `push` as every connection like this one gets them: encoded once, with or
    /// without their checksum, or compressed once for the connections that compress it; `nil`
    /// if they cannot be compressed (each push is then written on its own).
    private func sharedFrames(of push: EncodedPush, compressed: inout CompressedPush, context: ChannelHandlerContext) -> ByteBuffer? {
        let checksum = self.machine.outboundFlags.contains(.checksum)
        guard let deflater = self.io.compression?.deflater, push.largestBody >= deflater.threshold else {
            return checksum ? push.checksummed : push.plain
        }
        return try? compressed.frames(of: push, checksum: checksum, deflater: deflater, allocator: context.channel.allocator)
    }

    /// Flushes what ``deliver(_:)`` wrote, unless something flushed it meanwhile.
    func flushIfPending() {
        guard let context = self.context, self.io.flushOwed else { return }
        self.io.flush(context: context)
    }

    /// Whether the client reads what it is sent; if not (its outbound buffer is over the
    /// limit), closes the connection.
    private func keepsUp(context: ChannelHandlerContext) -> Bool {
        // Reading the buffered byte count costs more than the push; a channel is writable
        // until its buffer passes the (lower) high-water mark, so look only when it is not.
        let limit = self.services.configuration.limits.maxBufferedOutboundBytes
        guard !self.io.isWritable, let buffered = try? context.channel.syncOptions?.getOption(.bufferedWritableBytes), buffered > limit
        else { return true }
        self.services.metrics.slowConsumers.increment()
        self.logger.warning(
            "closing a connection whose client does not read its pushes (slow consumer)",
            metadata: ["buffered": "\(buffered)", "limit": "\(limit)"]
        )
        // Behind what is buffered; should the client catch up, it learns why.
        let report = Frame.ErrorReport(
            code: .resourceExhausted,
            message: "slow consumer: \(buffered) bytes waited for the client to read them, over the limit of \(limit)"
        )
        self.writeAndClose(.error(report), settle: self.machine.startClosing(writingLastFrame: true, now: self.services.clock.now))
        return false
    }
}
