import Testing

@testable import TetherCore

@Suite("Channel patterns")
struct ChannelPatternTests {
    @Test("a name matches itself only; a prefix with '*' matches what starts with it; '*' matches everything")
    func matching() throws {
        let lobby = try ChannelPattern("room.lobby")
        #expect(lobby.matches("room.lobby") && !lobby.matches("room.lobby2") && !lobby.matches("room"))
        let rooms = try ChannelPattern("room.*")
        #expect(rooms.matches("room.lobby") && rooms.matches("room.") && !rooms.matches("room") && !rooms.matches("news"))
        #expect(ChannelPattern.all.matches("anything") && ChannelPattern.all.matches("é"))
        #expect(rooms.description == "room.*" && lobby.description == "room.lobby")
    }

    @Test("an empty pattern, one over 255 bytes, or a '*' before the end is refused with a message naming it")
    func refused() {
        for bad in ["", String(repeating: "a", count: 256), "room.*.chat", "**"] {
            #expect(throws: ConfigurationError.self, "\(bad.prefix(20))") { try ChannelPattern(bad) }
        }
        #expect(throws: ConfigurationError("a channel pattern may have one '*', at its end: \"a*b\"")) { try ChannelPattern("a*b") }
    }
}
