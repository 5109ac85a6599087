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
            reaches back.
            """
    )

    @Option(help: "Your name (used as the client id).")
    var user: String

    @Option(help: "The room to join.")
    var room = "lobby"

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
            let messages = client.subscribe(DemoService.channel(of: room))
            let presence = client.pushes(topic: "chat.presence")
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
                        }
                    }
                } catch {
                    print("* #\(room)'s messages stopped: \(error)")
                }
            }
            group.addTask {
                for await push in presence {
                    if let message = try? JSONDecoder().decode(DemoService.ChatMessage.self, from: Data(push.body.readableBytesView)) {
                        print("* \(message.from) \(message.text) #\(message.room)")
                    }
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
