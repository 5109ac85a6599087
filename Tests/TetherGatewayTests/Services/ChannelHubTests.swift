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

    @Test("a history page holds at most 64 KiB of bodies (a larger publication alone), and says more follow")
    func pagesByBytes() throws {
        let hub = try Self.hub(history: try ChannelRetention(maxCount: 1_000, maxAge: .seconds(60)))
        for _ in 1...300 { _ = hub.publish(ByteBuffer(repeating: 1, count: 1_024), to: "room.lobby", publisher: "") }
        let page = hub.history(of: "room.lobby", after: nil, limit: 1_000)
        #expect(page.publications.count == 64 && page.more && page.publications.first?.position.offset == 1)
        _ = hub.publish(ByteBuffer(repeating: 1, count: 100_000), to: "room.big", publisher: "")
        _ = hub.publish(ByteBuffer(repeating: 1, count: 10), to: "room.big", publisher: "")
        let big = hub.history(of: "room.big", after: nil, limit: 10)
        #expect(big.publications.map(\.position.offset) == [1] && big.more)
    }
}
