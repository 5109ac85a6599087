import NIOCore
import Testing

@testable import TetherCore

@Suite("Inbox machine")
struct InboxMachineTests {
    func delivery(_ sequence: UInt64) -> Frame.Delivery {
        Frame.Delivery(sequence: sequence, topic: "t", body: ByteBuffer(string: "\(sequence)"))
    }

    /// An inbox that received 1...count in epoch 7.
    func inbox(received count: UInt64, checkpoint: DeliveryCheckpoint? = nil) -> InboxMachine {
        var inbox = InboxMachine(checkpoint: checkpoint)
        for sequence in 1...count { _ = inbox.received(self.delivery(sequence), epoch: 7) }
        if checkpoint == nil {
            // The first delivery of an epoch makes a checkpoint of it: taken here, as if saved.
            #expect(inbox.takeCheckpointToSave() == DeliveryCheckpoint(epoch: 7, lastSequence: 0))
        }
        return inbox
    }

    @Test("new deliveries are accepted in order; duplicates are dropped; a skipped sequence is a gap")
    func verdicts() {
        var inbox = InboxMachine(checkpoint: nil)
        #expect(inbox.received(self.delivery(1), epoch: 7) == .accepted)
        #expect(inbox.received(self.delivery(2), epoch: 7) == .accepted)
        #expect(inbox.received(self.delivery(2), epoch: 7) == .duplicate)
        #expect(inbox.received(self.delivery(4), epoch: 7) == .gap(expected: 3))
        #expect(inbox.lastReceived == 2 && inbox.waitingCount == 2)
    }

    @Test("a delivery that says those before it were acknowledged on another connection of the client id is the next, not a gap")
    func afterAcknowledgedElsewhere() {
        var inbox = InboxMachine(checkpoint: nil)
        #expect(inbox.received(self.delivery(1), epoch: 7) == .accepted)
        var jump = self.delivery(5)
        jump.afterAcknowledged = true
        #expect(inbox.received(jump, epoch: 7) == .accepted)
        #expect(inbox.received(self.delivery(6), epoch: 7) == .accepted)
        #expect(inbox.received(self.delivery(8), epoch: 7) == .gap(expected: 7), "without the flag, a gap is still a gap")
        #expect(inbox.next()?.sequence == 1 && inbox.next()?.sequence == 5 && inbox.next()?.sequence == 6)
        #expect(inbox.processed == 5)
        var stale = self.delivery(4)
        stale.afterAcknowledged = true
        #expect(inbox.received(stale, epoch: 7) == .duplicate, "the flag never takes the stream back")
    }

    @Test("a delivery is processed when the app asks for the next one, not when it is handed out")
    func processedOnNext() {
        var inbox = self.inbox(received: 2)
        #expect(inbox.next()?.sequence == 1)
        #expect(inbox.processed == 0 && inbox.takeCheckpointToSave() == nil)
        #expect(inbox.next()?.sequence == 2)
        #expect(inbox.processed == 1)
        #expect(inbox.takeCheckpointToSave() == DeliveryCheckpoint(epoch: 7, lastSequence: 1))
        #expect(inbox.takeCheckpointToSave() == nil, "taken once")
        #expect(inbox.next() == nil, "nothing waits")
        #expect(inbox.processed == 2, "asking moved on from 2 too")
    }

    @Test("a consumer that stops (its loop ended or threw) leaves its delivery unprocessed and first in line")
    func consumerStopped() {
        var inbox = self.inbox(received: 3)
        _ = inbox.next()  // 1
        _ = inbox.next()  // 2; 1 processed
        inbox.consumerStopped()
        #expect(inbox.processed == 1, "2 is not processed")
        #expect(inbox.handedOut == nil)
        #expect(inbox.next()?.sequence == 2, "handed out again, before 3")
        #expect(inbox.next()?.sequence == 3)
        inbox.consumerStopped()
        inbox.consumerStopped()  // twice: nothing more to give back
        #expect(inbox.next()?.sequence == 3)
    }

