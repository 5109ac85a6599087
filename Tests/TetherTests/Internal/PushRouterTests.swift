import NIOCore
import Testing
import TetherTestSupport

@testable import Tether

@Suite("Push router")
struct PushRouterTests {
    @Test("routes by topic and to catch-all subscribers; forgets a topic when its last subscriber leaves")
    func routing() async throws {
        let router = PushRouter(bufferSize: 16)
        let news = router.subscribe(topic: "news")
        let all = router.subscribe(topic: nil)
        #expect(router.topicCount == 1)
        _ = router.route(Push(topic: "news", body: ByteBuffer(string: "n")))
        _ = router.route(Push(topic: "other", body: ByteBuffer(string: "o")))
        router.finish()
        var newsBodies: [String] = []
        for await push in news { newsBodies.append(String(buffer: push.body)) }
        var allBodies: [String] = []
        for await push in all { allBodies.append(String(buffer: push.body)) }
        #expect(newsBodies == ["n"])
        #expect(allBodies == ["n", "o"])

        let temporary = PushRouter(bufferSize: 16)
        let consumer = Task {
            for await _ in temporary.subscribe(topic: "conversation-42") {}
        }
        try await eventually("the topic exists") { temporary.topicCount == 1 }
        consumer.cancel()
        await consumer.value
        try await eventually("the topic is forgotten") { temporary.topicCount == 0 }
    }

    @Test("a subscriber that falls behind loses its oldest pushes, and the loss is counted")
    func slowSubscriber() {
        let router = PushRouter(bufferSize: 2)
        let stream = router.subscribe(topic: "t")
        var dropped = 0
        for index in 0..<5 {
            dropped += router.route(Push(topic: "t", body: ByteBuffer(string: "\(index)")))
        }
        #expect(dropped == 3)
        _ = stream
    }
}
