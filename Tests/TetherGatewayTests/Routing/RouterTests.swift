import NIOCore
import Testing

@testable import TetherGateway

@Suite("Router")
struct RouterTests {
    static func connection(rooms: Set<String>? = nil, topics: Set<String>? = nil) -> ConnectionInfo {
        ConnectionInfo(
            id: 1,
            clientID: "alice",
            userAgent: nil,
            remoteAddress: nil,
            identity: ClientIdentity(clientID: "alice", rooms: rooms, topics: topics)
        )
    }

    @Test("methods route to their task or inline handler, the last registration wins, unknown methods and topics have none")
    func routes() {
        var router = Router()
        router.add("echo", .task({ request, _ in request.body }))
        router.add("fast", .inline({ _, _ in ByteBuffer(string: "first") }))
        router.add("fast", .inline({ _, _ in ByteBuffer(string: "second") }))
        router.add(topic: "dm") { _, _ in }
        guard case .task = router.route("echo") else {
            Issue.record("echo is a task handler")
            return
        }
        guard case .inline = router.route("fast") else {
            Issue.record("fast is an inline handler")
            return
        }
        #expect(router.routes.count == 2)
        #expect(router.route("nope") == nil)
        #expect(router.messageHandler("dm") != nil && router.messageHandler("nope") == nil)
    }

    @Test("access: unrestricted credentials allow everything and need no check; claims restrict methods, topics and rooms")
    func access() {
        let router = Router()
        let open = Self.connection()
        #expect(!router.checksAccess(of: open))
        #expect(router.permits(.request(method: "anything"), open) && router.permits(.join(room: "any"), open))

        let restricted = Self.connection(rooms: ["lobby"], topics: ["chat.send"])
        #expect(router.checksAccess(of: restricted), "claims make every access checked")
        #expect(router.permits(.request(method: "chat.send"), restricted))
        #expect(router.permits(.send(topic: "chat.send"), restricted))
        #expect(!router.permits(.request(method: "admin.reset"), restricted))
        #expect(router.permits(.join(room: "lobby"), restricted) && !router.permits(.join(room: "vip"), restricted))
    }

    @Test("the authorizer is asked after the credentials, for every connection once set")
    func authorizer() {
        var router = Router()
        router.authorizer = { access, connection in
            if case .request(let method) = access { return !method.hasPrefix("admin.") || connection.clientID == "root" }
            return true
        }
        let alice = Self.connection()
        #expect(router.checksAccess(of: alice))
        #expect(router.permits(.request(method: "echo"), alice))
        #expect(!router.permits(.request(method: "admin.reset"), alice))
        let restricted = Self.connection(topics: ["echo"])
        #expect(!router.permits(.request(method: "other"), restricted), "the credentials refuse before the hook is asked")
    }
}
