import NIOCore
import NIOEmbedded
import Testing
import TetherNIO

@Suite("Deadline timer")
struct DeadlineTimerTests {
    @Test("one timer at the earliest deadline: arming later changes nothing, earlier moves it; needsArming says which")
    func earliestWins() {
        let loop = EmbeddedEventLoop()
        let fired = Box()
        var timer = DeadlineTimer()
        let start = loop.now
        #expect(!timer.needsArming(at: nil), "no deadline, no timer")
        #expect(timer.needsArming(at: start + .seconds(5)))
        timer.arm(at: start + .seconds(5), on: loop) { fired.times.append(loop.now - start) }
        #expect(!timer.needsArming(at: start + .seconds(5)))
        #expect(!timer.needsArming(at: start + .seconds(9)))
        timer.arm(at: start + .seconds(9), on: loop) { Issue.record("a later deadline must not replace the armed one") }
        #expect(timer.needsArming(at: start + .seconds(2)))
        timer.arm(at: start + .seconds(2), on: loop) { fired.times.append(loop.now - start) }
        loop.advanceTime(by: .seconds(10))
        #expect(fired.times == [.seconds(2)], "only the earliest timer fires")
        timer.fired()
        #expect(timer.needsArming(at: start + .seconds(20)), "once fired, the next deadline needs a timer")
        timer.cancel()
        try? loop.syncShutdownGracefully()
    }

    private final class Box {
        var times: [TimeAmount] = []
    }
}
