import CLibFuzzer
import NIOCore

@testable import TetherCore

#if canImport(Glibc)
    import Glibc
#elseif canImport(Darwin)
    import Darwin
#endif

/// Feeds arbitrary bytes to the decoders of the reserved channel methods' bodies (PROTOCOL.md,
/// sections 12.1 to 12.3): the gateway's (a `$channel.history` query, a `$channel.publish`
/// request, a `$channel.presence` query) and the client's (a history page, a publication's
/// position, a presence page). None may crash or
/// allocate according to an unvalidated count, and whatever one accepts must encode back to a
/// body that decodes to the same value.
@_cdecl("LLVMFuzzerTestOneInput")
func fuzzChannelBodies(_ start: UnsafePointer<UInt8>?, _ count: Int) -> CInt {
    guard let start else { return 0 }
    let body = ByteBuffer(bytes: UnsafeRawBufferPointer(start: start, count: count))
    if let query = try? ChannelHistoryQuery(decoding: body) {
        guard let encoded = try? query.encoded(), (try? ChannelHistoryQuery(decoding: encoded)) == query else {
            fatalError("a history query does not survive a round trip: \(query)")
        }
        // The same bytes as the answer to that query, as a client reads it.
        if let page = try? query.page(decoding: body) {
            guard (try? query.page(decoding: ChannelHistoryQuery.encode(page))) == page else {
                fatalError("a history page does not survive a round trip: \(page)")
            }
        }
    }
    if let publish = try? ChannelPublishRequest(decoding: body) {
        guard let encoded = try? publish.encoded(), (try? ChannelPublishRequest(decoding: encoded)) == publish else {
            fatalError("a publish request does not survive a round trip: \(publish)")
        }
    }
    if let position = try? ChannelPublishRequest.position(decoding: body) {
        guard (try? ChannelPublishRequest.position(decoding: ChannelPublishRequest.encode(position))) == position else {
            fatalError("a position does not survive a round trip: \(position)")
        }
    }
    if let presence = try? ChannelPresenceQuery(decoding: body) {
        guard let encoded = try? presence.encoded(), (try? ChannelPresenceQuery(decoding: encoded)) == presence else {
            fatalError("a presence query does not survive a round trip: \(presence)")
        }
    }
    let members = ChannelPresenceQuery(channel: "room.lobby")
    if let page = try? members.page(decoding: body) {
        guard (try? members.page(decoding: ChannelPresenceQuery.encode(page))) == page else {
            fatalError("a presence page does not survive a round trip: \(page)")
        }
    }
    // A page for a query of every channel name the input could hold.
    let query = ChannelHistoryQuery(channel: "room.lobby", after: nil, limit: ChannelHistoryQuery.maxLimit)
    if let page = try? query.page(decoding: body) {
        guard (try? query.page(decoding: ChannelHistoryQuery.encode(page))) == page else {
            fatalError("a history page does not survive a round trip: \(page)")
        }
    }
    return 0
}

// SwiftPM links this file's top-level code as the program's entry point; hand over to libFuzzer.
var argc = CommandLine.argc
var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
exit(LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzChannelBodies(data, size) })
