import ArgumentParser
import Foundation
import NIOCore
import Tether

struct Chat: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "An interactive chat room over a gateway started with `tether serve`.",
        discussion: """
            Type a line and press return to send it; Ctrl-D leaves. The room's messages come from \
            the channel chat.ROOM: after a lost connection, the ones sent meanwhile arrive when it \
            is back, or a line says how many were missed when the gateway's history no longer \
            reaches back. Who is in the room comes from the channel's presence: a line when someone             joins or leaves (a gateway started with `--no-channel-presence` refuses it: pass             `--no-presence`).
            """
    )

    @Option(help: "Your name (used as the client id).")
    var user: String

    @Option(help: "The room to join.")
    var room = "lobby"

    @Flag(inversion: .prefixedNo, help: "Show who joins and leaves the room (the channel's presence events).")
    var presence = true

    @OptionGroup var gateway: GatewayOptions

    @OptionGroup var logging: LoggingOptions

    func run() async throws {
        try self.logging.bootstrap(default: .critical)
        let client = try TetherClient(configuration: self.gateway.configuration(clientID: self.user), transport: self.gateway.transport())
        let room = self.room
        let lines = standardInputLines()
        print(
            "* connecting to \(try self.gateway.endpoints().map(\.description).joined(separator: ", ")) as \(self.user); type to talk in #\(room), Ctrl-D to leave"
        )

        try await withThrowingDiscardingTaskGroup { group in
            let events = client.events
            let messages = client.subscribe(DemoService.channel(of: room), presence: self.presence)
            let user = self.user
            group.addTask { try await client.run() }
            group.addTask {
                // Room membership belongs to a connection: join again after every reconnect.
                for await event in events {
                    switch event {
                    case .connected:
                        print("* \(event)")
                        do {
                            let reply = try await client.request("chat.join", body: ByteBuffer(string: room))
                            print("* \(String(buffer: reply))")
                        } catch {
                            print("* could not join #\(room): \(error)")
                        }
                    case .disconnected, .failed, .endpointBlocked, .alert:
                        print("* \(event)")
                    case .connecting, .connectFailed, .backingOff, .waitingForNetwork:
                        break
                    }
                }
            }
            group.addTask {
                var here: Set<String> = []
                var before: Set<String> = []
                do {
                    for try await event in messages {
                        switch event {
                        case .publication(let publication):
                            if let message = try? JSONDecoder().decode(
                                DemoService.ChatMessage.self,
                                from: Data(publication.body.readableBytesView)
                            ) {
                                print("[\(message.room)] \(message.from): \(message.text)")
                            }
                        case .gap(let gap):
                            let count = gap.missed.map { "\($0) messages" } ?? "an unknown number of messages"
                            print("* gap: \(count) of #\(room) missed while away; the gateway's history no longer has them")
                        case .subscribed(let recovered):
                            if !recovered { print("* #\(room) may have had messages while away that cannot be recovered") }
                            // Its members follow, as joins: the roster starts afresh (quietly for
                            // those that were there before the reconnect).
                            before = here
                            here = []
                        case .joined(let member, _):
                            if member != user, here.insert(member).inserted, !before.contains(member) {
                                print("* \(member) is in #\(room)")
                            }
                        case .left(let member):
                            if here.remove(member) != nil { print("* \(member) left #\(room)") }
                        }
                    }
                } catch {
                    print("* #\(room)'s messages stopped: \(error)")
                }
            }
            group.addTask {
                defer { client.shutdown() }
                for await line in lines where !line.isEmpty {
                    let body = try DemoService.json(DemoService.ChatSend(room: room, text: line))
                    do {
                        _ = try await client.request("chat.send", body: body)
                    } catch {
                        print("* not sent: \(error)")
                    }
                }
            }
        }
    }
}

/// Lines typed on standard input; ends at end of file.
func standardInputLines() -> AsyncStream<String> {
    let (stream, continuation) = AsyncStream.makeStream(of: String.self)
    let reader = Thread {
        while let line = readLine() { continuation.yield(line) }
        continuation.finish()
    }
    reader.start()
    return stream
}
