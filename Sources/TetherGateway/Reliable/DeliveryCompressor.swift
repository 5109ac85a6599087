import NIOCore
import TetherCompression
import TetherCore

/// Compresses the payloads of deliveries before they are stored, as the gateway compresses what
/// it sends (``GatewayConfiguration/compression``): a payload worth it is stored as raw DEFLATE
/// (``NewDelivery/compressed``), counted against the store's quotas at that size, and sent as
/// it is to a client that negotiated compression. A body delivered to many recipients (a room)
/// is compressed once.
///
/// For one batch (or one delivery) at a time: it holds zlib's state, made on first use.
struct DeliveryCompressor {
    private let compression: Compression?
    private var deflater: PayloadDeflater?
    /// The last body compressed, and what it became (`nil`: not worth it).
    private var last: (body: ByteBuffer, compressed: ByteBuffer?)?

    /// - Parameter compression: The gateway's compression settings; `nil`: nothing is compressed.
    init(_ compression: Compression?) {
        self.compression = compression
    }

    /// The deliveries, their payloads compressed where it is worth it.
    mutating func compress(_ deliveries: [NewDelivery]) -> [NewDelivery] {
        guard let compression = self.compression else { return deliveries }
        return deliveries.map { delivery in
            guard !delivery.compressed, delivery.body.readableBytes >= compression.threshold else { return delivery }
            let compressed: ByteBuffer?
            if let last = self.last, last.body == delivery.body {
                compressed = last.compressed
            } else {
                compressed = self.deflate(delivery.body, settings: compression)
                self.last = (delivery.body, compressed)
            }
            guard let compressed else { return delivery }
            return NewDelivery(recipient: delivery.recipient, topic: delivery.topic, body: compressed, compressed: true)
        }
    }

    private mutating func deflate(_ body: ByteBuffer, settings: Compression) -> ByteBuffer? {
        if self.deflater == nil { self.deflater = try? PayloadDeflater(threshold: settings.threshold, level: Int32(settings.level)) }
        guard let deflater = self.deflater else { return nil }
        var compressed = ByteBuffer()
        return deflater.deflate(body, into: &compressed) ? compressed : nil
    }
}
