import NIOCore
import Testing
import TetherCore
import TetherTesting

@testable import TetherGateway

@Suite("Channel hub")
struct ChannelHubTests {
    static func hub(history: ChannelRetention? = try! ChannelRetention(maxCount: 100, maxAge: .seconds(60))) throws -> ChannelHub {
        let configuration = try GatewayConfiguration.Channels(rules: [
            .init(pattern: try ChannelPattern("live.*"), history: nil),
            .init(pattern: .all, history: history),
        ])
        return ChannelHub(configuration: configuration, clock: ManualClock())
    }

    @Test("a publication kept in history holds a buffer of its own size, not the larger buffer it was sliced from")
    func slicesAreCopied() throws {
        let hub = try Self.hub()
        var read = ByteBuffer(repeating: 1, count: 65_536)
        let slice = read.readSlice(length: 10)!
        #expect(slice.storageCapacity >= 65_536)
        let (kept, sequence, recipients) = hub.publish(slice, to: "room.lobby", publisher: "alice")
        #expect(kept.body == slice && kept.body.storageCapacity < 1_024)
        #expect(sequence == 1 && recipients.isEmpty && kept.position.offset == 1)
        #expect(hub.counts.historyBytes == 10)

        let (live, _, _) = hub.publish(slice, to: "live.scores", publisher: "alice")
        #expect(live.body.storageCapacity >= 65_536, "not kept: not copied")
        #expect(live.position == ChannelPosition(epoch: 0, offset: 0))
    }

    @Test("a publication to a channel with no history and no subscriber leaves nothing behind")
    func nothingKept() throws {
        let hub = try Self.hub()
        _ = hub.publish(ByteBuffer(string: "x"), to: "live.scores", publisher: "")
        #expect(hub.counts.channels == 0)
        _ = hub.publish(ByteBuffer(string: "x"), to: "room.lobby", publisher: "")
        #expect(hub.counts.channels == 1, "kept for the subscribers that come back")
    }
}
