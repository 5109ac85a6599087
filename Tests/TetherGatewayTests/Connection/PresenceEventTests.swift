import NIOCore
import Testing
import TetherCore
import TetherTestSupport

@testable import TetherGateway

/// A subscription's presence events on one connection (an `EmbeddedChannel`): the members in
/// pages, then the changes, each event written once the pages reached its client.
@Suite("Presence events on a connection")
struct PresenceEventTests {
    /// alice's connection, with channels, on a gateway whose channels keep presence (but
    /// `quiet.*`), its pages of members 2 long.
    static func fixture() throws -> GatewayHandlerFixture {
        let fixture = try GatewayHandlerFixture(configure: { configuration in
            configuration.channels = try .init(
                rules: [
                    .init(pattern: try ChannelPattern("quiet.*"), history: nil),
                    .init(pattern: .all, history: nil, presence: true),
                ],
                recoveryPageSize: 2
            )
        })
        try fixture.establish(
            hello: Frame.Hello(versions: 1...1, features: [.checksum, .channels], maxBodySize: 1 << 20, clientID: "alice")
        )
        return fixture
    }

    /// Subscribes connection `id` of `clientID` to `room` in the hub, as another connection of
    /// the gateway would (without presence events).
    static func join(_ fixture: GatewayHandlerFixture, _ clientID: String, connection id: UInt64) {
        let hub = fixture.gateway.services.pushes.channels!
        let handler = NIOLoopBound(fixture.handler, eventLoop: fixture.loop)
        _ = hub.subscribe(
            connection: id,
            handler: handler,
            member: ChannelHub.Member(clientID: clientID, info: "I-\(clientID)"),
            to: Frame.Subscribe(id: 1, channel: "room")
        )
    }

    static func leave(_ fixture: GatewayHandlerFixture, connection id: UInt64) {
        _ = fixture.gateway.services.pushes.channels!.remove(connection: id)
    }

    /// The frames written since the last call, as "SUBSCRIBED", "+client" and "-client".
    static func written(_ fixture: GatewayHandlerFixture) throws -> [String] {
        var frames: [String] = []
        while let frame = try fixture.readOutbound() {
            switch frame.payload {
            case .subscribed(let subscribed): frames.append(subscribed.status == .ok ? "SUBSCRIBED" : "REFUSED \(subscribed.status)")
            case .presence(let event):
                #expect(event.channel == "room" || event.channel.hasPrefix("quiet."))
                if event.kind == .joined { #expect(event.info == "I-\(event.clientID)" || event.clientID == "alice") }
                frames.append((event.kind == .joined ? "+" : "-") + event.clientID)
            default: frames.append("\(frame.type)")
            }
        }
        return frames
    }

    @Test(
        "the members come first in pages, then the changes; a change about a client the pages have not reached is left to them, one they passed is written"
    )
    func membersThenChanges() throws {
        let fixture = try Self.fixture()
        for (index, clientID) in ["m0", "m1", "m2", "m3"].enumerated() { Self.join(fixture, clientID, connection: 100 + UInt64(index)) }
        try fixture.writeInbound(Frame(.subscribe(.init(id: 5, channel: "room", presenceEvents: true)), flags: .checksum))
        // Queued behind the first page: m5 joins (past the first page, which ends at m0), and
        // m0 leaves (which the first page passed).
        fixture.loop.execute { Self.join(fixture, "m5", connection: 105) }
        fixture.loop.execute { Self.leave(fixture, connection: 100) }
        fixture.loop.run()
        #expect(try Self.written(fixture) == ["SUBSCRIBED", "+alice", "+m0", "+m1", "+m2", "-m0", "+m3", "+m5"])

        // Every page written: every change is.
        Self.join(fixture, "m6", connection: 106)
        Self.join(fixture, "m1", connection: 201)  // m1's second device: no event
        Self.leave(fixture, connection: 101)  // its first: m1 is still there
        fixture.loop.run()
        #expect(try Self.written(fixture) == ["+m6"])
        Self.leave(fixture, connection: 201)
        fixture.loop.run()
        #expect(try Self.written(fixture) == ["-m1"])

        // Unsubscribed: nothing more.
        try fixture.writeInbound(Frame(.unsubscribe(.init(channel: "room")), flags: .checksum))
        Self.join(fixture, "m7", connection: 107)
        fixture.loop.run()
        #expect(try Self.written(fixture) == [])
    }

    @Test("a subscription made again starts with the members again; the events of the one it replaced are not written")
    func resubscribed() throws {
        let fixture = try Self.fixture()
        Self.join(fixture, "m0", connection: 100)
        try fixture.writeInbound(Frame(.subscribe(.init(id: 5, channel: "room", presenceEvents: true)), flags: .checksum))
        fixture.loop.run()
        #expect(try Self.written(fixture) == ["SUBSCRIBED", "+alice", "+m0"])
        // m1 joins; its event is on its way when alice subscribes again, whose pages then pass m1.
        Self.join(fixture, "m1", connection: 101)
        try fixture.writeInbound(Frame(.subscribe(.init(id: 6, channel: "room", presenceEvents: true)), flags: .checksum))
        fixture.loop.run()
        #expect(try Self.written(fixture) == ["SUBSCRIBED", "+alice", "+m0", "+m1"])
        // Without presence events: none.
        try fixture.writeInbound(Frame(.subscribe(.init(id: 7, channel: "room")), flags: .checksum))
        Self.join(fixture, "m2", connection: 102)
        fixture.loop.run()
        #expect(try Self.written(fixture) == ["SUBSCRIBED"])
    }

    @Test("presence events of a channel that keeps no presence are refused, and the subscription with them")
    func refused() throws {
        let fixture = try Self.fixture()
        try fixture.writeInbound(Frame(.subscribe(.init(id: 5, channel: "quiet.room", presenceEvents: true)), flags: .checksum))
        fixture.loop.run()
        #expect(try Self.written(fixture) == ["REFUSED invalid request"])
        try fixture.writeInbound(Frame(.subscribe(.init(id: 6, channel: "quiet.room")), flags: .checksum))
        fixture.loop.run()
        #expect(try Self.written(fixture) == ["SUBSCRIBED"])
    }

    @Test("a cursor writes an event about a client its pages reached (bytewise), and every event once they are all written")
    func cursor() {
        var cursor = GatewayConnectionHandler.PresenceCursor(generation: 1)
        #expect(!cursor.writes(about: "a"))
        cursor.reached = "b"
        #expect(cursor.writes(about: "a") && cursor.writes(about: "b") && !cursor.writes(about: "ba") && !cursor.writes(about: "c"))
        #expect(!cursor.writes(about: "é") && cursor.writes(about: "B"), "bytewise, not by locale")
        cursor.done = true
        #expect(cursor.writes(about: "z"))
    }
}
