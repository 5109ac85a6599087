import Testing

@testable import TetherCore

@Suite("Presence table")
struct PresenceTableTests {
    typealias Key = PresenceTable<String>.ConnectionKey

    @Test("a client joins with its first connection and leaves with its last; connections between make no event")
    func joinAndLeave() {
        var presence = PresenceTable<String>()
        let phone = Key(connection: 1)
        let laptop = Key(connection: 2)
        #expect(presence.join("lobby", client: "alice", on: phone, info: "phone") == .joined("alice", "phone"))
        #expect(presence.join("lobby", client: "alice", on: laptop, info: "laptop") == nil)
        #expect(presence.count(of: "lobby") == (clients: 1, connections: 2))
        #expect(presence.members(of: "lobby").first?.connections == [phone: "phone", laptop: "laptop"])
        #expect(presence.leave("lobby", on: phone) == nil)
        #expect(presence.leave("lobby", on: phone) == nil)  // not there any more
        #expect(presence.leave("lobby", on: laptop) == .left("alice"))
        #expect(!presence.isOccupied("lobby"))
        #expect(presence.members(of: "lobby").isEmpty)
    }

    @Test("a connection that closes leaves every channel it was in; other clients stay")
    func connectionCloses() {
        var presence = PresenceTable<String>()
        let alice = Key(connection: 1)
        let bob = Key(connection: 2)
        presence.join("lobby", client: "alice", on: alice, info: "a")
        presence.join("news", client: "alice", on: alice, info: "a")
        presence.join("lobby", client: "bob", on: bob, info: "b")
        let changes = presence.removeConnection(alice)
        #expect(changes.map(\.channel) == ["lobby", "news"])
        #expect(changes.map(\.change) == [.left("alice"), .left("alice")])
        #expect(presence.members(of: "lobby").map(\.clientID) == ["bob"])
        #expect(!presence.isOccupied("news"))
        #expect(presence.removeConnection(alice).isEmpty)
    }

    @Test("a node that is gone takes its connections with it; a client also on another node stays")
    func nodeGone() {
        var presence = PresenceTable<String>()
        presence.join("lobby", client: "alice", on: Key(node: 1, connection: 1), info: "a1")
        presence.join("lobby", client: "alice", on: Key(node: 2, connection: 1), info: "a2")
        presence.join("lobby", client: "bob", on: Key(node: 1, connection: 2), info: "b")
        let changes = presence.removeNode(1)
        #expect(changes.map(\.change) == [.left("bob")])
        #expect(presence.members(of: "lobby").map(\.clientID) == ["alice"])
        #expect(presence.count(of: "lobby") == (clients: 1, connections: 1))
    }

    @Test("joining again on the same connection replaces its info without an event")
    func rejoin() {
        var presence = PresenceTable<String>()
        let key = Key(connection: 7)
        #expect(presence.join("lobby", client: "carol", on: key, info: "old") == .joined("carol", "old"))
        #expect(presence.join("lobby", client: "carol", on: key, info: "new") == nil)
        #expect(presence.members(of: "lobby") == [.init(clientID: "carol", connections: [key: "new"])])
    }

    @Test("ten thousand members: counted and listed")
    func large() {
        var presence = PresenceTable<String>()
        for index in 0..<10_000 { presence.join("big", client: "c\(index)", on: Key(connection: UInt64(index)), info: "") }
        #expect(presence.count(of: "big") == (clients: 10_000, connections: 10_000))
        #expect(presence.members(of: "big").count == 10_000)
        #expect(presence.removeNode(0).count == 10_000)
        #expect(!presence.isOccupied("big"))
    }
}
