import Foundation
import NIOCore
import TetherCore
import TetherGateway
import TetherNIO

/// The handlers `tether serve` and `tether demo` install: echo, time, a chat room, and a slow
/// method for trying timeouts and cancellation.
///
/// | method | body | reply |
/// |---|---|---|
/// | `echo` | anything | the same bytes |
/// | `time.now` | — | the gateway's time, ISO 8601 |
/// | `chat.join` | a room name | `joined ROOM (N online)`; pushes `chat.presence` to the room |
/// | `chat.send` | `{"room": "...", "text": "..."}` | `delivered to N`; pushes `chat.message` to the room, and publishes the message to the channel `chat.ROOM` (whose history lets a subscriber that was away catch up) |
/// | `chat.leave` | a room name | `left ROOM` |
/// | `demo.slow` | milliseconds to sleep | `slept N ms` (honours cancellation) |
///
/// And one reliable message topic (``Gateway/onMessage(_:_:)``):
///
/// | topic | conversation | effect |
/// |---|---|---|
/// | `dm` | the recipient's client id | delivers the body reliably to the recipient, topic `dm` |
enum DemoService {
    struct ChatSend: Codable {
        var room: String
        var text: String
    }

    struct ChatMessage: Codable {
        var room: String
        var from: String
        var text: String
    }

    /// Counts what the slow handler saw, for the demo's report.
    final class Observations: Sendable {
        let cancelledHandlers = Counter()
    }

    static func install(on gateway: Gateway, observations: Observations = Observations()) {
        gateway.handle("echo") { request, _ in request.body }

        gateway.handle("time.now") { _, _ in
            ByteBuffer(string: Date().formatted(.iso8601))
        }

        gateway.handle("chat.join") { request, context in
            let room = Self.roomName(request.body)
            guard !room.isEmpty else { throw RequestError(.invalidRequest, "the body must be a room name") }
            context.join(room)
            let notice = ChatMessage(room: room, from: context.connection.clientID, text: "joined")
            try context.push("chat.presence", Self.json(notice), to: .room(room))
            return ByteBuffer(string: "joined \(room) (\(context.members(of: room).count) online)")
        }

        gateway.handle("chat.leave") { request, context in
            let room = Self.roomName(request.body)
            context.leave(room)
            return ByteBuffer(string: "left \(room)")
        }

        gateway.handle("chat.send") { request, context in
            guard let send = try? JSONDecoder().decode(ChatSend.self, from: Data(request.body.readableBytesView)) else {
                throw RequestError(.invalidRequest, #"the body must be {"room": "...", "text": "..."}"#)
            }
            guard context.members(of: send.room).contains(where: { $0.id == context.connection.id }) else {
                throw RequestError(.permissionDenied, "join '\(send.room)' before sending to it")
            }
            let message = ChatMessage(room: send.room, from: context.connection.clientID, text: send.text)
            let body = try Self.json(message)
            let recipients = try context.push("chat.message", body, to: .room(send.room))
            if send.room.utf8.count + 5 <= 255 { try await context.publish(body, toChannel: Self.channel(of: send.room)) }
            return ByteBuffer(string: "delivered to \(recipients)")
        }

        gateway.onMessage("dm") { message, context in
            guard !message.conversation.isEmpty else {
                throw RequestError(.invalidRequest, "the conversation must be the recipient's client id")
            }
            try context.deliver(to: message.conversation, topic: "dm", body: message.body)
        }

        gateway.handle("demo.slow") { request, _ in
            guard let milliseconds = Int(String(buffer: request.body)), milliseconds >= 0 else {
                throw RequestError(.invalidRequest, "the body must be a number of milliseconds")
            }
            do {
                try await Task.sleep(for: .milliseconds(milliseconds))
            } catch {
                observations.cancelledHandlers.increment()
                throw error
            }
            return ByteBuffer(string: "slept \(milliseconds) ms")
        }
    }

    /// The channel a room's messages are published to: `chat.ROOM`.
    static func channel(of room: String) -> String { "chat.\(room)" }

    static func json(_ value: some Encodable) throws -> ByteBuffer {
        ByteBuffer(bytes: try JSONEncoder().encode(value))
    }

    private static func roomName(_ body: ByteBuffer) -> String {
        String(buffer: body).trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

/// A thread-safe counter.
final class Counter: Sendable {
    private let value = TetherLock(0)
    func increment(by amount: Int = 1) { self.value.withLockedValue { $0 += amount } }
    var count: Int { self.value.withLockedValue { $0 } }
}
