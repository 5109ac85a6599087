import NIOCore
import Testing

@testable import TetherCore

@Suite("Message inbox")
struct MessageInboxTests {
    static let start = TetherInstant(nanoseconds: 1_000_000_000)

    static func message(_ id: UInt64, bytes: Int = 10) -> Frame.Message {
        Frame.Message(
            id: id,
            topic: "chat",
            conversation: "c",
            sequence: id,
            body: ByteBuffer(repeating: 0x61, count: bytes)
        )
    }

    @Test("one batch at a time: messages that arrive meanwhile wait, and the next batch holds them all, up to maxBatch")
    func oneBatchAtATime() {
        var inbox = MessageInbox(limits: .init(maxBytes: 1 << 20, maxBatch: 3), now: Self.start)
        let first = inbox.received(Self.message(1), now: Self.start)
        #expect(first?.map(\.message.id) == [1], "an idle inbox hands a message over at once")
        for id: UInt64 in 2...5 { #expect(inbox.received(Self.message(id), now: Self.start) == nil) }
        #expect(inbox.count == 4 && inbox.isProcessing)
        #expect(inbox.batchEnded(now: Self.start)?.map(\.message.id) == [2, 3, 4], "at most maxBatch")
        #expect(inbox.batchEnded(now: Self.start)?.map(\.message.id) == [5])
        #expect(inbox.batchEnded(now: Self.start) == nil && !inbox.isProcessing && inbox.count == 0)
    }

    @Test("a retransmission of a message still waiting is dropped; once handed over, a copy waits again (the lane dedupes it)")
    func retransmissionWhileWaiting() {
        var inbox = MessageInbox(limits: .init(maxBytes: 1 << 20), now: Self.start)
        _ = inbox.received(Self.message(1), now: Self.start)
        _ = inbox.received(Self.message(2), now: Self.start)
        _ = inbox.received(Self.message(2), now: Self.start)
        #expect(inbox.count == 1, "the copy of 2 is dropped while 2 waits")
        #expect(inbox.batchEnded(now: Self.start)?.map(\.message.id) == [2])
        #expect(inbox.received(Self.message(2), now: Self.start) == nil && inbox.count == 1)
    }

    @Test("reading stops at maxMessages or maxBytes waiting (the batch in process counts its bytes), and resumes as batches end")
    func holdsReads() {
        var byCount = MessageInbox(limits: .init(maxMessages: 3, maxBytes: 1 << 20), now: Self.start)
        _ = byCount.received(Self.message(1), now: Self.start)  // processing
        for id: UInt64 in 2...3 { _ = byCount.received(Self.message(id), now: Self.start) }
        #expect(!byCount.holdsReads)
        _ = byCount.received(Self.message(4), now: Self.start)
        #expect(byCount.holdsReads, "three waiting")
        _ = byCount.batchEnded(now: Self.start)
        #expect(!byCount.holdsReads)

        var byBytes = MessageInbox(limits: .init(maxBytes: 250), now: Self.start)
        _ = byBytes.received(Self.message(1, bytes: 200), now: Self.start)
        #expect(!byBytes.holdsReads)
        _ = byBytes.received(Self.message(2, bytes: 50), now: Self.start)
        #expect(byBytes.holdsReads, "200 processing + 50 waiting")
        _ = byBytes.batchEnded(now: Self.start)  // 2 is taken: 50 bytes in process
        #expect(!byBytes.holdsReads)
        byBytes.close()
        #expect(byBytes.count == 0 && !byBytes.holdsReads, "closing drops what waits")
    }

    @Test("a client sending at 10x messagesPerSecond with a window of 256 is paced to >= 95 % of the limit, never above it")
    func pacedToTheLimit() {
        let limit = 1_000
        let window = 256
        var inbox = MessageInbox(limits: .init(maxBytes: 1 << 20, messagesPerSecond: limit), now: Self.start)
        var now = Self.start
        var inFlight = 0  // sent by the client, not yet acknowledged
        var nextID: UInt64 = 1
        var processed = 0
        var timer: TetherInstant?
        let step = Duration.milliseconds(1)
        let seconds = 10
        // The lane finishes each batch at once and acknowledges it: the client's window opens.
        func process(_ batch: [ReliableLaneMachine.Received]?) {
            var batch = batch
            while let current = batch {
                processed += current.count
                inFlight -= current.count
                batch = inbox.batchEnded(now: now)
            }
            timer = inbox.nextDeadline(now: now)
        }
        for _ in 0..<(seconds * 1000) {
            // The client offers 10x the limit, as far as its window lets it.
            for _ in 0..<min(10 * limit / 1000, window - inFlight) {
                inFlight += 1
                let batch = inbox.received(Self.message(nextID), now: now)
                nextID += 1
                process(batch)
            }
            #expect(!inbox.holdsReads, "the client's window bounds what waits")
            now = now + step
            if let deadline = timer, deadline <= now {
                timer = nil
                process(inbox.timerFired(now: now))
            }
        }
        let sustained = Double(processed - limit) / Double(seconds)  // less the initial burst
        #expect(sustained >= 0.95 * Double(limit), "\(processed) processed in \(seconds) s at \(limit)/s")
        #expect(processed <= limit * (seconds + 1), "never above the rate and its burst")
    }

    @Test(
        "a paced sender's batches hold a quantum of tokens (a twentieth of a second's), not the one or two that came in while the last batch ran"
    )
    func pacedInQuanta() {
        let limit = 1_000  // a quantum of 50
        var inbox = MessageInbox(limits: .init(maxBytes: 1 << 20, messagesPerSecond: limit), now: Self.start)
        var now = Self.start
        var nextID: UInt64 = 1
        var processing: (batch: Int, endsAt: TetherInstant)?
        var timer: TetherInstant?
        var handed = 0
        var paced: [Int] = []  // the sizes of the batches once the burst is spent
        let step = Duration.milliseconds(1)
        // The lane takes 2 ms per batch (a transaction and its acknowledgement); the client keeps
        // 100 messages waiting; 5 s.
        func start(_ batch: [ReliableLaneMachine.Received]?) {
            if let batch {
                handed += batch.count
                if now >= Self.start + .milliseconds(1_500) { paced.append(batch.count) }
                processing = (batch.count, now + .milliseconds(2))
            } else {
                timer = inbox.nextDeadline(now: now)
            }
        }
        for _ in 0..<5_000 {
            while inbox.count < 100 {
                let batch = inbox.received(Self.message(nextID), now: now)
                nextID += 1
                if batch != nil { start(batch) }
            }
            now = now + step
            if let current = processing, current.endsAt <= now {
                processing = nil
                start(inbox.batchEnded(now: now))
            }
            if processing == nil, let deadline = timer, deadline <= now {
                timer = nil
                start(inbox.timerFired(now: now))
            }
        }
        #expect(paced.count > 50)
        #expect(inbox.quantum == 50)
        #expect(paced.allSatisfy { $0 >= 50 }, "batch sizes once paced: \(Array(paced.prefix(20)))")
        #expect(handed >= limit + 4 * 950 && handed <= limit * 6, "\(handed) in 5 s at \(limit)/s")
    }

    @Test("with no rate, every waiting message is handed over as soon as the batch before it ends")
    func unpaced() {
        var inbox = MessageInbox(limits: .init(maxBytes: 1 << 20), now: Self.start)
        _ = inbox.received(Self.message(1), now: Self.start)
        for id: UInt64 in 2...1000 { _ = inbox.received(Self.message(id), now: Self.start) }
        #expect(inbox.nextDeadline(now: Self.start) == nil, "no timer without a rate")
        var handed = 1
        while let batch = inbox.batchEnded(now: Self.start) { handed += batch.count }
        #expect(handed == 1000)
    }
}
