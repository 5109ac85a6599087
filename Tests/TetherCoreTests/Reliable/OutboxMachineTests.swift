import NIOCore
import Testing

@testable import TetherCore

@Suite("Outbox machine")
struct OutboxMachineTests {
    static let empty = OutboxSnapshot(epoch: 9, nextID: 1, conversations: [:], records: [], checkpoint: nil)

    func send(_ conversation: String = "c", token: UInt64 = 0, expiresAt: Int64? = nil) -> OutboxMachine.Send {
        OutboxMachine.Send(
            topic: "t",
            conversation: conversation,
            priority: .normal,
            expiresAt: expiresAt,
            body: ByteBuffer(string: "x"),
            token: token
        )
    }

    /// Admits and commits one message per conversation given; returns its records.
    func commit(_ outbox: inout OutboxMachine, _ conversations: String...) -> [OutboxRecord] {
        for (index, conversation) in conversations.enumerated() { _ = outbox.admit(self.send(conversation, token: UInt64(index))) }
        guard let group = outbox.takeGroup() else { return [] }
        outbox.groupCommitted(group)
        #expect(outbox.takeGroup() == nil)
        return group.records
    }

    @Test("group commit: the first sender leads, the others follow; a group is numbered in order, per conversation")
    func groupCommit() {
        var outbox = OutboxMachine(snapshot: Self.empty, capacity: 10)
        #expect(outbox.admit(self.send("a", token: 1)) == .accepted(lead: true))
        #expect(outbox.admit(self.send("b", token: 2)) == .accepted(lead: false))
        #expect(outbox.admit(self.send("a", token: 3)) == .accepted(lead: false))
        let group = outbox.takeGroup()
        #expect(group?.records.map(\.id) == [1, 2, 3])
        #expect(group?.records.map(\.sequence) == [1, 1, 2])
        #expect(group?.tokens == [1, 2, 3])
        #expect(group?.nextID == 4 && group?.conversations == ["a": 2, "b": 1])
        #expect(outbox.admit(self.send("a", token: 4)) == .accepted(lead: false), "a commit is running")
        outbox.groupCommitted(group!)
        let next = outbox.takeGroup()
        #expect(next?.records.map(\.id) == [4] && next?.records.first?.sequence == 3, "numbering continues")
        outbox.groupCommitted(next!)
        #expect(outbox.takeGroup() == nil, "the commit ends")
        #expect(outbox.admit(self.send()) == .accepted(lead: true), "the next sender leads again")
    }

    @Test("a failed commit keeps nothing and leaves no gap: the same numbers are given out again")
    func failedCommit() {
        var outbox = OutboxMachine(snapshot: Self.empty, capacity: 10)
        _ = outbox.admit(self.send("a"))
        let failed = outbox.takeGroup()!
        outbox.groupFailed(failed)
        #expect(outbox.takeGroup() == nil)
        #expect(outbox.records.isEmpty)
        _ = outbox.admit(self.send("a"))
        let retried = outbox.takeGroup()!
        #expect(retried.records.first?.id == 1 && retried.records.first?.sequence == 1)
    }

    @Test("capacity counts what is stored, queued and being committed; an acknowledgement makes room")
    func capacity() {
        var outbox = OutboxMachine(snapshot: Self.empty, capacity: 2)
        _ = outbox.admit(self.send())
        let group = outbox.takeGroup()!
        _ = outbox.admit(self.send())
        #expect(outbox.admit(self.send()) == .full, "one committing, one queued")
        outbox.groupCommitted(group)
        #expect(!outbox.hasRoom)
        _ = outbox.acknowledged([.init(id: 1)])
        #expect(outbox.hasRoom)
    }