    @Test("an explicit acknowledgement processes the delivery held, and only it")
    func acknowledge() {
        var inbox = self.inbox(received: 3)
        let early = inbox.acknowledge(1)
        #expect(!early, "not handed out yet")
        _ = inbox.next()
        let other = inbox.acknowledge(2)
        #expect(!other, "not the one held")
        let held = inbox.acknowledge(1)
        #expect(held)
        #expect(inbox.processed == 1 && inbox.handedOut == nil)
        let again = inbox.acknowledge(1)
        #expect(again, "acknowledging again is harmless")
        inbox.consumerStopped()
        #expect(inbox.next()?.sequence == 2, "nothing given back: 1 was processed")
    }

    @Test("HELLO's resume point and the acknowledgements never run ahead of the saved checkpoint")
    func acknowledgementsFollowTheCheckpoint() {
        var inbox = self.inbox(received: 3, checkpoint: DeliveryCheckpoint(epoch: 7, lastSequence: 0))
        #expect(inbox.resumePoint == Frame.Hello.Resume(epoch: 7, lastSequence: 0), "received is not processed")
        #expect(inbox.attached(epoch: 7, resume: inbox.resumePoint) == nil)
        _ = inbox.next()
        _ = inbox.next()  // 1 processed
        #expect(inbox.resumePoint?.lastSequence == 0, "not saved yet")
        let checkpoint = inbox.takeCheckpointToSave()!
        #expect(inbox.checkpointSaved(checkpoint) == 1, "saved: acknowledge it")
        #expect(inbox.resumePoint?.lastSequence == 1)
        #expect(inbox.checkpointSaved(checkpoint) == nil, "acknowledged once")
    }

    @Test("a checkpoint saved with no connection is acknowledged on the next connection, unless its HELLO said it")
    func acknowledgedOnAttach() {
        var inbox = self.inbox(received: 2)
        _ = inbox.next()
        _ = inbox.next()
        #expect(inbox.checkpointSaved(inbox.takeCheckpointToSave()!) == nil, "no connection")
        #expect(inbox.attached(epoch: 7, resume: nil) == 1, "a HELLO without the point: tell the gateway now")
        inbox.detached()
        #expect(inbox.attached(epoch: 7, resume: inbox.resumePoint) == nil, "the HELLO said it")
    }

    @Test("a failed save is taken again; a save of an older epoch acknowledges nothing")
    func failedAndStaleSaves() {
        var inbox = self.inbox(received: 2)
        _ = inbox.attached(epoch: 7, resume: nil)
        _ = inbox.next()
        _ = inbox.next()
        let checkpoint = inbox.takeCheckpointToSave()!
        inbox.checkpointFailed()
        #expect(inbox.takeCheckpointToSave() == checkpoint)
        _ = inbox.received(self.delivery(1), epoch: 8)  // another store
        #expect(inbox.checkpointSaved(checkpoint) == nil)
        #expect(inbox.saved == 0)
    }

    @Test("another delivery epoch starts the inbox again and drops what the old store sent")
    func newEpoch() {
        var inbox = self.inbox(received: 3, checkpoint: DeliveryCheckpoint(epoch: 7, lastSequence: 0))
        _ = inbox.next()
        #expect(inbox.received(self.delivery(1), epoch: 8) == .accepted, "sequences of store 8 start at 1")
        #expect(inbox.epoch == 8 && inbox.handedOut == nil && inbox.waitingCount == 1)
        #expect(inbox.takeCheckpointToSave() == DeliveryCheckpoint(epoch: 8, lastSequence: 0))
        #expect(inbox.resumePoint == Frame.Hello.Resume(epoch: 8, lastSequence: 0))
    }

    @Test("an inbox restored from a checkpoint takes it as received, processed and saved")
    func restored() {
        var inbox = InboxMachine(checkpoint: DeliveryCheckpoint(epoch: 7, lastSequence: 41))
        #expect(inbox.resumePoint == Frame.Hello.Resume(epoch: 7, lastSequence: 41))
        #expect(inbox.received(self.delivery(41), epoch: 7) == .duplicate)
        #expect(inbox.received(self.delivery(42), epoch: 7) == .accepted)
        #expect(inbox.takeCheckpointToSave() == nil)
    }
}