    @Test("acknowledgements finish messages once, with their outcome; storage is told to remove them")
    func acknowledgements() {
        var outbox = OutboxMachine(snapshot: Self.empty, capacity: 10)
        _ = self.commit(&outbox, "a", "b")
        #expect(outbox.outcome(of: 1) == .pending)
        let finished = outbox.acknowledged([.init(id: 1), .init(id: 2, status: .permissionDenied), .init(id: 1), .init(id: 99)])
        #expect(finished.map(\.0.id) == [1, 2])
        #expect(finished.map(\.1) == [.acknowledged, .refused(.permissionDenied)])
        #expect(outbox.outcome(of: 1) == .finished(.acknowledged))
        #expect(outbox.outcome(of: 99) == .unknown)
        #expect(outbox.takeStorageWork().remove == [1, 2])
        #expect(outbox.takeStorageWork().remove.isEmpty, "taken once")
    }

    @Test("a message reported sent once, however often it is sent; a new connection gets every unacknowledged one")
    func sentAndResent() {
        var outbox = OutboxMachine(snapshot: Self.empty, capacity: 10)
        _ = self.commit(&outbox, "a", "a", "b")
        #expect(outbox.sent([1, 2]).map(\.id) == [1, 2])
        #expect(outbox.sent([1, 2, 3]).map(\.id) == [3])
        _ = outbox.acknowledged([.init(id: 2)])
        #expect(outbox.unacknowledged.map(\.id) == [1, 3])
    }

    @Test("expiry: one deadline at a time, on the wall clock; a tombstone replaces the message until it is acknowledged")
    func expiry() {
        var outbox = OutboxMachine(snapshot: Self.empty, capacity: 10)
        for (token, expiresAt) in [(0, 5_000), (1, 2_000)] as [(UInt64, Int64)] {
            _ = outbox.admit(self.send(token: token, expiresAt: expiresAt))
        }
        _ = outbox.admit(self.send(token: 2))
        outbox.groupCommitted(outbox.takeGroup()!)
        #expect(outbox.nextExpiry == 2_000)
        #expect(outbox.expire(now: 1_999).isEmpty)
        let tombstones = outbox.expire(now: 2_000)
        #expect(tombstones.map(\.id) == [2] && tombstones[0].expired && tombstones[0].body.readableBytes == 0)
        #expect(outbox.outcome(of: 2) == .finished(.expired))
        #expect(outbox.unfinished.map(\.id) == [1, 3])
        #expect(outbox.unacknowledged.map(\.id) == [1, 2, 3], "the tombstone is still sent")
        #expect(outbox.takeStorageWork().expire == [2])
        #expect(outbox.acknowledged([.init(id: 2, status: .deadlineExceeded)]).isEmpty, "its outcome was told at expiry")
        _ = outbox.acknowledged([.init(id: 1)])
        #expect(outbox.nextExpiry == nil, "an acknowledged message does not expire")
    }

    @Test("restored from storage: numbering, records and expiries carry on; outcomes beyond the memory are forgotten")
    func restored() {
        let expired = OutboxRecord(
            id: 7,
            topic: "t",
            conversation: "c",
            sequence: 3,
            priority: .low,
            expiresAt: 10,
            expired: true,
            body: ByteBuffer()
        )
        let live = OutboxRecord(id: 8, topic: "t", conversation: "c", sequence: 4, priority: .low, expiresAt: 9_999, body: ByteBuffer())
        var outbox = OutboxMachine(
            snapshot: OutboxSnapshot(epoch: 9, nextID: 9, conversations: ["c": 4], records: [expired, live], checkpoint: nil),
            capacity: 10,
            rememberedOutcomes: 1
        )
        #expect(outbox.epoch == 9)
        #expect(outbox.outcome(of: 7) == .finished(.expired))
        #expect(outbox.nextExpiry == 9_999)
        let records = self.commit(&outbox, "c", "d")
        #expect(records.map(\.id) == [9, 10] && records.map(\.sequence) == [5, 1])
        _ = outbox.acknowledged([.init(id: 9), .init(id: 10)])
        #expect(outbox.outcome(of: 9) == .unknown && outbox.outcome(of: 10) == .finished(.acknowledged), "one outcome remembered")
    }
}
